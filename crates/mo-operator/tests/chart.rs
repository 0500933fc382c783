//! The Helm chart, checked by Helm and by the API server: it lints, renders with default and
//! non-default values, the rendered objects pass a server-side dry run, every metric its
//! dashboard and alerts use is one the operator exports, and every alert has a runbook.
//! (An end-to-end test installs the operator from this chart: see e2e.rs.)

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR")))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn helm(args: &[&str]) -> String {
    let helm = mo_testenv::helm().expect("helm");
    let out = Command::new(helm).args(args).output().expect("helm runs");
    assert!(
        out.status.success(),
        "helm {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn chart() -> String {
    repo("charts/mo-operator").display().to_string()
}

/// Every optional part switched on, and scheduling and identity values set.
const EVERYTHING: &[&str] = &[
    "--values",
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../charts/mo-operator/ci/everything-values.yaml"
    ),
];

fn render(namespace: &str, values: &[&str]) -> Vec<serde_json::Value> {
    let chart = chart();
    let mut args = vec!["template", "mo", &chart];
    args.extend(["--namespace", namespace, "--include-crds"]);
    args.extend(values);
    let text = helm(&args);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("rendered YAML"))
        .filter(|v: &serde_json::Value| !v.is_null())
        .collect()
}

fn kinds(objects: &[serde_json::Value]) -> BTreeSet<String> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().expect("kind").to_string())
        .collect()
}

fn find<'a>(objects: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn the_chart_lints_and_renders_with_default_and_non_default_values() {
    helm(&["lint", "--strict", &chart()]);
    let mut lint_everything = vec!["lint", "--strict"];
    let chart = chart();
    lint_everything.push(&chart);
    lint_everything.extend(EVERYTHING);
    helm(&lint_everything);

    let defaults = render("mo-system", &[]);
    let expected: BTreeSet<String> = [
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        kinds(&defaults),
        expected,
        "optional parts are off by default; the NetworkPolicy is on"
    );
    // The HTTP port takes CN pods (their preStop hook) and Prometheus; the webhook port the
    // API server, which no pod selector names.
    let policy = find(&defaults, "NetworkPolicy");
    let http = &policy["spec"]["ingress"][1];
    assert_eq!(http["ports"][0]["port"], 8080);
    assert_eq!(
        http["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
        "cn"
    );
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], 9443);
    let deployment = find(&defaults, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    // The replicas prefer different nodes, and a budget keeps one answering the webhooks.
    assert_eq!(
        deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            [0]["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(
        find(&defaults, "PodDisruptionBudget")["spec"]["maxUnavailable"],
        1
    );
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(!args.contains("--watch-namespace"), "{args}");
    assert!(!args.contains("--hakeeper-discovery-address"), "{args}");

    let all = render("mo-system", EVERYTHING);
    let kinds = kinds(&all);
    for kind in ["ServiceMonitor", "PrometheusRule", "ConfigMap"] {
        assert!(kinds.contains(kind), "{kind} rendered when enabled");
    }
    let pod = &find(&all, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(find(&all, "Deployment")["spec"]["replicas"], 3);
    assert_eq!(pod["nodeSelector"]["pool"], "system");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert_eq!(pod["imagePullSecrets"][0]["name"], "registry");
    assert_eq!(
        find(&all, "Deployment")["spec"]["template"]["metadata"]["annotations"]["team"],
        "db"
    );
    let args = pod["containers"][0]["args"].to_string();
    assert!(args.contains("--watch-namespace=prod"), "{args}");
    assert!(
        args.contains("--allow-host-path-under=/var/lib/matrixone"),
        "{args}"
    );
    assert_eq!(
        find(&all, "NetworkPolicy")["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"],
        "10.0.0.0/24"
    );
    assert!(
        args.contains("--hakeeper-discovery-address={cluster}-log-discovery.{namespace}.svc:32001"),
        "{args}"
    );
    // The ServiceMonitor finds the metrics Service only, and keeps the clusters' own
    // `namespace` label.
    let monitor = find(&all, "ServiceMonitor");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(monitor["spec"]["endpoints"][0]["honorLabels"], true);
    let selector = &monitor["spec"]["selector"]["matchLabels"];
    let services: Vec<&serde_json::Value> = all
        .iter()
        .filter(|o| o["kind"] == "Service")
        .filter(|s| {
            selector
                .as_object()
                .expect("labels")
                .iter()
                .all(|(k, v)| s["metadata"]["labels"][k] == *v)
        })
        .collect();
    assert_eq!(services.len(), 1, "one Service scraped");
    assert_eq!(services[0]["spec"]["ports"][0]["name"], "http");
    // The dashboard ConfigMap carries the chart's dashboard file as is.
    let dashboard = find(&all, "ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["data"]["mo-operator.json"]
            .as_str()
            .expect("json"),
        read("charts/mo-operator/dashboards/mo-operator.json").trim_end()
    );
}

/// The names the operator exports, as Prometheus stores them (`_total` of counters,
/// `_bucket`, `_sum`, `_count` of histograms).
fn exported_series() -> BTreeSet<String> {
    use mo_kube::metrics::{ActionLabels, ClusterLabels, DrainLabels, Metrics};
    // A family shows in the exposition once it has a child: one of each.
    let m = Metrics::new();
    let cluster = ClusterLabels {
        namespace: "ns".into(),
        cluster: "mo".into(),
    };
    m.observe_reconcile(std::time::Duration::from_millis(1), true);
    m.observe_review("eviction", "cn", false, std::time::Duration::from_millis(1));
    m.actions
        .get_or_create(&ActionLabels {
            action: "RestartPod".into(),
            result: "ok".into(),
        })
        .inc();
    for family in [
        &m.rollout_phase,
        &m.rollout_halted,
        &m.creation_slow,
        &m.holds,
        &m.drains_alarmed,
    ] {
        family.get_or_create(&cluster).set(0);
    }
    m.kernel_unreachable.get_or_create(&cluster).inc();
    m.drains
        .get_or_create(&DrainLabels {
            namespace: "ns".into(),
            cluster: "mo".into(),
            stage: "HandOver".into(),
        })
        .set(0);
    let text = m.encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').expect("TYPE line");
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

fn used_series(text: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("mo_operator_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        used.insert(name);
    }
    used
}

#[test]
fn every_metric_a_panel_or_an_alert_uses_is_exported() {
    let exported = exported_series();
    assert!(
        exported.contains("mo_operator_reconcile_duration_seconds_bucket"),
        "{exported:?}"
    );
    let all = render("mo-system", EVERYTHING);
    let rules = find(&all, "PrometheusRule").to_string();
    let dashboard = read("charts/mo-operator/dashboards/mo-operator.json");
    for (what, text) in [("alerts", &rules), ("dashboard", &dashboard)] {
        let used = used_series(text);
        assert!(
            used.len() >= 5,
            "{what} uses the operator's metrics: {used:?}"
        );
        let missing: Vec<&String> = used.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{what} uses metrics the operator does not export: {missing:?}"
        );
    }
    // The dashboard is valid JSON with a datasource variable and panels.
    let json: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard JSON");
    assert!(json["panels"].as_array().expect("panels").len() >= 10);
    assert!(
        json["templating"]["list"]
            .as_array()
            .expect("variables")
            .iter()
            .any(|v| v["type"] == "datasource")
    );
}

#[test]
fn every_alert_has_a_runbook_section() {
    let all = render("mo-system", EVERYTHING);
    let rules = find(&all, "PrometheusRule");
    let guide = read("docs/day-2.md");
    let anchors: BTreeSet<String> = guide
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| {
            h.chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == ' ')
                .collect::<String>()
                .to_lowercase()
                .replace(' ', "-")
        })
        .collect();
    let mut alerts = 0;
    for group in rules["spec"]["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let alert = rule["alert"].as_str().expect("alert");
            alerts += 1;
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{alert}: runbook_url"));
            let anchor = url.rsplit_once('#').expect("an anchor").1;
            assert_eq!(anchor, alert.to_lowercase(), "{alert}");
            assert!(
                anchors.contains(anchor),
                "{alert}: docs/day-2.md has no `### {alert}` section"
            );
            assert!(rule["labels"]["severity"].is_string(), "{alert}: severity");
        }
    }
    assert!(alerts >= 5, "{alerts} alerts");
}

/// Stand-ins for the Prometheus Operator's CRDs (schema-less): the API server then knows the
/// kinds, so the dry run checks everything but their schemas.
const MONITORING_CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: servicemonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  names: {kind: ServiceMonitor, plural: servicemonitors, singular: servicemonitor}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: prometheusrules.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  names: {kind: PrometheusRule, plural: prometheusrules, singular: prometheusrule}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

#[test]
fn the_rendered_objects_pass_a_server_side_dry_run() {
    let plane = mo_testenv::shared().expect("test control plane");
    let kubectl = |args: &[&str], input: Option<&str>| {
        use std::io::Write;
        let mut child = Command::new(plane.kubectl())
            .args(args)
            .env("KUBECONFIG", plane.kubeconfig())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.unwrap_or("").as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("kubectl ends");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, text) = kubectl(
        &["apply", "--server-side", "-f", "-"],
        Some(MONITORING_CRDS),
    );
    assert!(ok, "{text}");
    for crd in ["servicemonitors", "prometheusrules"] {
        let (ok, text) = kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                &format!("crd/{crd}.monitoring.coreos.com"),
            ],
            None,
        );
        assert!(ok, "{text}");
    }
    let namespace = "chart-dry-run";
    let (ok, text) = kubectl(&["create", "namespace", namespace], None);
    assert!(ok || text.contains("AlreadyExists"), "{text}");
    for values in [&[][..], EVERYTHING] {
        let mut args = vec!["template", "mo-dry-run"];
        let chart = chart();
        args.push(&chart);
        args.extend(["--namespace", namespace, "--include-crds"]);
        args.extend(values);
        let rendered = helm(&args);
        // Kinds the API server has not seen yet appear in the same apply as their CRD, which a
        // dry run cannot establish: the CRDs above are installed for real.
        let (ok, text) = kubectl(
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                "--field-manager=helm-dry-run",
                "-f",
                "-",
            ],
            Some(&rendered),
        );
        assert!(ok, "dry run refused: {text}");
        for kind in [
            "deployment.apps/mo-dry-run",
            "clusterrole.rbac.authorization.k8s.io/mo-dry-run",
        ] {
            assert!(text.contains(kind), "{kind} in: {text}");
        }
        if values == EVERYTHING {
            assert!(
                text.contains("prometheusrule.monitoring.coreos.com/mo-dry-run"),
                "{text}"
            );
        }
    }
}
