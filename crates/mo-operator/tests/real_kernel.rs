//! The real kernel is the judge: MatrixOne's own `mo-service` (v1.2.3 and v1.2.4 from the Go
//! module proxy, built by `tools/matrixone/build.sh`) runs behind every pod the operator
//! creates, with the configuration the operator rendered, on the test control plane. The data
//! plane (`mo-operator kubelet --runtime process`) plays kubelet: volumes, environment,
//! probes, preStop hooks, graceful termination, restarts. A real SQL workload
//! (`mo-sqlload`) says what happened to every transaction.
//!
//! One real cluster at a time (2 cores): each test holds [`one_at_a_time`].

mod support;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use mo_core::Component;
use mo_core::component::{cn_uuid, store_uuid};
use mo_rpc::{Discovery, HaKeeperClient, Options};
use mo_sqlload::Target;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::*;

/// Booting a real cluster on a loaded 2-core machine takes a minute or two; this only bounds
/// a test that would otherwise hang.
const READY_LIMIT: Duration = Duration::from_secs(900);

/// Held for a whole test (a panicking test releases it: tokio's mutex does not poison).
async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

fn real_cluster(t: &TestNs, version: &str) -> serde_json::Value {
    // One directory per run: a cluster booted on another run's shared storage replays that
    // cluster's catalog and lock binds (its CNs answer "there is no tenant sys").
    let shared = real_plane_dir().join(format!("shared-{}-{}", t.ns, std::process::id()));
    serde_json::json!({
        "version": version,
        "log": {"replicas": 3},
        "cn": {"groups": [{"name": "tp", "replicas": 1}, {"name": "ap", "replicas": 1}]},
        "proxy": {"replicas": 1},
        "sharedStorage": {"fileSystem": {"path": shared.display().to_string()}},
        "upgrade": {"stabilityWindow": "10s", "stallTimeout": "10m"},
        "drain": {"alarmAfter": "10m"},
    })
}

async fn pod_ip(t: &TestNs, pod: &str) -> String {
    t.pod(pod)
        .await
        .and_then(|p| p.status?.pod_ip)
        .unwrap_or_else(|| panic!("{pod} has an IP"))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn hakeeper(t: &TestNs) -> HaKeeperClient {
    let mut addresses = Vec::new();
    for i in 0..3 {
        addresses.push(format!("{}:32001", pod_ip(t, &format!("mo-log-{i}")).await));
    }
    HaKeeperClient::new(
        Discovery::Addresses(addresses),
        Options {
            timeout: Duration::from_secs(5),
            ..Options::default()
        },
    )
}

/// Deletes `pod` through the API server (the operator's webhook may refuse while a restart
/// would cost the LOG majority: retried), then waits for its new instance to be Ready.
async fn restart_pod(t: &TestNs, pod: &str) {
    let old = t.pod(pod).await.and_then(|p| p.uid()).expect("uid");
    wait_for(&format!("{pod} deleted"), READY_LIMIT, || async {
        let out = t.kubectl(&["delete", "pod", pod, "-n", &t.ns, "--wait=false"]);
        if out.status.success() {
            return Some(());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        None
    })
    .await;
    wait_for(&format!("{pod} back and Ready"), READY_LIMIT, || async {
        let p = t.pod(pod).await?;
        (p.uid() != Some(old.clone()) && pod_ready(&p)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_real_cluster_serves_sql_registers_every_store_and_survives_log_restarts() {
    let _serial = one_at_a_time().await;
    use_data_plane(DataPlane::RealKernel);
    let t = TestNs::new("real-lifecycle").await;
    let _operator = t.operator_with_deployed_rbac("op-1");
    let started = Instant::now();
    t.create("mo", real_cluster(&t, &newer()))
        .await
        .expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    let boot = started.elapsed();
    let pods = t.pod_list().await;
    let names: BTreeSet<String> = pods.iter().map(|p| p.name_any()).collect();
    assert_eq!(
        names,
        [
            "mo-ap-0",
            "mo-log-0",
            "mo-log-1",
            "mo-log-2",
            "mo-proxy-0",
            "mo-tn-0",
            "mo-tp-0"
        ]
        .into_iter()
        .map(String::from)
        .collect()
    );
    assert!(
        pods.iter().all(pod_ready),
        "every pod Ready by its own probe"
    );

    // SQL through the proxy.
    let proxy = Target::new("proxy", format!("{}:6001", pod_ip(&t, "mo-proxy-0").await));
    let tables = vec!["t1".to_string()];
    mo_sqlload::prepare(&proxy, "e2e", &tables, 200)
        .await
        .expect("create and fill a table through the proxy");
    let before = mo_sqlload::table_states(&proxy, "e2e", &tables)
        .await
        .expect("read back");
    assert_eq!(before["t1"].rows, 200);

    // Every store is in HAKeeper under the UUID the operator rendered for its pod.
    let details = hakeeper(&t)
        .await
        .get_cluster_details()
        .await
        .expect("details");
    let registered = |uuids: Vec<String>| uuids.into_iter().collect::<BTreeSet<_>>();
    let expected = |component: Component, pods: &[&str]| {
        pods.iter()
            .map(|p| store_uuid(component, p).expect("uuid"))
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(
        registered(details.cn_stores.iter().map(|s| s.uuid.clone()).collect()),
        [cn_uuid("mo-tp-0"), cn_uuid("mo-ap-0")]
            .into_iter()
            .collect()
    );
    assert_eq!(
        registered(details.log_stores.iter().map(|s| s.uuid.clone()).collect()),
        expected(Component::Log, &["mo-log-0", "mo-log-1", "mo-log-2"])
    );
    assert_eq!(
        registered(details.tn_stores.iter().map(|s| s.uuid.clone()).collect()),
        expected(Component::Tn, &["mo-tn-0"])
    );
    assert_eq!(
        registered(
            details
                .proxy_stores
                .iter()
                .map(|s| s.uuid.clone())
                .collect()
        ),
        expected(Component::Proxy, &["mo-proxy-0"])
    );
    // The version each CN registers: its binary's commit, as the official images stamp it.
    let commit = kernel_commit(&newer());
    for cn in &details.cn_stores {
        assert_eq!(cn.reported_version(), commit, "{}", cn.uuid);
    }
    let cluster = t.cluster("mo").await;
    let bootstrap = cluster
        .status
        .and_then(|s| s.log_bootstrap)
        .expect("the bootstrap decision is recorded");
    assert!(bootstrap.done, "HAKeeper seen serving: {bootstrap:?}");

    // Every LOG pod deleted and recreated in turn under writes whose values change: what
    // committed is all there afterwards, and the writes go on through each restart.
    let load = mo_sqlload::TargetLoad {
        target: proxy.clone(),
        clients: 2,
    };
    let mut config = mo_sqlload::WorkloadConfig::new(vec![load], "e2e", tables.clone());
    config.rows_per_table = 200;
    let workload = mo_sqlload::Workload::start(config).await.expect("workload");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log_restart = Instant::now();
    let mut last = workload.snapshot();
    for i in 0..3 {
        let pod = format!("mo-log-{i}");
        restart_pod(&t, &pod).await;
        t.wait_ready("mo", READY_LIMIT).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = workload.snapshot();
        assert!(
            now.committed > last.committed,
            "writes commit through {pod}'s restart: {now:?}"
        );
        last = now;
    }
    let three_restarts = log_restart.elapsed();
    let end = workload.stop().await;
    println!(
        "LOG restarts under writes: committed {}, failed {:?}, unknown {:?}, connect errors {:?}, \
         longest stall {} ms",
        end.committed,
        end.failed_by_code,
        end.unknown_by_code,
        end.connect_errors_by_code,
        end.tables["t1"].max_commit_gap_ms
    );
    assert!(
        end.consistency.as_ref().is_some_and(|c| c.ok),
        "after three LOG restarts the table holds exactly what committed: {:?}",
        end.consistency
    );
    assert!(
        end.tables["t1"].committed_updates > 0,
        "values changed under the restarts"
    );
    let figure = serde_json::json!({
        "boot_to_ready_seconds": boot.as_secs_f64(),
        "three_log_restarts_seconds": three_restarts.as_secs_f64(),
        "committed_during_log_restarts": end.committed,
        "failed": end.failed_by_code, "unknown": end.unknown_by_code,
        "longest_stall_ms": end.tables["t1"].max_commit_gap_ms,
    });
    println!("real cluster: {figure}");
    write_figure("real-lifecycle.json", &figure);
}

fn options() -> Options {
    Options {
        timeout: Duration::from_secs(5),
        ..Options::default()
    }
}

/// The CN's record as HAKeeper holds it.
async fn cn_record(t: &TestNs, pod: &str) -> mo_rpc::pb::logservice::CnStore {
    let uuid = cn_uuid(pod);
    hakeeper(t)
        .await
        .get_cluster_details()
        .await
        .expect("details")
        .cn_stores
        .into_iter()
        .find(|c| c.uuid == uuid)
        .unwrap_or_else(|| panic!("{pod} registered"))
}

fn main_container(pod: &Pod) -> (i32, Option<String>) {
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == "main"))
        .expect("main container status");
    let started = status
        .state
        .as_ref()
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .map(|t| t.0.to_string());
    (status.restart_count, started)
}

fn label(result: &mo_sqlload::Result<()>) -> Option<String> {
    match result {
        Err(mo_sqlload::Error::Sql { error, .. }) => Some(error.label()),
        _ => None,
    }
}

/// Each kernel fact the engine depends on, asserted on the running kernel.
#[tokio::test]
async fn the_kernel_facts_the_engine_relies_on_hold_on_the_real_kernel() {
    let _serial = one_at_a_time().await;
    use_data_plane(DataPlane::RealKernel);
    let t = TestNs::new("real-facts").await;
    // No protection: the test marks a CN behind the operator's back.
    let _operator = t.operator("op-plain");
    t.create("mo", real_cluster(&t, &newer()))
        .await
        .expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    let proxy = Target::new("proxy", format!("{}:6001", pod_ip(&t, "mo-proxy-0").await));
    let ap = Target::new("ap-0", format!("{}:6001", pod_ip(&t, "mo-ap-0").await));
    let tables = vec!["f1".to_string()];
    mo_sqlload::prepare(&proxy, "facts", &tables, 10)
        .await
        .expect("prepare");

    // 1. An idle cluster's CNs list the kernel's own sessions, and only clients count. The
    // kernel's background SQL (task storage, the trace writer) connects to one Working CN that
    // HAKeeper lists (`util/cn_address_func.go`: the last one, or a random one), so the sessions
    // can be on either CN, and only once that background work starts, which can be after the
    // operator (woken by the pods' Ready at once) has declared the cluster Ready.
    let mut queries = Vec::new();
    for cn in ["mo-ap-0", "mo-tp-0"] {
        let address = format!("{}:19998", pod_ip(&t, cn).await);
        queries.push((cn, mo_rpc::QueryClient::new(address, options())));
    }
    let (cn, sessions) = wait_for(
        "internal sessions on a CN of the idle cluster",
        Duration::from_secs(180),
        || async {
            for (cn, query) in &queries {
                let sessions = match query.show_process_list().await {
                    Ok(sessions) => sessions,
                    Err(e) => {
                        println!("ShowProcessList on {cn}: {e}");
                        continue;
                    }
                };
                assert_eq!(
                    mo_kube::kernel::client_sessions(&sessions),
                    0,
                    "no client has connected to {cn} yet: {sessions:?}"
                );
                if !sessions.is_empty() {
                    return Some((*cn, sessions));
                }
            }
            None
        },
    )
    .await;
    let users: BTreeSet<String> = sessions.iter().map(|s| s.user.clone()).collect();
    println!("internal sessions on {cn}: users {users:?}");
    let query = &queries[0].1;
    let held = mo_sqlload::hold_row_lock(&ap, "facts", "f1", 1)
        .await
        .expect("a client session on ap-0");
    let sessions = query.show_process_list().await.expect("ShowProcessList");
    assert_eq!(mo_kube::kernel::client_sessions(&sessions), 1);
    held.commit().await.expect("commit");

    // 1b. A session through the proxy is marked so on its CN, and the operator's count of the
    // proxy's client connections includes it (by the proxy's pod IP, or, from an address no
    // proxy pod has, for every proxy: never too low).
    let through_proxy = mo_sqlload::hold_row_lock(&proxy, "facts", "f1", 2)
        .await
        .expect("a client session through the proxy");
    let pods = t.pod_list().await;
    let refs: Vec<&Pod> = pods.iter().collect();
    let mut hosts = std::collections::BTreeMap::new();
    for cn in ["mo-ap-0", "mo-tp-0"] {
        let q = mo_rpc::QueryClient::new(format!("{}:19998", pod_ip(&t, cn).await), options());
        let list = q.show_process_list().await.expect("ShowProcessList");
        hosts.insert(
            cn.to_string(),
            Ok(mo_kube::kernel::client_proxy_hosts(&list)),
        );
    }
    let seen: Vec<&String> = hosts.values().flat_map(|h| h.as_ref().unwrap()).collect();
    println!(
        "ProxyHost of the session through the proxy: {seen:?} (proxy pod IP {})",
        pod_ip(&t, "mo-proxy-0").await
    );
    assert_eq!(seen.len(), 1, "one client session came through the proxy");
    let counts = mo_kube::kernel::proxy_connections(&refs, &hosts);
    assert_eq!(counts["mo-proxy-0"], Ok(1), "{counts:?}");
    through_proxy.commit().await.expect("commit");

    // 2. The version each CN registers is the commit stamped into its build (a git hash, as
    // the official images have it, never the tag).
    assert_eq!(
        cn_record(&t, "mo-ap-0").await.reported_version(),
        kernel_commit(&newer())
    );

    // 3. `(true, 0)` is the allocator's answer for a service it does not know.
    let allocator = mo_rpc::LockAllocatorClient::new(
        format!("{}:22002", pod_ip(&t, "mo-tn-0").await),
        options(),
    );
    let nobody = "00000000-dead-beef-0000-000000000000";
    assert!(allocator.can_restart_service(nobody).await.expect("can"));
    assert_eq!(
        allocator
            .remain_txn_in_service(nobody)
            .await
            .expect("remain"),
        0
    );

    // 4. HAKeeper cannot tell a quickly restarted CN from its old instance; Kubernetes can.
    let before = cn_record(&t, "mo-tp-0").await;
    let (restarts, started) = main_container(&t.pod("mo-tp-0").await.expect("tp-0"));
    let url = format!(
        "{}/v1/namespaces/{}/pods/mo-tp-0/kill?signal=KILL&container=main",
        t.shared.admin, t.ns
    );
    let killed = reqwest::Client::new()
        .post(&url)
        .send()
        .await
        .expect("kill");
    assert!(killed.status().is_success(), "{}", killed.status());
    wait_for(
        "tp-0's container restarted and Ready",
        READY_LIMIT,
        || async {
            let p = t.pod("mo-tp-0").await?;
            (main_container(&p).0 > restarts && pod_ready(&p)).then_some(())
        },
    )
    .await;
    let after = cn_record(&t, "mo-tp-0").await;
    let (_, started_again) = main_container(&t.pod("mo-tp-0").await.expect("tp-0"));
    assert_ne!(started, started_again, "Kubernetes: a new container");
    assert_eq!(
        (after.up_time, after.uuid.clone()),
        (before.up_time, before.uuid.clone()),
        "HAKeeper: the same record, UpTime included"
    );

    // 5. A CN marked for a restart refuses every new write transaction for good; reads work.
    assert_eq!(
        label(&mo_sqlload::write_once(&ap, "facts", "f1", 2).await),
        None
    );
    let ap_uuid = cn_uuid("mo-ap-0");
    assert!(allocator.set_restart_service(&ap_uuid).await.expect("mark"));
    wait_for("ap-0 can restart", Duration::from_secs(60), || async {
        allocator
            .can_restart_service(&ap_uuid)
            .await
            .ok()?
            .then_some(())
    })
    .await;
    assert_eq!(
        label(&mo_sqlload::write_once(&ap, "facts", "f1", 3).await).as_deref(),
        Some("20635")
    );
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        label(&mo_sqlload::write_once(&ap, "facts", "f1", 4).await).as_deref(),
        Some("20635"),
        "still refused 15 s later: nothing returns a marked CN to service"
    );
    mo_sqlload::table_states(&ap, "facts", &tables)
        .await
        .expect("reads still work on the marked CN");

    // 6. HAKeeper reports no log index; a read through one store's own replica (a read index)
    // answers only from a replica that has caught up. Every running replica answers, for the
    // HAKeeper shard and the WAL shard; a frozen store does not (HAKeeper's record of it, read
    // at the freeze, is printed: it lists the store's replicas until the record ages out).
    let probe = |pod: String| async move {
        let store = mo_rpc::LogStoreClient::new(
            format!("{pod}:32001"),
            Options {
                timeout: Duration::from_secs(2),
                ..Options::default()
            },
        );
        (
            store.read_through_replica(0).await,
            store.read_through_replica(1).await,
        )
    };
    for i in 0..3 {
        let (hakeeper_shard, wal_shard) = probe(pod_ip(&t, &format!("mo-log-{i}")).await).await;
        hakeeper_shard.unwrap_or_else(|e| panic!("mo-log-{i}, shard 0: {e}"));
        wal_shard.unwrap_or_else(|e| panic!("mo-log-{i}, shard 1: {e}"));
    }
    let signal = |sig: &'static str| {
        let url = format!(
            "{}/v1/namespaces/{}/pods/mo-log-2/kill?signal={sig}&container=main",
            t.shared.admin, t.ns
        );
        async move {
            let sent = reqwest::Client::new()
                .post(&url)
                .send()
                .await
                .expect("signal");
            assert!(sent.status().is_success(), "{sig}: {}", sent.status());
        }
    };
    let log_uuid = store_uuid(Component::Log, "mo-log-2").expect("uuid");
    let log_2 = pod_ip(&t, "mo-log-2").await;
    let others = HaKeeperClient::new(
        Discovery::Addresses(vec![
            format!("{}:32001", pod_ip(&t, "mo-log-0").await),
            format!("{}:32001", pod_ip(&t, "mo-log-1").await),
        ]),
        options(),
    );
    others
        .get_cluster_state()
        .await
        .expect("HAKeeper through log-0 or log-1");
    signal("STOP").await;
    // HAKeeper's record of the frozen store, read at once: its age in HAKeeper ticks (100 ms).
    let shown = match others.get_cluster_state().await {
        Ok(s) => {
            let tick = s.tick;
            let age = s
                .log_state
                .and_then(|l| l.stores.get(&log_uuid).map(|x| tick.saturating_sub(x.tick)));
            format!("{age:?} ticks old")
        }
        // The frozen store may lead the HAKeeper shard: reads wait for a new leader.
        Err(e) => format!("not read ({e})"),
    };
    let frozen = probe(log_2).await;
    signal("CONT").await;
    println!("frozen mo-log-2: reads {frozen:?}; HAKeeper's record of it: {shown}");
    assert!(
        frozen.0.is_err() && frozen.1.is_err(),
        "a frozen replica answers no read: {frozen:?}"
    );
    wait_for(
        "mo-log-2 answers reads again",
        Duration::from_secs(60),
        || async {
            let (a, b) = probe(pod_ip(&t, "mo-log-2").await).await;
            (a.is_ok() && b.is_ok()).then_some(())
        },
    )
    .await;
}

/// Incident 000 on the real kernel: an idle CN (`idle-0`, no client session) owns the lock
/// tables of the table the other CNs' DML writes.
fn lock_owner_cluster(t: &TestNs) -> serde_json::Value {
    let mut spec = real_cluster(t, &newer());
    spec["cn"]["groups"] = serde_json::json!([
        {"name": "tp", "replicas": 2},
        {"name": "idle", "replicas": 1},
    ]);
    spec
}

/// The kernel's own view of every open transaction and held lock, printed when a hand-over
/// does not finish (`mo_transactions` and `mo_locks` list the whole cluster's).
async fn dump_transactions(t: &TestNs) {
    for pod in ["mo-idle-0", "mo-tp-0", "mo-tp-1"] {
        let uuid = cn_uuid(pod);
        let Some(address) = hakeeper(t)
            .await
            .get_cluster_details()
            .await
            .ok()
            .and_then(|d| d.cn_stores.into_iter().find(|c| c.uuid == uuid))
            .map(|c| c.query_address)
        else {
            continue;
        };
        let query = mo_rpc::QueryClient::new(address, options());
        match query.get_lock_info().await {
            Ok(locks) => {
                for l in locks {
                    let txns = |w: &[mo_rpc::pb::lock::WaitTxn]| {
                        w.iter()
                            .map(|w| format!("{}@{}", hex(&w.txn_id), w.created_on))
                            .collect::<Vec<_>>()
                    };
                    println!(
                        "{pod} lock: table {} keys {:?} mode {} holders {:?} waiters {:?}",
                        l.table_id,
                        l.keys.iter().map(|k| hex(k)).collect::<Vec<_>>(),
                        l.lock_mode,
                        txns(&l.holders),
                        txns(&l.waiters)
                    );
                }
            }
            Err(e) => println!("{pod} GetLockInfo: {e}"),
        }
    }
    let cn = target(t, "mo-tp-0").await;
    for view in ["mo_transactions", "mo_locks"] {
        match mo_sqlload::rows_as_text(&cn, &format!("select * from mo_catalog.{view}")).await {
            Ok(rows) => {
                for row in rows {
                    println!("{view}: {row:?}");
                }
            }
            Err(e) => println!("{view}: {e}"),
        }
    }
}

/// The kernel's id of `database.table`, read through `mo-tp-0`.
async fn table_id(t: &TestNs, database: &str, table: &str) -> u64 {
    let cn = target(t, "mo-tp-0").await;
    let sql = format!(
        "select rel_id from mo_catalog.mo_tables where reldatabase = '{database}' and relname = '{table}'"
    );
    let rows = mo_sqlload::rows_as_text(&cn, &sql)
        .await
        .expect("the table's id");
    rows.first()
        .and_then(|r| r.first())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{database}.{table} has an id: {rows:?}"))
}

/// Who holds `table`'s locks: polls the lock services of `cns` (query GetLockInfo, which lists
/// a CN's *local* lock tables only, so a lock listed there lives in a table bound to that CN)
/// until one of them holds a lock of `table` for a transaction a tp CN created, and returns
/// that CN and the holder's lock service. A read with no side effect (the allocator's GetBind
/// is none: it registers and binds to whoever asks). `None` after `within`.
async fn lock_holder(
    t: &TestNs,
    table: u64,
    cns: &[&str],
    within: Duration,
) -> Option<(String, String)> {
    let details = hakeeper(t).await.get_cluster_details().await.ok()?;
    let queries: Vec<(&str, mo_rpc::QueryClient)> = cns
        .iter()
        .filter_map(|pod| {
            let uuid = cn_uuid(pod);
            let store = details.cn_stores.iter().find(|c| c.uuid == uuid)?;
            Some((
                *pod,
                mo_rpc::QueryClient::new(store.query_address.clone(), options()),
            ))
        })
        .collect();
    let tp = [cn_uuid("mo-tp-0"), cn_uuid("mo-tp-1")];
    let until = Instant::now() + within;
    while Instant::now() < until {
        for (pod, query) in &queries {
            let Ok(locks) = query.get_lock_info().await else {
                continue;
            };
            // A lock service's id is its start time in nanoseconds followed by the CN's UUID.
            let holder = locks
                .iter()
                .filter(|l| l.table_id == table)
                .flat_map(|l| l.holders.iter())
                .find(|h| tp.iter().any(|u| h.created_on.ends_with(u.as_str())));
            if let Some(h) = holder {
                return Some((pod.to_string(), h.created_on.clone()));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Asserts, from the kernel, that `owner`'s lock service holds the locks other CNs' DML takes
/// on `database.table`: the premise of every lock-owner test.
async fn assert_owner(t: &TestNs, database: &str, table: &str, owner: &str) -> u64 {
    let id = table_id(t, database, table).await;
    let all = ["mo-tp-0", "mo-tp-1", owner];
    let held = lock_holder(t, id, &all, Duration::from_secs(30)).await;
    println!("{database}.{table} (table {id}): locks held on {held:?}");
    assert!(
        held.as_ref().is_some_and(|(pod, _)| pod == owner),
        "{owner}'s lock service holds {database}.{table}'s locks for the tp CNs' DML: {held:?}"
    );
    id
}

/// Asserts, from the kernel, that `table`'s locks moved to a CN that stays (the tp CNs' DML
/// rebinds the table there once its owner handed it over).
async fn assert_moved_to_a_tp_cn(t: &TestNs, table: u64, owner: &str) {
    let all = ["mo-tp-0", "mo-tp-1", owner];
    let held = lock_holder(t, table, &all, Duration::from_secs(30)).await;
    println!("table {table} after the hand-over: locks held on {held:?}");
    assert!(
        held.as_ref()
            .is_some_and(|(pod, _)| pod.starts_with("mo-tp-")),
        "table {table}'s locks moved from {owner} to a CN that stays: {held:?}"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn dml_on(t: &TestNs, database: &str, table: &str, owner: &str) -> mo_sqlload::Workload {
    let idle = Target::new(owner, format!("{}:6001", pod_ip(t, owner).await));
    let tables = vec![table.to_string()];
    let mut targets = Vec::new();
    for pod in ["mo-tp-0", "mo-tp-1"] {
        let target = Target::new(pod, format!("{}:6001", pod_ip(t, pod).await));
        targets.push(mo_sqlload::TargetLoad { target, clients: 2 });
    }
    for target in std::iter::once(&idle).chain(targets.iter().map(|l| &l.target)) {
        target
            .wait_serving(Duration::from_secs(120))
            .await
            .expect("the CN serves SQL");
    }
    // Created through the owner and first locked there: it binds both lock tables DML on the
    // table needs (its rows', and its catalog row's).
    mo_sqlload::prepare(&idle, database, &tables, 100)
        .await
        .expect("prepare through the owner");
    mo_sqlload::make_owner(&idle, database, table)
        .await
        .expect("the owner locks first");
    let mut config = mo_sqlload::WorkloadConfig::new(targets, database, tables);
    config.rows_per_table = 100;
    mo_sqlload::Workload::start(config).await.expect("workload")
}

/// What a transaction gets when the CN owning its lock table is gone: the bind changed
/// (`ErrLockTableBindChanged`) or the table is not found (`ErrLockTableNotFound`).
const LOST_LOCK_OWNER_CODES: [&str; 2] = ["20702", "20703"];

#[tokio::test]
async fn incident_000_on_the_real_kernel_harm_without_protection_none_with_it() {
    let _serial = one_at_a_time().await;
    use_data_plane(DataPlane::RealKernel);
    // Baseline, protection off, in a cluster of its own: a CN that lost its lock tables the
    // hard way leaves the cluster harmed after it (measured: the next hand-over of a lock
    // owner there waited on a transaction that never ended), and the protected run must
    // start from a healthy cluster, as the incident's did.
    let unprotected = {
        let t = TestNs::new("real-incident-000-plain").await;
        let _plain = t.operator("op-plain");
        t.create("mo", lock_owner_cluster(&t))
            .await
            .expect("create");
        t.wait_ready("mo", READY_LIMIT).await;
        // A plain delete of the idle owner.
        let workload = dml_on(&t, "inc", "documents", "mo-idle-0").await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let calm = workload.snapshot();
        assert_eq!(calm.failed + calm.unknown, 0, "{calm:?}");
        assert_owner(&t, "inc", "documents", "mo-idle-0").await;
        let out = t.kubectl(&["delete", "pod", "mo-idle-0", "-n", &t.ns, "--wait=false"]);
        assert!(out.status.success());
        tokio::time::sleep(Duration::from_secs(40)).await;
        let unprotected = workload.stop().await;
        let stall = unprotected.tables["documents"].max_commit_gap_ms;
        println!(
            "unprotected: committed {}, failed {:?}, unknown {:?}, longest DML stall {stall} ms",
            unprotected.committed, unprotected.failed_by_code, unprotected.unknown_by_code
        );
        // The harm is the lock service's: transactions refused because their lock table's
        // bind changed or vanished with its owner, or DML stalled until the allocator's
        // keepalive for the dead owner ran out. Nothing else fails.
        let lost_owner = LOST_LOCK_OWNER_CODES
            .iter()
            .map(|code| unprotected.failed_by_code.get(*code).copied().unwrap_or(0))
            .sum::<u64>();
        assert!(
            lost_owner > 0 || stall >= 8_000,
            "losing the lock owner harms the DML (20702/20703 or a stall): {unprotected:?}"
        );
        assert!(
            unprotected
                .failed_by_code
                .keys()
                .all(|code| LOST_LOCK_OWNER_CODES.contains(&code.as_str()))
                && unprotected.unknown == 0,
            "only the lock service's refusals: {unprotected:?}"
        );
        // Its processes go before the next cluster boots (2 cores).
        let out = t.kubectl(&["delete", "moc", "mo", "-n", &t.ns, "--wait=false"]);
        assert!(out.status.success());
        wait_for("the baseline's pods gone", READY_LIMIT, || async {
            t.pod_names().await.is_empty().then_some(())
        })
        .await;
        unprotected
    };

    // Protected: the operator as deployed (webhooks, preStop hook), `kubectl drain`.
    let t = TestNs::new("real-incident-000").await;
    let _operator = t.operator_with_deployed_rbac("op-1");
    t.create("mo", lock_owner_cluster(&t))
        .await
        .expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    let workload = dml_on(&t, "inc", "documents2", "mo-idle-0").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let documents2 = assert_owner(&t, "inc", "documents2", "mo-idle-0").await;
    let a = t.pod("mo-idle-0").await.expect("idle-0");
    let a_uid = a.uid().expect("uid");
    let node = a.spec.and_then(|s| s.node_name).expect("bound");
    let out = t
        .kubectl_async(&[
            "drain",
            &node,
            "--pod-selector=ops.matrixorigin.io/cn-group=idle",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=150s",
        ])
        .await;
    let drain_log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        drain_log.contains("evictions.ops.matrixorigin.io"),
        "the eviction went through the operator's webhook: {drain_log}"
    );
    if !out.status.success() {
        dump_transactions(&t).await;
    }
    assert!(out.status.success(), "kubectl drain: {drain_log}");
    wait_for("idle-0's old instance gone", READY_LIMIT, || async {
        (t.pod("mo-idle-0").await.and_then(|p| p.uid()) != Some(a_uid.clone())).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // The hand-over moved the table to a CN that stays (the DML rebinds it there).
    assert_moved_to_a_tp_cn(&t, documents2, "mo-idle-0").await;
    let protected = workload.stop().await;
    let stall = protected.tables["documents2"].max_commit_gap_ms;
    println!(
        "protected: committed {}, failed {:?}, unknown {:?}, longest DML stall {stall} ms",
        protected.committed, protected.failed_by_code, protected.unknown_by_code
    );
    assert_hand_over_cost(&protected, stall, "protected");
    assert!(protected.committed > 0);
    assert!(
        protected.consistency.as_ref().is_some_and(|c| c.ok),
        "{:?}",
        protected.consistency
    );
    // The hand-over takes a couple of seconds (the allocator disables the binds, the DML
    // rebinds); the DML never waits for the owner's shutdown.
    let _ = t.kubectl(&["uncordon", &node]);
    write_figure(
        "real-incident-000.json",
        &serde_json::json!({
            "unprotected": {"committed": unprotected.committed, "failed": unprotected.failed_by_code,
                "unknown": unprotected.unknown_by_code,
                "longest_stall_ms": unprotected.tables["documents"].max_commit_gap_ms},
            "protected": {"committed": protected.committed, "failed": protected.failed,
                "unknown": protected.unknown, "longest_stall_ms": stall},
        }),
    );
}

fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Every pod instance's deletion request (uid → (pod, Unix ms)), recorded by a watch so that
/// an instance gone between two polls is still on record.
struct DeletionLog {
    deleted: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, (String, u64)>>>,
    /// Every instance's main container exits as its kubelet reported them, kept after the
    /// instance is gone.
    exits: Exits,
    task: tokio::task::JoinHandle<()>,
}

type Exits = std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, InstanceExits>>>;

/// One pod instance's main container, as its kubelet reported it.
#[derive(Clone, Debug, Default)]
struct InstanceExits {
    pod: String,
    /// The highest restart count seen (restarts in place: crashes, fatal exits).
    restarts: i32,
    /// The exit code before the last restart in place.
    last_exit: Option<i32>,
    /// How the container ended for good (its state once terminated, before the pod went).
    final_exit: Option<i32>,
}

/// The main container's restart count, last and final exit codes, as the kubelet reports them.
fn main_container_exits(pod: &Pod) -> Option<(i32, Option<i32>, Option<i32>)> {
    let status = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "main")?;
    let exit_of = |state: Option<&k8s_openapi::api::core::v1::ContainerState>| {
        state
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code)
    };
    Some((
        status.restart_count,
        exit_of(status.last_state.as_ref()),
        exit_of(status.state.as_ref()),
    ))
}

impl DeletionLog {
    /// Returns once the watch has listed the namespace, so nothing deleted after it is missed.
    async fn watch(t: &TestNs) -> DeletionLog {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let deleted = std::sync::Arc::<
            std::sync::Mutex<std::collections::BTreeMap<String, (String, u64)>>,
        >::default();
        let (listed, on_listed) = tokio::sync::oneshot::channel();
        let record = deleted.clone();
        let exits = Exits::default();
        let exits_seen = exits.clone();
        let mut stream = watcher(t.pods(), watcher::Config::default()).boxed();
        let task = tokio::spawn(async move {
            let mut listed = Some(listed);
            while let Some(event) = stream.next().await {
                let (pod, gone) = match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                    Ok(watcher::Event::Delete(p)) => (p, true),
                    Ok(watcher::Event::InitDone) => {
                        if let Some(l) = listed.take() {
                            let _ = l.send(());
                        }
                        continue;
                    }
                    // The watcher re-lists after an error; what it missed meanwhile is caught
                    // by the check that every instance gone was seen deleted.
                    Ok(watcher::Event::Init) | Err(_) => continue,
                };
                if let Some((restarts, last_exit, final_exit)) = main_container_exits(&pod) {
                    let mut seen = exits_seen.lock().expect("exit log");
                    let entry = seen
                        .entry(pod.uid().unwrap_or_default())
                        .or_insert_with(|| InstanceExits {
                            pod: pod.name_any(),
                            ..InstanceExits::default()
                        });
                    entry.restarts = entry.restarts.max(restarts);
                    entry.last_exit = last_exit.or(entry.last_exit);
                    entry.final_exit = final_exit.or(entry.final_exit);
                }
                // deletionTimestamp is the deadline (the request + the grace period), in
                // seconds; a pod removed at once may carry none: then the event's own time.
                let requested = match pod.metadata.deletion_timestamp.as_ref() {
                    Some(at) => {
                        let grace_ms = pod
                            .metadata
                            .deletion_grace_period_seconds
                            .unwrap_or(0)
                            .max(0)
                            * 1000;
                        (at.0.as_millisecond() - grace_ms).max(0) as u64
                    }
                    None if gone => unix_ms_now(),
                    None => continue,
                };
                record
                    .lock()
                    .expect("deletion log")
                    .entry(pod.uid().unwrap_or_default())
                    .or_insert((pod.name_any(), requested));
            }
        });
        on_listed.await.expect("the pod watch lists the namespace");
        DeletionLog {
            deleted,
            exits,
            task,
        }
    }

    /// Instances whose main container exited and was restarted in place (a crash, a fatal
    /// exit) at any time the watch ran, gone instances included.
    fn restarted_in_place(&self) -> Vec<(String, InstanceExits)> {
        self.exits
            .lock()
            .expect("exit log")
            .iter()
            .filter(|(_, e)| e.restarts > 0)
            .map(|(uid, e)| (uid.clone(), e.clone()))
            .collect()
    }

    /// Every instance of `prefix`'s pods whose kubelet reported how it ended.
    fn final_exits(&self, prefix: &str) -> Vec<(String, InstanceExits)> {
        self.exits
            .lock()
            .expect("exit log")
            .iter()
            .filter(|(_, e)| e.pod.starts_with(prefix) && e.final_exit.is_some())
            .map(|(uid, e)| (uid.clone(), e.clone()))
            .collect()
    }

    fn snapshot(&self) -> std::collections::BTreeMap<String, (String, u64)> {
        self.deleted.lock().expect("deletion log").clone()
    }
}

impl Drop for DeletionLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn target(t: &TestNs, pod: &str) -> Target {
    Target::new(pod, format!("{}:6001", pod_ip(t, pod).await))
}

async fn drain_view(t: &TestNs, pod: &str) -> Option<mo_kube::crd::DrainView> {
    t.cluster("mo")
        .await
        .status?
        .drains
        .into_iter()
        .find(|d| d.pod == pod)
}

/// Scale-in of a CN that owns lock tables, and an eviction withdrawn after its hand-over was
/// requested: the CN, which now refuses new writes for good, is restarted, never put back.
#[tokio::test]
async fn a_lock_owner_scales_in_and_a_withdrawn_eviction_restarts_the_cn_on_the_real_kernel() {
    let _serial = one_at_a_time().await;
    use_data_plane(DataPlane::RealKernel);
    let t = TestNs::new("real-scale-in").await;
    let _operator = t.operator_with_deployed_rbac("op-1");
    let mut spec = real_cluster(&t, &newer());
    spec["cn"]["groups"] = serde_json::json!([
        {"name": "tp", "replicas": 2},
        {"name": "idle", "replicas": 2},
    ]);
    spec["drain"]["evictionAbandon"] = "20s".into();
    t.create("mo", spec).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;

    // Scale-in: idle-1 owns `t3`, whose DML runs on the tp CNs.
    let workload = dml_on(&t, "scale", "t3", "mo-idle-1").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t3 = assert_owner(&t, "scale", "t3", "mo-idle-1").await;
    let old = t.pod("mo-idle-1").await.and_then(|p| p.uid()).expect("uid");
    t.patch_spec(
        "mo",
        serde_json::json!({"cn": {"groups": [{"name": "tp", "replicas": 2}, {"name": "idle", "replicas": 1}]}}),
    )
    .await;
    wait_for("idle-1 removed", READY_LIMIT, || async {
        t.pod("mo-idle-1").await.is_none().then_some(())
    })
    .await;
    let removed = workload.snapshot();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_moved_to_a_tp_cn(&t, t3, "mo-idle-1").await;
    let scaled = workload.stop().await;
    let stall = scaled.tables["t3"].max_commit_gap_ms;
    println!(
        "scale-in: committed {}, failed {:?}, unknown {:?}, longest stall {stall} ms",
        scaled.committed, scaled.failed_by_code, scaled.unknown_by_code,
    );
    assert_hand_over_cost(&scaled, stall, "scale-in");
    assert!(scaled.consistency.as_ref().is_some_and(|c| c.ok));
    assert!(
        scaled.committed > removed.committed,
        "the DML goes on after idle-1 left: {} then {}",
        removed.committed,
        scaled.committed
    );
    // As in incident 000: the hand-over takes the kernel's keepalives, never the owner's stop.
    let events = t.kubectl(&["get", "events", "-n", &t.ns, "-o", "json"]);
    assert!(
        String::from_utf8_lossy(&events.stdout).contains(&format!("(uid {old})")),
        "the deletion names the instance"
    );

    withdrawn_eviction_under_dml(&t).await;
}

/// The withdrawn eviction, under incident 000's workload: idle-0 owns `t5`, whose DML runs on
/// the tp CNs, and `t6`, where a transaction of tp-0 holds a row lock, so idle-0's hand-over
/// cannot finish while `kubectl drain` tries, and kubectl gives up on our webhook's refusal.
/// The drain then becomes a restart that waits for the hand-over; the DML on `t5` loses
/// nothing and stalls less than 6 s through all of it.
async fn withdrawn_eviction_under_dml(t: &TestNs) {
    let workload = dml_on(t, "scale", "t5", "mo-idle-0").await;
    let idle = target(t, "mo-idle-0").await;
    mo_sqlload::prepare(&idle, "scale", &["t6".to_string()], 10)
        .await
        .expect("t6 through idle-0");
    mo_sqlload::make_owner(&idle, "scale", "t6")
        .await
        .expect("idle-0 owns t6");
    let held = mo_sqlload::hold_row_lock(&target(t, "mo-tp-0").await, "scale", "t6", 1)
        .await
        .expect("a long transaction on tp-0 holds a lock in idle-0's table");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t5 = assert_owner(t, "scale", "t5", "mo-idle-0").await;
    assert_owner(t, "scale", "t6", "mo-idle-0").await;
    let a = t.pod("mo-idle-0").await.expect("idle-0");
    let a_uid = a.uid().expect("uid");
    let node = a.spec.and_then(|s| s.node_name).expect("bound");
    let before_drain = workload.snapshot();
    let out = t
        .kubectl_async(&[
            "drain",
            &node,
            "--pod-selector=ops.matrixorigin.io/cn-group=idle",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=20s",
        ])
        .await;
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "kubectl gave up: {output}");
    // Not any failure: the Eviction API refused with our webhook's reason until kubectl's
    // own deadline.
    assert!(
        output.contains(mo_kube::webhook::EVICTION_WEBHOOK) && output.contains("draining"),
        "refused by the webhook: {output}"
    );
    assert!(
        output.contains("global timeout"),
        "kubectl's deadline: {output}"
    );
    let _ = t.kubectl(&["uncordon", &node]);
    // The evictor is gone; the drain was withdrawn after SetRestartService: it is now a
    // restart, and idle-0 stays Draining in HAKeeper (never put back to work).
    let converted = wait_for(
        "the withdrawn drain becomes a restart",
        READY_LIMIT,
        || async {
            let d = drain_view(t, "mo-idle-0").await?;
            (d.pod_uid == a_uid && d.purpose.starts_with("restart")).then_some(d)
        },
    )
    .await;
    println!("withdrawn: {converted:?}");
    for _ in 0..10 {
        let record = cn_record(t, "mo-idle-0").await;
        assert_eq!(
            record.work_state, 2,
            "Draining, never Working again: {record:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        t.pod("mo-idle-0").await.and_then(|p| p.uid()),
        Some(a_uid.clone()),
        "not restarted before its hand-over finished"
    );
    let while_held = workload.snapshot();
    assert!(
        while_held.committed > before_drain.committed,
        "the DML on t5 goes on while the drain waits: {} then {}",
        before_drain.committed,
        while_held.committed
    );
    held.commit()
        .await
        .expect("the long transaction commits: nothing was taken from under it");
    wait_for("idle-0 restarted and Ready", READY_LIMIT, || async {
        let p = t.pod("mo-idle-0").await?;
        (p.uid() != Some(a_uid.clone()) && pod_ready(&p)).then_some(())
    })
    .await;
    t.wait_ready("mo", READY_LIMIT).await;
    let restarted = workload.snapshot();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_moved_to_a_tp_cn(t, t5, "mo-idle-0").await;
    let end = workload.stop().await;
    let stall = end.tables["t5"].max_commit_gap_ms;
    println!(
        "withdrawn eviction: committed {}, failed {:?}, unknown {:?}, connect errors {:?}, \
         longest stall {stall} ms",
        end.committed, end.failed_by_code, end.unknown_by_code, end.connect_errors_by_code,
    );
    assert_hand_over_cost(&end, stall, "withdrawn eviction");
    assert!(
        end.connect_errors_by_code.is_empty(),
        "the tp CNs kept serving: {end:?}"
    );
    assert!(end.consistency.as_ref().is_some_and(|c| c.ok), "{end:?}");
    assert!(
        end.committed > restarted.committed,
        "the DML goes on after idle-0's restart: {} then {}",
        restarted.committed,
        end.committed
    );
    let idle = target(t, "mo-idle-0").await;
    mo_sqlload::write_once(&idle, "scale", "t6", 2)
        .await
        .expect("the new instance of idle-0 takes writes");
}

/// A rolling upgrade v1.2.3 → v1.2.4 under DML through the proxy, the operator killed in the
/// CN phase.
///
/// One proxy, restarted in place: two would each be drained first, and that drain cannot end
/// here. Every process of this kubelet shares one network namespace, so the CNs see every
/// proxy's connections come from 127.0.0.1, an address no proxy pod has; the operator then
/// counts each connection for every proxy (never too low), and a proxy leaving its Service
/// keeps the other's clients on its count. On Kubernetes each proxy dials from its own pod IP.
/// The count itself is checked on the real kernel in the facts test; the drain in the
/// simulator and the end-to-end tests.
#[tokio::test]
async fn a_rolling_upgrade_from_v1_2_3_to_v1_2_4_under_dml_on_the_real_kernel() {
    let _serial = one_at_a_time().await;
    use_data_plane(DataPlane::RealKernel);
    let t = TestNs::new("real-upgrade").await;
    let mut operator = t.operator_with_deployed_rbac("op-1");
    let mut spec = real_cluster(&t, &older());
    spec["cn"]["groups"] = serde_json::json!([{"name": "tp", "replicas": 2}]);
    spec["proxy"]["replicas"] = 1.into();
    t.create("mo", spec).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    let mut uids = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
    // Each pod instance's deletion request, from a watch on the API server (a 500 ms poll
    // missed a proxy that stopped in under a second): what a lost transaction is checked
    // against.
    let deletions = DeletionLog::watch(&t).await;
    // The MatrixOne pods' instances (the pre-pull helper pods are not restarted; they run once).
    let seen = |pods: &[Pod], uids: &mut std::collections::BTreeMap<String, BTreeSet<String>>| {
        for p in pods
            .iter()
            .filter(|p| !p.labels().contains_key(mo_kube::resources::LABEL_PREPULL))
        {
            uids.entry(p.name_any())
                .or_default()
                .insert(p.uid().unwrap_or_default());
        }
    };
    seen(&t.pod_list().await, &mut uids);
    assert_ne!(
        kernel_commit(&older()),
        kernel_commit(&newer()),
        "two versions the CNs' reports tell apart"
    );
    assert_cn_versions(&t, &older(), "before the upgrade").await;
    let proxies = [target(&t, "mo-proxy-0").await];
    let tables = vec!["u1".to_string(), "u2".to_string()];
    mo_sqlload::prepare(&proxies[0], "upg", &tables, 100)
        .await
        .expect("prepare");
    let loads = proxies
        .iter()
        .map(|p| mo_sqlload::TargetLoad {
            target: p.clone(),
            clients: 4,
        })
        .collect();
    // Every failure kept (connection retries during a proxy's restart alone add dozens), so
    // that each lost transaction can be attributed below.
    let mut config = mo_sqlload::WorkloadConfig::new(loads, "upg", tables);
    config.recent_failures = 10_000;
    let workload = mo_sqlload::Workload::start(config).await.expect("workload");
    tokio::time::sleep(Duration::from_secs(5)).await;

    let started = Instant::now();
    t.patch_spec("mo", serde_json::json!({"version": newer()}))
        .await;
    // The workload's outcomes as each phase begins: what every phase costs, apart.
    let mut phases: Vec<(String, mo_sqlload::Outcomes, Instant)> = Vec::new();
    // When each phase was first seen, in Unix ms (failures carry Unix ms).
    let mut phase_unix_ms: Vec<u64> = Vec::new();
    let mut killed = false;
    let mut generation = 1;
    let mut last_step = String::new();
    loop {
        let rollout = t
            .cluster("mo")
            .await
            .status
            .and_then(|s| s.rollout)
            .filter(|r| r.target == newer());
        let step = rollout.as_ref().map(|r| r.step.clone()).unwrap_or_default();
        let waiting = rollout.and_then(|r| r.waiting_on).unwrap_or_default();
        if step != last_step {
            println!(
                "{:>6.1} s: {step} ({waiting})",
                started.elapsed().as_secs_f64()
            );
            last_step = step.clone();
        }
        // A halt never resolves by itself: fail now, with what it waited on.
        assert!(
            !step.starts_with("halted") && !step.starts_with("rolled"),
            "the upgrade stopped: {step}: {waiting}"
        );
        seen(&t.pod_list().await, &mut uids);
        // `upgrade <component>: …` or `complete`.
        let phase = step
            .strip_prefix("upgrade ")
            .and_then(|s| s.split(':').next())
            .unwrap_or(&step)
            .to_string();
        if !phase.is_empty() && phases.last().is_none_or(|(p, _, _)| *p != phase) {
            phases.push((phase.clone(), workload.snapshot(), Instant::now()));
            phase_unix_ms.push(unix_ms_now());
        }
        if phase == "cn" && !killed {
            operator.kill();
            killed = true;
            generation += 1;
            operator = t.operator_with_deployed_rbac(&format!("op-{generation}"));
        }
        if step == "complete" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "the upgrade did not finish: {step}: {waiting}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let makespan = started.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let end = workload.stop().await;
    let deleted = deletions.snapshot();
    let now = t.pod_list().await;
    seen(&now, &mut uids);
    for (pod, instances) in &uids {
        for uid in instances {
            let gone = now.iter().all(|p| p.uid().as_deref() != Some(uid.as_str()));
            assert!(
                !gone || deleted.contains_key(uid),
                "the watch saw the deletion of every instance that went ({pod} {uid}): {deleted:?}"
            );
        }
    }
    assert!(killed, "the operator was killed in the CN phase");
    // No instance of any pod (the old and the new TN included) exited and was restarted in
    // place: 0 TN fatal exits, read from the kubelet's reports for every instance.
    let crashed = deletions.restarted_in_place();
    assert!(crashed.is_empty(), "no instance crashed: {crashed:?}");
    // Every instance replaced stopped cleanly: exit 0 (a fatal exit, a panic or a SIGKILL at
    // the end of the grace period would be 1, 2 or 137), the old TN's seen.
    let ended = deletions.final_exits("mo-");
    println!("final exits: {ended:?}");
    let unclean: Vec<_> = ended
        .iter()
        .filter(|(_, e)| e.final_exit != Some(0))
        .collect();
    assert!(
        unclean.is_empty(),
        "every instance ended with 0: {unclean:?}"
    );
    assert!(
        ended.iter().any(|(_, e)| e.pod == "mo-tn-0"),
        "the old TN's end was reported: {ended:?}"
    );
    let names: Vec<&str> = phases.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(names, ["log", "tn", "cn", "proxy", "complete"]);
    let mut cost = serde_json::Map::new();
    let lost = |o: &mo_sqlload::Outcomes| (o.failed, o.unknown);
    let (failed0, unknown0) = lost(&phases[0].1);
    cost.insert(
        "before".into(),
        serde_json::json!({"failed": failed0, "unknown": unknown0}),
    );
    for (i, (phase, at_start, since)) in phases.iter().enumerate() {
        let (next, until) = phases
            .get(i + 1)
            .map_or((&end, Instant::now()), |(_, o, t)| (o, *t));
        cost.insert(
            phase.clone(),
            serde_json::json!({
                "committed": next.committed - at_start.committed,
                "failed": next.failed - at_start.failed,
                "unknown": next.unknown - at_start.unknown,
                "connect_errors": next.connect_errors - at_start.connect_errors,
                "seconds": (until - *since).as_secs_f64(),
            }),
        );
        // Progress in every phase: a rollout that stalls the DML for a whole phase is harm
        // even when nothing fails.
        assert!(
            next.committed > at_start.committed,
            "transactions commit during the {phase} phase"
        );
    }
    let cost = serde_json::Value::Object(cost);
    println!(
        "upgrade: makespan {:.0} s; committed {}; failed {:?}; unknown {:?}; by phase {cost}",
        makespan.as_secs_f64(),
        end.committed,
        end.failed_by_code,
        end.unknown_by_code
    );
    // A bound this upgrade could not beat, from what the pods themselves took: one pod after
    // another, from its deletion request to its successor's Ready, plus the spec's 10 s
    // stability window after each. The CN drains, the gates' reads and the operator's restart
    // in the CN phase are left out: the bound is low, the ratio pessimistic.
    let ready_ms = |p: &Pod| -> Option<u64> {
        let ready = p
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == "True")?;
        Some(
            ready
                .last_transition_time
                .as_ref()?
                .0
                .as_millisecond()
                .max(0) as u64,
        )
    };
    let mut restarts_ms = 0;
    let mut restarted = 0;
    for p in now
        .iter()
        .filter(|p| !p.labels().contains_key(mo_kube::resources::LABEL_PREPULL))
    {
        let name = p.name_any();
        let requested = deleted
            .values()
            .filter(|(pod, _)| *pod == name)
            .map(|(_, at)| *at)
            .max();
        if let (Some(requested), Some(ready)) = (requested, ready_ms(p)) {
            restarts_ms += ready.saturating_sub(requested);
            restarted += 1;
        }
    }
    let bound = restarts_ms as f64 / 1000.0 + restarted as f64 * 10.0;
    println!(
        "upgrade bound: {restarted} pods, {:.0} s restarting + {restarted} windows of 10 s = {bound:.0} s; makespan {:.2}x",
        restarts_ms as f64 / 1000.0,
        makespan.as_secs_f64() / bound
    );
    write_figure(
        "real-upgrade.json",
        &serde_json::json!({"makespan_seconds": makespan.as_secs_f64(), "committed": end.committed,
            "failed_by_code": end.failed_by_code, "unknown_by_code": end.unknown_by_code,
            "by_phase": cost, "pods_restarted": restarted,
            "restarting_seconds": restarts_ms as f64 / 1000.0, "bound_seconds": bound,
            "makespan_over_bound": makespan.as_secs_f64() / bound}),
    );
    // Every lost transaction is attributed from ground truth, not from the phase the test saw
    // last (its 500 ms poll can see a phase change after the operator acted on it):
    // - the TN's restart: anything that ended while the TN phase ran;
    // - a proxy's restart: the v1.2.4 proxy closes its clients' connections at once when it
    //   stops (`pkg/proxy/server.go`, `Close` → goetty's `Stop`), so an I/O error on a
    //   connection through a proxy instance, ending between that instance's deletion and
    //   its exit (a proxy stops in about 2 s; 15 s allowed), at most one per client of it.
    // Anything else fails the test.
    let lost_on_record = end
        .recent_failures
        .iter()
        .filter(|f| !matches!(f.outcome, mo_sqlload::FailureOutcome::ConnectError))
        .count() as u64;
    assert_eq!(
        lost_on_record,
        end.failed + end.unknown,
        "every lost transaction is on record: {end:?}"
    );
    // The TN phase from the old TN's deletion (the operator may act before the test sees the
    // step) to the CN phase.
    let tn_index = names.iter().position(|p| *p == "tn").expect("a TN phase");
    let tn_deleted = deleted
        .values()
        .filter(|(pod, _)| pod == "mo-tn-0")
        .map(|(_, at)| *at)
        .min();
    let tn_from = tn_deleted.map_or(phase_unix_ms[tn_index], |d| d.min(phase_unix_ms[tn_index]));
    // ... to its successor's Ready, read from the API server, plus a margin for the CNs to
    // reconnect their logtail and rebind their lock tables on the new TN (whose allocator
    // starts with no binds: `20702` is the TN's restart too).
    let tn_ready = now
        .iter()
        .find(|p| p.name_any() == "mo-tn-0")
        .and_then(ready_ms)
        .expect("the new TN is Ready");
    let tn_until = tn_ready + TN_RESTART_MARGIN_MS;
    let per_proxy_clients = 4;
    let mut by_proxy_instance = std::collections::BTreeMap::<&str, u64>::new();
    let mut unexplained = Vec::new();
    let mut tn_losses = std::collections::BTreeMap::<String, u64>::new();
    for f in &end.recent_failures {
        let in_tn_restart = (tn_from..=tn_until).contains(&f.unix_ms);
        if matches!(f.outcome, mo_sqlload::FailureOutcome::ConnectError) {
            // No session to open while the TN or the one proxy restarts; nowhere else.
            let proxy_restart = deleted.values().any(|(pod, at)| {
                pod.starts_with("mo-proxy-") && (*at..=at + PROXY_RESTART_MS).contains(&f.unix_ms)
            });
            if !in_tn_restart && !proxy_restart {
                unexplained.push(f);
            }
            continue;
        }
        if in_tn_restart && TN_RESTART_CODES.contains(&f.code.as_str()) {
            *tn_losses.entry(f.code.clone()).or_default() += 1;
            continue;
        }
        let proxy_stop = deleted.iter().find(|(_, (pod, deleted))| {
            *pod == f.target && f.code == "io" && (*deleted..=deleted + 15_000).contains(&f.unix_ms)
        });
        match proxy_stop {
            Some((uid, _)) => *by_proxy_instance.entry(uid.as_str()).or_default() += 1,
            None => unexplained.push(f),
        }
    }
    assert!(
        unexplained.is_empty(),
        "no transaction lost outside the TN's restart and the proxies' own stops: \
         {unexplained:#?} (deletions {deleted:?}; TN phase {tn_from}..{tn_until}) {cost}"
    );
    println!(
        "the TN's restart: {:.1} s from its deletion to its successor's Ready, {tn_losses:?} lost \
         (until {} s after it)",
        (tn_ready - tn_deleted.unwrap_or(tn_from)) as f64 / 1000.0,
        TN_RESTART_MARGIN_MS / 1000
    );
    assert!(
        end.consistency.as_ref().is_some_and(|c| c.ok),
        "the tables hold exactly what committed: {:?}",
        end.consistency
    );
    assert!(
        by_proxy_instance.values().all(|n| *n <= per_proxy_clients),
        "at most one transaction per client of each restarted proxy: {by_proxy_instance:?} {cost}"
    );
    t.wait_ready("mo", READY_LIMIT).await;
    let pods = t.pod_list().await;
    seen(&pods, &mut uids);
    for p in &pods {
        let image = p.spec.as_ref().and_then(|s| s.containers[0].image.clone());
        assert!(
            image.is_some_and(|i| i.ends_with(&format!(":{}", newer()))),
            "{}",
            p.name_any()
        );
        assert_eq!(main_container(p).0, 0, "{} never crashed", p.name_any());
    }
    for (pod, seen) in &uids {
        assert_eq!(seen.len(), 2, "{pod} restarted exactly once: {seen:?}");
    }
    assert_cn_versions(&t, &newer(), "after the upgrade").await;
}

/// Asserts the version every CN process reports, read from HAKeeper (not from the operator).
async fn assert_cn_versions(t: &TestNs, version: &str, when: &str) {
    let details = hakeeper(t)
        .await
        .get_cluster_details()
        .await
        .expect("details");
    assert!(!details.cn_stores.is_empty(), "CNs registered {when}");
    let commit = kernel_commit(version);
    for cn in details.cn_stores {
        assert_eq!(
            cn.reported_version(),
            commit,
            "{} {when} ({version})",
            cn.uuid
        );
    }
}

/// The commit the kernel binary of `version` reports: built as the official images are, a
/// short git hash and never the tag, so the operator's CN gate runs on what users run.
/// The versions the suite runs (`MO_KERNEL_VERSIONS`, default v1.2.3 and v1.2.4): clusters
/// start on the older and upgrade to the newer.
fn older() -> String {
    mo_testenv::kernel_versions().expect("the kernel versions")[0].clone()
}

fn newer() -> String {
    mo_testenv::kernel_versions().expect("the kernel versions")[1].clone()
}

fn kernel_commit(version: &str) -> String {
    let (_, bin) = mo_testenv::matrixone_kernels()
        .expect("the kernels")
        .into_iter()
        .find(|(v, _)| v == version)
        .expect("built");
    let commit = mo_testenv::matrixone_commit(&bin).expect("the kernel's commit");
    assert!(
        mo_core::gates::is_commit_hash(&commit),
        "{version} reports {commit:?}, a commit hash as the official images do"
    );
    commit
}

/// After the new TN is Ready, how long its restart may still cost transactions: the CNs
/// reconnect their logtail and rebind their lock tables (the spec's stability window).
const TN_RESTART_MARGIN_MS: u64 = 10_000;
/// What a TN restart answers a transaction on v1.2: `20101` (TN unavailable), `20502` /
/// `20504` / `20505` (the CN's backend to the TN closed or not yet reconnected) and `20702`
/// (the new allocator rebinds every lock table).
const TN_RESTART_CODES: [&str; 5] = ["20101", "20502", "20504", "20505", "20702"];
/// From a proxy's deletion, how long opening a session through it may fail: it stops in
/// about 2 s and its successor serves about 10 s later here.
const PROXY_RESTART_MS: u64 = 30_000;

/// A CN drain of `version`'s rollout whose hand-over is not yet requested, on a pod that does
/// not run that version yet, while another CN already does: a CN prepared during another's
/// stability window.
fn prepared_cn(
    status: &mo_kube::crd::MatrixOneClusterStatus,
    pods: &[Pod],
    version: &str,
) -> Option<String> {
    let cn_on = |v: &str| {
        pods.iter()
            .filter(|p| p.name_any().starts_with("mo-tp-") && image_tag(p) == v)
            .count()
    };
    status
        .drains
        .iter()
        .find(|d| {
            d.purpose == format!("restart on {version}")
                && matches!(d.stage.as_str(), "MarkDraining" | "MigrateSessions")
                && pods.iter().any(|p| {
                    p.name_any() == d.pod
                        && p.uid().as_deref() == Some(&d.pod_uid)
                        && image_tag(p) != version
                })
        })
        .filter(|_| cn_on(version) >= 1)
        .map(|d| d.pod.clone())
}

fn image_tag(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first()?.image.clone())
        .and_then(|i| i.rsplit_once(':').map(|(_, tag)| tag.to_string()))
        .unwrap_or_default()
}

fn created_ms(pod: &Pod) -> u64 {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_millisecond().max(0) as u64)
}

/// Where the test stands in its change-of-mind scenario.
#[derive(Debug, PartialEq)]
enum Mind {
    /// Upgrading to v1.2.4, waiting for two CNs on it and a third prepared.
    Forward,
    /// The version set back to v1.2.3: waiting for the operator's rollout to follow.
    SetBack,
    /// Going back to v1.2.3, waiting for a CN prepared in its CN phase.
    Back,
    /// The CN restarted in the rollback's window killed and the stall timeout shortened:
    /// waiting for the halt.
    Halting,
    /// The older version brings an older catalog than the newer one's CNs ran: the set-back
    /// is refused (the kernel stops such a CN at start); waiting for the halt that says so.
    Refused,
}

/// What a protected hand-over of a lock table may cost the DML on it, by the kernel's
/// generation (`mo_core::generation::Facts::hand_over_fences_after`): nothing up to v3.0 (the
/// statements retry on the new bind: a stall of a couple of seconds); from v4.0 each statement
/// on the table in flight while it moves is fenced and fails with 20702 once the lock
/// operator's retry budget (10 s) runs out: at most one per client, each after that budget,
/// the longest stall that budget. Nothing else fails, nothing is unknown.
fn assert_hand_over_cost(o: &mo_sqlload::Outcomes, stall_ms: u64, what: &str) {
    let fenced = mo_core::generation::Generation::of(&newer())
        .and_then(|g| g.facts().hand_over_fences_after);
    assert_eq!(o.unknown, 0, "{what}: {o:?}");
    let Some(budget) = fenced else {
        assert_eq!(o.failed, 0, "{what}: {o:?}");
        assert!(stall_ms < 6_000, "{what}: DML stalled {stall_ms} ms");
        return;
    };
    let clients: usize = o.per_target.values().map(|t| t.clients).sum();
    assert!(
        o.failed as usize <= clients,
        "{what}: more than one per client: {o:?}"
    );
    assert!(
        o.failed_by_code.keys().all(|code| code == "20702"),
        "{what}: only the fenced statements' 20702: {:?}",
        o.failed_by_code
    );
    for f in &o.recent_failures {
        assert!(
            (budget.0..budget.0 + 2_000).contains(&f.elapsed_ms),
            "{what}: a fenced statement fails when its retry budget ({} ms) runs out: {f:?}",
            budget.0
        );
    }
    assert!(
        stall_ms < budget.0 + 2_000,
        "{what}: DML stalled {stall_ms} ms"
    );
}

/// Whether `newer`'s CNs move the catalog past `older`'s (or the table cannot tell).
fn catalog_moves(older: &str, newer: &str) -> bool {
    let (o, n) = (
        mo_core::generation::catalog(older),
        mo_core::generation::catalog(newer),
    );
    o.is_none() || n.is_none() || o < n
}

/// A set-back past a newer catalog: the rollout halts and says why (both versions and
/// catalogs, in its condition), the CN prepared for the newer version is taken back, no CN
/// starts on the older version after the halt and nothing is deleted for 30 s.
async fn assert_set_back_refused(
    t: &TestNs,
    instances: &std::collections::BTreeMap<String, (String, String, u64)>,
    deletions: &DeletionLog,
    prepared: &str,
    halted_ms: u64,
) {
    let cluster = t.cluster("mo").await;
    let halted = cluster
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == mo_kube::status::HALTED)
        })
        .map(|c| format!("{}: {}", c.reason, c.message))
        .unwrap_or_default();
    println!("refused: {halted}");
    assert!(halted.starts_with("VersionRefused: "), "{halted}");
    for named in [
        format!("version {} refused", older()),
        newer(),
        "catalog".to_string(),
    ] {
        assert!(halted.contains(&named), "{named}: {halted}");
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    let pods = t.pod_list().await;
    let back: Vec<_> = pods
        .iter()
        .filter(|p| p.name_any().starts_with("mo-tp-") && image_tag(p) == older())
        .filter(|p| created_ms(p) > halted_ms)
        .map(|p| p.name_any())
        .collect();
    assert!(
        back.is_empty(),
        "no CN started on {} after the halt: {back:?}",
        older()
    );
    let after: Vec<_> = deletions
        .snapshot()
        .into_values()
        .filter(|(_, at)| *at > halted_ms)
        .collect();
    assert!(after.is_empty(), "nothing deleted while halted: {after:?}");
    let prepared_ran: Vec<_> = instances
        .values()
        .filter(|(p, tag, _)| p == prepared && *tag == newer())
        .collect();
    assert!(
        prepared_ran.is_empty(),
        "{prepared}, prepared for {} when the version went back, never ran it",
        newer()
    );
}

/// Second thoughts on the real kernel, under DML through the proxy: an upgrade v1.2.3 →
/// v1.2.4 (CNs first) set back to v1.2.3 in its CN phase with a CN prepared, then, in the
/// rollback's CN phase with a CN prepared again, the restarted CN crashed and the rollout
/// halted on its stall.
/// Nothing moves onto the abandoned version after the operator saw the change, the prepared
/// CN is taken back (Working, no drain), nothing is deleted while halted, and no transaction
/// is lost outside the crash the test causes (and a TN restart, had the strategy one).
/// Given two versions whose catalogs differ (`MO_KERNEL_VERSIONS`), the set-back is refused
/// instead, and the test checks that refusal.
#[tokio::test]
async fn a_version_set_back_and_a_halt_with_a_prepared_cn_move_nothing_forward_on_the_real_kernel()
{
    let _serial = one_at_a_time().await;
    use_data_plane(DataPlane::RealKernel);
    let t = TestNs::new("real-mind").await;
    let _operator = t.operator_with_deployed_rbac("op-1");
    let mut spec = real_cluster(&t, &older());
    spec["cn"]["groups"] = serde_json::json!([{"name": "tp", "replicas": 3}]);
    // CNs first (a patch release's components work together): the CN phases are what this
    // test is about, and LOG and TN restarts would only lengthen it.
    spec["upgrade"]["strategy"] =
        serde_json::json!({"cn": [], "log": ["cn"], "tn": ["log"], "proxy": ["tn"]});
    t.create("mo", spec).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    let deletions = DeletionLog::watch(&t).await;
    // Every pod instance seen: uid → (pod, image tag, creation in Unix ms).
    let mut instances = std::collections::BTreeMap::<String, (String, String, u64)>::new();
    let proxy = target(&t, "mo-proxy-0").await;
    let tables = vec!["m1".to_string(), "m2".to_string()];
    mo_sqlload::prepare(&proxy, "mind", &tables, 100)
        .await
        .expect("prepare");
    let mut config = mo_sqlload::WorkloadConfig::new(
        vec![mo_sqlload::TargetLoad {
            target: proxy.clone(),
            clients: 4,
        }],
        "mind",
        tables,
    );
    config.recent_failures = 10_000;
    let workload = mo_sqlload::Workload::start(config).await.expect("workload");
    tokio::time::sleep(Duration::from_secs(5)).await;

    let started = Instant::now();
    t.patch_spec("mo", serde_json::json!({"version": newer()}))
        .await;
    let mut mind = Mind::Forward;
    // (rollout target, phase, first seen in Unix ms)
    let mut phases: Vec<(String, String, u64)> = Vec::new();
    let mut switched_ms = 0;
    let mut killed: Option<(String, u64)> = None;
    let mut prepared_forward = String::new();
    let mut prepared_back = String::new();
    let halted_ms = loop {
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "stuck at {mind:?}: {phases:?}"
        );
        let status = t.cluster("mo").await.status.unwrap_or_default();
        let pods: Vec<Pod> = t
            .pod_list()
            .await
            .into_iter()
            .filter(|p| !p.labels().contains_key(mo_kube::resources::LABEL_PREPULL))
            .collect();
        for p in &pods {
            instances
                .entry(p.uid().unwrap_or_default())
                .or_insert_with(|| (p.name_any(), image_tag(p), created_ms(p)));
        }
        let (target_version, step) = status
            .rollout
            .as_ref()
            .map(|r| (r.target.clone(), r.step.clone()))
            .unwrap_or_default();
        let phase = step
            .strip_prefix("upgrade ")
            .and_then(|s| s.split(':').next())
            .unwrap_or(&step)
            .to_string();
        if phases
            .last()
            .is_none_or(|(v, p, _)| *v != target_version || *p != phase)
        {
            println!(
                "{:>6.1} s: {target_version} {step}",
                started.elapsed().as_secs_f64()
            );
            phases.push((target_version.clone(), phase.clone(), unix_ms_now()));
        }
        match mind {
            Mind::Forward => {
                assert!(!step.starts_with("halted"), "the upgrade stopped: {step}");
                let on_new = pods
                    .iter()
                    .filter(|p| p.name_any().starts_with("mo-tp-") && image_tag(p) == newer())
                    .count();
                if let Some(pod) = prepared_cn(&status, &pods, &newer()).filter(|_| on_new >= 2) {
                    println!("{pod} prepared for {}: the version is set back", newer());
                    prepared_forward = pod;
                    t.patch_spec("mo", serde_json::json!({"version": older()}))
                        .await;
                    mind = Mind::SetBack;
                }
            }
            Mind::SetBack => {
                if target_version == older() {
                    switched_ms = unix_ms_now();
                    mind = if catalog_moves(&older(), &newer()) {
                        Mind::Refused
                    } else {
                        Mind::Back
                    };
                }
            }
            Mind::Refused => {
                if step.starts_with("halted") {
                    break unix_ms_now();
                }
            }
            Mind::Back => {
                assert!(!step.starts_with("halted"), "the rollback stopped: {step}");
                if let Some(pod) = prepared_cn(&status, &pods, &older()).filter(|_| phase == "cn") {
                    // The CN restarted in this phase and still in its window: the one the
                    // prepared CN waits on.
                    let restarted = pods
                        .iter()
                        .find(|p| {
                            p.name_any().starts_with("mo-tp-")
                                && p.name_any() != pod
                                && image_tag(p) == older()
                                && created_ms(p) > switched_ms
                        })
                        .map(|p| p.name_any());
                    if let Some(restarted) = restarted {
                        println!(
                            "{pod} prepared for {}: {restarted} crashes in its window",
                            older()
                        );
                        prepared_back = pod;
                        t.patch_spec(
                            "mo",
                            serde_json::json!({"upgrade": {"stallTimeout": "15s"}}),
                        )
                        .await;
                        let url = format!(
                            "{}/v1/namespaces/{}/pods/{restarted}/kill?signal=KILL&container=main",
                            t.shared.admin, t.ns
                        );
                        let answer = reqwest::Client::new()
                            .post(&url)
                            .send()
                            .await
                            .expect("kill");
                        assert!(answer.status().is_success(), "{}", answer.status());
                        killed = Some((restarted, unix_ms_now()));
                        mind = Mind::Halting;
                    }
                }
            }
            Mind::Halting => {
                if step.starts_with("halted") {
                    break unix_ms_now();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    if mind == Mind::Refused {
        assert_set_back_refused(&t, &instances, &deletions, &prepared_forward, halted_ms).await;
        let end = workload.stop().await;
        println!("refused set-back: {end:?}");
        assert!(end.committed > 0 && end.consistency.as_ref().is_some_and(|c| c.ok));
        return;
    }
    let (crashed, killed_ms) = killed.expect("a CN crashed in the rollback's window");

    // Halted: the prepared CN is taken back and every CN serves; nothing is deleted.
    wait_for(
        "no drain left and every CN Working in HAKeeper",
        Duration::from_secs(120),
        || async {
            let drains = t.cluster("mo").await.status?.drains;
            let cns = hakeeper(&t)
                .await
                .get_cluster_details()
                .await
                .ok()?
                .cn_stores;
            let working = cns.len() == 3
                && cns
                    .iter()
                    .all(|c| c.work_state == mo_rpc::pb::metadata::WorkState::Working as i32);
            (drains.is_empty() && working).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let quiet_from = unix_ms_now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let end = workload.stop().await;
    let deleted = deletions.snapshot();
    let status = t.cluster("mo").await.status.expect("status");
    let step = status.rollout.as_ref().map(|r| r.step.clone());
    assert!(
        step.as_deref().is_some_and(|s| s.starts_with("halted")),
        "still halted: {step:?}"
    );
    let after_halt: Vec<_> = deleted.values().filter(|(_, at)| *at > halted_ms).collect();
    assert!(
        after_halt.is_empty(),
        "nothing deleted while halted: {after_halt:?}"
    );

    // Nothing moved onto the abandoned version once the operator followed the change: an
    // instance on v1.2.4 created after it replaces one whose deletion came before it.
    for (uid, (pod, tag, created)) in &instances {
        if *tag != newer() || *created <= switched_ms {
            continue;
        }
        let asked_before = deleted
            .values()
            .any(|(p, at)| p == pod && *at <= switched_ms);
        assert!(
            asked_before,
            "{pod} ({uid}) was moved onto the abandoned {} after the set-back: {instances:?} {deleted:?}",
            newer()
        );
    }
    let prepared_uids: Vec<&String> = instances
        .iter()
        .filter(|(_, (p, _, _))| *p == prepared_forward)
        .map(|(u, _)| u)
        .collect();
    let prepared_tags: BTreeSet<&str> = instances
        .values()
        .filter(|(p, _, _)| *p == prepared_forward)
        .map(|(_, tag, _)| tag.as_str())
        .collect();
    assert!(
        !prepared_tags.contains(newer().as_str()),
        "{prepared_forward}, prepared for {} when the version went back, never ran it: {prepared_uids:?} {prepared_tags:?}",
        newer()
    );

    // Losses: only the TN's restarts and the crash the test caused (its sessions' open
    // transactions, until the CN is back).
    let mut tn_windows = Vec::new();
    for (i, (_, phase, from)) in phases.iter().enumerate() {
        if phase != "tn" {
            continue;
        }
        let until = phases.get(i + 1).map_or(u64::MAX, |(_, _, at)| *at);
        let deleted_tn = deleted
            .values()
            .filter(|(pod, at)| pod == "mo-tn-0" && *at <= until)
            .map(|(_, at)| *at)
            .filter(|at| at + 60_000 >= *from)
            .min()
            .unwrap_or(*from);
        tn_windows.push(deleted_tn.min(*from)..=until);
    }
    let crash = killed_ms..=killed_ms + 30_000;
    let unexplained: Vec<_> = end
        .recent_failures
        .iter()
        .filter(|f| !matches!(f.outcome, mo_sqlload::FailureOutcome::ConnectError))
        .filter(|f| {
            !crash.contains(&f.unix_ms) && !tn_windows.iter().any(|w| w.contains(&f.unix_ms))
        })
        .collect();
    let lost_in = |window: &dyn Fn(u64) -> bool| {
        end.recent_failures
            .iter()
            .filter(|f| !matches!(f.outcome, mo_sqlload::FailureOutcome::ConnectError))
            .filter(|f| window(f.unix_ms))
            .count()
    };
    let lost_to_tn = lost_in(&|at| tn_windows.iter().any(|w| w.contains(&at)));
    let lost_to_crash =
        lost_in(&|at| crash.contains(&at) && !tn_windows.iter().any(|w| w.contains(&at)));
    let after_quiet = end
        .recent_failures
        .iter()
        .filter(|f| f.unix_ms >= quiet_from)
        .count();
    let figures = serde_json::json!({
        "seconds": started.elapsed().as_secs_f64(),
        "committed": end.committed,
        "failed_by_code": end.failed_by_code,
        "unknown_by_code": end.unknown_by_code,
        "prepared_when_set_back": prepared_forward,
        "prepared_when_halted": prepared_back,
        "crashed": crashed,
        "lost_to_the_tn_restarts": lost_to_tn,
        "lost_to_the_crash": lost_to_crash,
        "phases": phases.iter().map(|(v, p, _)| format!("{v} {p}")).collect::<Vec<_>>(),
    });
    println!("second thoughts: {figures}");
    write_figure("real-change-of-mind.json", &figures);
    assert!(
        unexplained.is_empty(),
        "no transaction lost outside the TN's restarts and the test's crash: {unexplained:#?} \
         (TN {tn_windows:?}, crash {crash:?}) {figures}"
    );
    assert_eq!(after_quiet, 0, "the halted cluster serves: {figures}");
    assert!(
        phases.iter().any(|(v, p, _)| *v == older() && p == "cn"),
        "the set-back is a rollout of its own: {phases:?}"
    );
}
