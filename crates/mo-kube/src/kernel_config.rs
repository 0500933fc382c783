//! The kernel's own configuration, rendered per role from the cluster's spec.
//!
//! Each MatrixOne process is `mo-service -cfg <file>` with one TOML file (the kernel's
//! `cmd/mo-service`; `docs/real-kernel.md` says where each rule comes from). The operator
//! renders one file per role (one per CN group) into the cluster's ConfigMap; the values that
//! differ per pod (its UUID and its IP) are placeholders that the pod's start script fills in
//! from its identity before it `exec`s the kernel. Every address the kernel listens on is the
//! pod's own IP: nothing binds `0.0.0.0` (the kernel's `port-base` would), so pods that share a
//! network (a single test machine) cannot collide and the addresses HAKeeper records are the
//! ones the operator dials.

use crate::crd::{LogBootstrap, MatrixOneCluster, SharedStorage};
use mo_core::Component;
use toml::{Table, Value};

/// Where the ConfigMap is mounted in every MatrixOne container.
pub const CONFIG_DIR: &str = "/etc/matrixone/config";
/// The pod's own data: a PersistentVolumeClaim for LOG and TN, an emptyDir for CN and proxy.
pub const DATA_DIR: &str = "/var/lib/matrixone";
/// Where a `fileSystem` shared storage is mounted (the same directory in every pod).
pub const SHARED_DIR: &str = "/var/lib/matrixone-shared";
/// The kernel binary in the official image.
pub const KERNEL_BINARY: &str = "/mo-service";
/// The start script's name in the ConfigMap.
pub const START_SCRIPT: &str = "start.sh";

/// Filled in by the start script: the pod's IP (downward API `status.podIP`).
pub const POD_IP: &str = "@@POD_IP@@";
/// Filled in by the start script: the store UUID ([`mo_core::component::store_uuid`]).
pub const UUID: &str = "@@UUID@@";

/// Ports of each role (the kernel's defaults where it has them).
pub mod port {
    pub const LOG_RAFT: i32 = 32000;
    pub const LOG_SERVICE: i32 = 32001;
    pub const LOG_GOSSIP: i32 = 32002;
    pub const TN_TXN: i32 = 22000;
    pub const TN_LOGTAIL: i32 = 22001;
    pub const TN_LOCK: i32 = 22002;
    pub const CN_SQL: i32 = 6001;
    pub const CN_PIPELINE: i32 = 6002;
    pub const CN_LOCK: i32 = 6003;
    pub const CN_QUERY: i32 = 19998;
    pub const PROXY_SQL: i32 = 6001;
}

/// Named ports of a role's container (and of its headless Service).
pub fn ports(component: Component) -> Vec<(&'static str, i32)> {
    use port::*;
    match component {
        Component::Log => vec![
            ("raft", LOG_RAFT),
            ("logservice", LOG_SERVICE),
            ("gossip", LOG_GOSSIP),
        ],
        Component::Tn => vec![("txn", TN_TXN), ("logtail", TN_LOGTAIL), ("lock", TN_LOCK)],
        Component::Cn => vec![
            ("sql", CN_SQL),
            ("pipeline", CN_PIPELINE),
            ("lock", CN_LOCK),
            ("query", CN_QUERY),
        ],
        Component::Proxy => vec![("sql", PROXY_SQL)],
    }
}

/// The port a role's readiness is judged on: it opens once the kernel serves that role.
pub fn readiness_port(component: Component) -> i32 {
    use port::*;
    match component {
        Component::Log => LOG_SERVICE,
        Component::Tn => TN_TXN,
        Component::Cn => CN_SQL,
        Component::Proxy => PROXY_SQL,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A user's TOML override does not parse; `field` names it in the spec.
    #[error("{field}: not valid TOML: {message}")]
    Override { field: String, message: String },
}

/// The LOG stores' DNS names (`<pod>.<headless service>.<namespace>.svc`): stable across
/// restarts, unlike pod IPs, so they are how pods find the LOG service and one another.
pub fn log_store_hosts(cluster: &MatrixOneCluster) -> Vec<String> {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let ns = cluster.metadata.namespace.clone().unwrap_or_default();
    let service = crate::resources::headless_service_name(&name, Component::Log);
    (0..cluster.spec.log.replicas)
        .map(|i| format!("{name}-log-{i}.{service}.{ns}.svc"))
        .collect()
}

fn strings<I: IntoIterator<Item = String>>(items: I) -> Value {
    Value::Array(items.into_iter().map(Value::String).collect())
}

fn table(entries: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    Value::Table(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

fn s(text: impl Into<String>) -> Value {
    Value::String(text.into())
}

fn at(port: i32) -> Value {
    s(format!("{POD_IP}:{port}"))
}

/// The file services every role has: LOCAL on the pod's own volume, SHARED and ETL on the
/// cluster's shared storage.
fn file_services(cluster: &MatrixOneCluster) -> Value {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let ns = cluster.metadata.namespace.clone().unwrap_or_default();
    let local = table([
        ("name", s("LOCAL")),
        ("backend", s("DISK")),
        ("data-dir", s(format!("{DATA_DIR}/local"))),
    ]);
    let shared = |service: &'static str, dir: &str| match &cluster.spec.shared_storage {
        SharedStorage {
            s3: Some(s3),
            file_system: _,
        } => {
            let prefix = s3.prefix.clone().unwrap_or_else(|| format!("{ns}/{name}"));
            let mut s3_table = vec![
                ("endpoint", s(s3.endpoint.clone())),
                ("bucket", s(s3.bucket.clone())),
                (
                    "key-prefix",
                    s(format!("{}/{dir}", prefix.trim_end_matches('/'))),
                ),
            ];
            if let Some(region) = &s3.region {
                s3_table.push(("region", s(region.clone())));
            }
            table([
                ("name", s(service)),
                ("backend", s("S3")),
                ("s3", table(s3_table)),
            ])
        }
        SharedStorage {
            s3: None,
            file_system: _,
        } => table([
            ("name", s(service)),
            (
                "backend",
                s(if service == "ETL" { "DISK-ETL" } else { "DISK" }),
            ),
            ("data-dir", s(format!("{SHARED_DIR}/{dir}"))),
        ]),
    };
    Value::Array(vec![
        local,
        shared("SHARED", "shared"),
        shared("ETL", "etl"),
    ])
}

/// The configuration of `component` (of CN group `group`), with the role's override merged
/// in. `bootstrap`: the recorded LOG bootstrap, rendered into LOG files until it is done.
pub fn render(
    cluster: &MatrixOneCluster,
    component: Component,
    group: Option<&str>,
    bootstrap: Option<&LogBootstrap>,
) -> Result<String, ConfigError> {
    let root = render_table(cluster, component, group, bootstrap)?;
    Ok(toml::to_string(&root).expect("a TOML table always serializes"))
}

/// [`render`] before it is written out.
fn render_table(
    cluster: &MatrixOneCluster,
    component: Component,
    group: Option<&str>,
    bootstrap: Option<&LogBootstrap>,
) -> Result<Table, ConfigError> {
    use port::*;
    let hakeeper = strings(
        log_store_hosts(cluster)
            .into_iter()
            .map(|h| format!("{h}:{LOG_SERVICE}")),
    );
    let service_type = match component {
        Component::Log => "LOG",
        Component::Tn => "TN",
        Component::Cn => "CN",
        Component::Proxy => "PROXY",
    };
    let mut root = Table::new();
    root.insert("service-type".into(), s(service_type));
    root.insert("data-dir".into(), s(format!("{DATA_DIR}/data")));
    root.insert(
        "log".into(),
        table([("level", s("info")), ("format", s("json"))]),
    );
    root.insert(
        "hakeeper-client".into(),
        table([("service-addresses", hakeeper)]),
    );
    root.insert("fileservice".into(), file_services(cluster));
    match component {
        Component::Log => {
            let gossip_seeds = strings(
                log_store_hosts(cluster)
                    .into_iter()
                    .map(|h| format!("{h}:{LOG_GOSSIP}")),
            );
            let mut logservice = vec![
                ("uuid", s(UUID)),
                ("data-dir", s(format!("{DATA_DIR}/data/logservice"))),
                ("raft-address", at(LOG_RAFT)),
                ("raft-listen-address", at(LOG_RAFT)),
                ("logservice-address", at(LOG_SERVICE)),
                ("logservice-listen-address", at(LOG_SERVICE)),
                ("gossip-address", at(LOG_GOSSIP)),
                ("gossip-listen-address", at(LOG_GOSSIP)),
                ("gossip-seed-addresses", gossip_seeds),
            ];
            if let Some(b) = bootstrap.filter(|b| !b.done) {
                logservice.push((
                    "BootstrapConfig",
                    table([
                        ("bootstrap-cluster", Value::Boolean(true)),
                        ("num-of-log-shards", Value::Integer(i64::from(b.shards))),
                        ("num-of-tn-shards", Value::Integer(i64::from(b.shards))),
                        (
                            "num-of-log-shard-replicas",
                            Value::Integer(i64::from(b.replicas)),
                        ),
                        ("init-hakeeper-members", strings(b.members.clone())),
                    ]),
                ));
            }
            root.insert("logservice".into(), table(logservice));
        }
        Component::Tn => {
            root.insert(
                "tn".into(),
                table([
                    ("uuid", s(UUID)),
                    ("listen-address", at(TN_TXN)),
                    ("service-address", at(TN_TXN)),
                    (
                        "LogtailServer",
                        table([
                            ("listen-address", at(TN_LOGTAIL)),
                            ("service-address", at(TN_LOGTAIL)),
                        ]),
                    ),
                    (
                        "lockservice",
                        table([
                            ("listen-address", at(TN_LOCK)),
                            ("service-address", at(TN_LOCK)),
                        ]),
                    ),
                ]),
            );
        }
        Component::Cn => {
            root.insert(
                "cn".into(),
                table([
                    ("uuid", s(UUID)),
                    // A CN registers Draining and the operator puts it into service: a record
                    // HAKeeper lost and re-created (a CN cut off from it past its expiry) never
                    // brings a CN back to the proxies on its own, least of all one told to
                    // restart, which refuses every new write.
                    ("init-work-state", s("draining")),
                    ("listen-address", at(CN_PIPELINE)),
                    ("service-address", at(CN_PIPELINE)),
                    ("sql-address", at(CN_SQL)),
                    (
                        "frontend",
                        table([
                            ("host", s(POD_IP)),
                            ("port", Value::Integer(i64::from(CN_SQL))),
                            ("unix-socket", s(format!("{DATA_DIR}/mysql.sock"))),
                            (
                                "proxy-enabled",
                                Value::Boolean(cluster.spec.proxy.replicas > 0),
                            ),
                        ]),
                    ),
                    (
                        "lockservice",
                        table([
                            ("listen-address", at(CN_LOCK)),
                            ("service-address", at(CN_LOCK)),
                        ]),
                    ),
                    (
                        "query-service",
                        table([(
                            "address",
                            table([
                                ("listen-address", at(CN_QUERY)),
                                ("service-address", at(CN_QUERY)),
                            ]),
                        )]),
                    ),
                ]),
            );
        }
        Component::Proxy => {
            root.insert(
                "proxy".into(),
                table([("uuid", s(UUID)), ("listen-address", at(PROXY_SQL))]),
            );
        }
    }
    let (override_text, field) = match component {
        Component::Log => (
            cluster.spec.log.pods.config.as_deref(),
            "spec.log.config".to_string(),
        ),
        Component::Tn => (
            cluster.spec.tn.pods.config.as_deref(),
            "spec.tn.config".to_string(),
        ),
        Component::Proxy => (
            cluster.spec.proxy.pods.config.as_deref(),
            "spec.proxy.config".to_string(),
        ),
        Component::Cn => {
            let g = cluster
                .spec
                .cn
                .groups
                .iter()
                .find(|g| Some(g.name.as_str()) == group);
            (
                g.and_then(|g| g.pods.config.as_deref()),
                format!("spec.cn.groups[{}].config", group.unwrap_or_default()),
            )
        }
    };
    if let Some(text) = override_text {
        let overrides: Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Override {
                    field,
                    message: e.message().to_string(),
                })?;
        merge(&mut root, overrides);
    }
    Ok(root)
}

/// `overrides` over `base`: tables merge key by key, anything else is replaced.
fn merge(base: &mut Table, overrides: Table) {
    for (key, value) in overrides {
        match (base.get_mut(&key), value) {
            (Some(Value::Table(b)), Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// How often each role heartbeats to HAKeeper as rendered (overrides included), so that
/// what counts as a fresh reading follows the kernel's configuration. The kernel's keys and
/// defaults (v1.2.4): `[logservice] logservice-heartbeat-interval` 1 s
/// (`pkg/logservice/config.go`), `[tn.hakeeper]` and `[cn.hakeeper]`
/// `hakeeper-heartbeat-interval` 1 s (`pkg/tnservice/cfg.go`, `pkg/cnservice/types.go`),
/// `[proxy.hakeeper] hakeeper-heartbeat-interval` 3 s (`pkg/proxy/config.go`). Of several CN
/// groups the slowest counts; a file that does not render keeps the kernel's default.
pub fn heartbeat_intervals(cluster: &MatrixOneCluster) -> mo_core::HeartbeatIntervals {
    let defaults = mo_core::HeartbeatIntervals::default();
    let configured = |component: Component, group: Option<&str>, path: &[&str]| {
        let root = render_table(cluster, component, group, None).ok()?;
        let (last, tables) = path.split_last()?;
        let mut table = &root;
        for key in tables {
            table = table.get(*key)?.as_table()?;
        }
        go_duration(table.get(*last)?.as_str()?)
    };
    let cn = cluster
        .spec
        .cn
        .groups
        .iter()
        .map(|g| {
            configured(
                Component::Cn,
                Some(&g.name),
                &["cn", "hakeeper", "hakeeper-heartbeat-interval"],
            )
            .unwrap_or(defaults.cn)
        })
        .max()
        .unwrap_or(defaults.cn);
    mo_core::HeartbeatIntervals {
        log: configured(
            Component::Log,
            None,
            &["logservice", "logservice-heartbeat-interval"],
        )
        .unwrap_or(defaults.log),
        tn: configured(
            Component::Tn,
            None,
            &["tn", "hakeeper", "hakeeper-heartbeat-interval"],
        )
        .unwrap_or(defaults.tn),
        cn,
        proxy: configured(
            Component::Proxy,
            None,
            &["proxy", "hakeeper", "hakeeper-heartbeat-interval"],
        )
        .unwrap_or(defaults.proxy),
    }
}

/// A Go `time.Duration` string (`1s`, `500ms`, `1m30s`, `1.5s`) as the kernel's
/// `toml.Duration` reads it; `None` for anything else, or for zero (the kernel then takes its
/// default).
fn go_duration(text: &str) -> Option<mo_core::Millis> {
    let mut rest = text.trim();
    let mut nanos = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        nanos += number * scale;
        rest = &rest[unit_end..];
    }
    let millis = (nanos / 1e6).round() as u64;
    (millis > 0).then_some(mo_core::Millis(millis))
}

/// The ConfigMap key of a role's file (`cn-<group>.toml` for a CN group).
pub fn config_key(component: Component, group: Option<&str>) -> String {
    match (component, group) {
        (Component::Cn, Some(g)) => format!("cn-{g}.toml"),
        (c, _) => format!("{}.toml", c.as_str()),
    }
}

/// The start script every MatrixOne container runs: it fills the pod's UUID and IP into its
/// role's file and `exec`s the kernel (which then receives SIGTERM itself). `MO_CONFIG` names
/// the file; `MO_UUID` is the UUID (CN pods) or, unset, `MO_UUID_DIGIT` and the pod's ordinal
/// give it (StatefulSet pods, see [`mo_core::component::store_uuid`]).
pub fn start_script() -> String {
    format!(
        r#"#!/bin/sh
# Rendered by mo-operator: fills this pod's identity into its configuration, then runs the kernel.
set -eu
: "${{POD_NAME:?}}" "${{POD_IP:?}}" "${{MO_CONFIG:?}}"
uuid="${{MO_UUID:-}}"
if [ -z "$uuid" ]; then
  ordinal="${{POD_NAME##*-}}"
  uuid=$(printf '00000000-0000-0000-0000-%s%011x' "${{MO_UUID_DIGIT:?}}" "$ordinal")
fi
mkdir -p {data}/data {data}/local
sed -e "s|{ip}|$POD_IP|g" -e "s|{uuid_marker}|$uuid|g" "{config}/$MO_CONFIG" > {data}/mo-service.toml
exec {binary} -cfg {data}/mo-service.toml
"#,
        data = DATA_DIR,
        ip = POD_IP,
        uuid_marker = UUID,
        config = CONFIG_DIR,
        binary = KERNEL_BINARY,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::MatrixOneClusterSpec;

    fn cluster(extra: serde_json::Value) -> MatrixOneCluster {
        let mut spec = serde_json::json!({
            "version": "v1.2.4",
            "log": {"replicas": 3},
            "cn": {"groups": [{"name": "tp", "replicas": 2}]},
            "sharedStorage": {"fileSystem": {"path": "/srv/mo"}},
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                s.insert(k.clone(), v.clone());
            }
        }
        let spec: MatrixOneClusterSpec = serde_json::from_value(spec).expect("valid spec");
        let mut c = MatrixOneCluster::new("mo", spec);
        c.metadata.namespace = Some("db".into());
        c
    }

    fn parsed(text: &str) -> Table {
        text.parse().expect("rendered TOML parses")
    }

    #[test]
    fn every_listener_is_the_pod_ip_and_every_peer_a_stable_name() {
        let c = cluster(serde_json::json!({}));
        for (component, group) in [
            (Component::Log, None),
            (Component::Tn, None),
            (Component::Cn, Some("tp")),
            (Component::Proxy, None),
        ] {
            let text = render(&c, component, group, None).expect("renders");
            assert!(!text.contains("0.0.0.0"), "{component}: {text}");
            assert!(!text.contains("port-base"), "{component}: {text}");
            let t = parsed(&text);
            assert_eq!(
                t["hakeeper-client"]["service-addresses"][0].as_str(),
                Some("mo-log-0.mo-log-headless.db.svc:32001"),
                "{component}"
            );
        }
        let log = parsed(&render(&c, Component::Log, None, None).expect("renders"));
        assert_eq!(log["logservice"]["uuid"].as_str(), Some(UUID));
        assert_eq!(
            log["logservice"]["raft-address"].as_str(),
            Some("@@POD_IP@@:32000")
        );
        assert_eq!(
            log["logservice"]["gossip-seed-addresses"]
                .as_array()
                .map(Vec::len),
            Some(3)
        );
    }

    #[test]
    fn the_bootstrap_is_rendered_only_until_it_is_done() {
        let c = cluster(serde_json::json!({}));
        let mut b = LogBootstrap {
            members: vec!["131072:a".into(), "131073:b".into(), "131074:c".into()],
            replicas: 3,
            shards: 1,
            done: false,
        };
        let log = parsed(&render(&c, Component::Log, None, Some(&b)).expect("renders"));
        let config = &log["logservice"]["BootstrapConfig"];
        assert_eq!(config["bootstrap-cluster"].as_bool(), Some(true));
        assert_eq!(
            config["init-hakeeper-members"].as_array().map(Vec::len),
            Some(3)
        );
        b.done = true;
        let log = parsed(&render(&c, Component::Log, None, Some(&b)).expect("renders"));
        assert!(log["logservice"].get("BootstrapConfig").is_none());
    }

    #[test]
    fn s3_and_file_system_storage_render_the_kernels_file_services() {
        let fs = parsed(
            &render(&cluster(serde_json::json!({})), Component::Tn, None, None).expect("renders"),
        );
        let services = fs["fileservice"].as_array().expect("array");
        assert_eq!(services[1]["backend"].as_str(), Some("DISK"));
        assert_eq!(
            services[1]["data-dir"].as_str(),
            Some("/var/lib/matrixone-shared/shared")
        );
        assert_eq!(services[2]["backend"].as_str(), Some("DISK-ETL"));
        let s3 = cluster(serde_json::json!({"sharedStorage": {"s3": {
            "endpoint": "http://minio:9000", "bucket": "mo-data", "region": "eu-west-1"}}}));
        let t = parsed(&render(&s3, Component::Cn, Some("tp"), None).expect("renders"));
        let shared = &t["fileservice"].as_array().expect("array")[1];
        assert_eq!(shared["backend"].as_str(), Some("S3"));
        assert_eq!(shared["s3"]["bucket"].as_str(), Some("mo-data"));
        assert_eq!(shared["s3"]["key-prefix"].as_str(), Some("db/mo/shared"));
        assert_eq!(shared["s3"]["region"].as_str(), Some("eu-west-1"));
    }

    #[test]
    fn freshness_follows_the_heartbeat_intervals_the_kernel_is_configured_with() {
        let defaults = heartbeat_intervals(&cluster(serde_json::json!({})));
        assert_eq!(defaults, mo_core::HeartbeatIntervals::default());
        assert_eq!(
            defaults.proxy,
            mo_core::Millis::from_secs(3),
            "v1.2.4's proxy default"
        );
        let c = cluster(serde_json::json!({
            "cn": {"groups": [
                {"name": "tp", "replicas": 1,
                 "config": "[cn.hakeeper]\nhakeeper-heartbeat-interval = \"2s\"\n"},
                {"name": "ap", "replicas": 1,
                 "config": "[cn.hakeeper]\nhakeeper-heartbeat-interval = \"2.5s\"\n"}]},
            "tn": {"config": "[tn.hakeeper]\nhakeeper-heartbeat-interval = \"1m30s\"\n"},
            "proxy": {"replicas": 1,
                      "config": "[proxy.hakeeper]\nhakeeper-heartbeat-interval = \"500ms\"\n"},
            "log": {"replicas": 3,
                    "config": "[logservice]\nlogservice-heartbeat-interval = \"0s\"\n"},
        }));
        let i = heartbeat_intervals(&c);
        assert_eq!(i.cn, mo_core::Millis(2_500), "the slowest CN group counts");
        assert_eq!(i.tn, mo_core::Millis(90_000));
        assert_eq!(i.proxy, mo_core::Millis(500));
        assert_eq!(i.log, defaults.log, "zero: the kernel takes its default");
        assert_eq!(i.cn_fresh(), mo_core::Millis(7_500));
        assert_eq!(go_duration("1h2m3.5s"), Some(mo_core::Millis(3_723_500)));
        assert_eq!(go_duration("3 s"), None);
        assert_eq!(go_duration("3"), None);
    }

    #[test]
    fn an_override_wins_key_by_key_and_a_bad_one_names_its_field() {
        let c = cluster(
            serde_json::json!({"cn": {"groups": [{"name": "tp", "replicas": 1,
            "config": "[cn.frontend]\nport = 7001\n[cn.txn]\nmode = \"optimistic\"\n"}]}}),
        );
        let t = parsed(&render(&c, Component::Cn, Some("tp"), None).expect("renders"));
        assert_eq!(t["cn"]["frontend"]["port"].as_integer(), Some(7001));
        assert_eq!(
            t["cn"]["frontend"]["host"].as_str(),
            Some(POD_IP),
            "the rest stays"
        );
        assert_eq!(t["cn"]["txn"]["mode"].as_str(), Some("optimistic"));
        let bad = cluster(
            serde_json::json!({"cn": {"groups": [{"name": "tp", "replicas": 1,
            "config": "[cn\n"}]}}),
        );
        let err = render(&bad, Component::Cn, Some("tp"), None).expect_err("refused");
        assert!(
            err.to_string().starts_with("spec.cn.groups[tp].config:"),
            "{err}"
        );
    }

    /// The start script computes the same UUID as the operator's adapter looks stores up by.
    #[test]
    fn the_start_script_fills_in_the_uuid_the_adapter_expects() {
        let dir = std::env::temp_dir().join(format!("mo-start-{}", std::process::id()));
        let config = dir.join("config");
        std::fs::create_dir_all(&config).expect("dir");
        std::fs::write(
            config.join("log.toml"),
            format!("uuid = \"{UUID}\"\nip = \"{POD_IP}\"\n"),
        )
        .expect("write");
        let script = start_script()
            .replace(DATA_DIR, dir.to_str().expect("utf-8"))
            .replace(CONFIG_DIR, config.to_str().expect("utf-8"))
            .replace(&format!("exec {KERNEL_BINARY} -cfg"), "exec cat");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .env("POD_NAME", "mo-log-12")
            .env("POD_IP", "10.1.2.3")
            .env("MO_CONFIG", "log.toml")
            .env("MO_UUID_DIGIT", "0")
            .output()
            .expect("sh runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered = String::from_utf8_lossy(&out.stdout);
        let expected = mo_core::component::store_uuid(Component::Log, "mo-log-12").expect("uuid");
        assert!(
            rendered.contains(&format!("uuid = \"{expected}\"")),
            "{rendered}"
        );
        assert!(rendered.contains("ip = \"10.1.2.3\""), "{rendered}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
