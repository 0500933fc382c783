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
    let shared = real_plane_dir().join(format!("shared-{}", t.ns));
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
    t.create("mo", real_cluster(&t, "v1.2.4"))
        .await
        .expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    let boot = started.elapsed();
    let pods = t
        .pods()
        .list(&Default::default())
        .await
        .expect("pods")
        .items;
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
    // The version each CN registers (stamped into the kernel's build).
    for cn in &details.cn_stores {
        assert_eq!(cn.commit_id, "v1.2.4", "{}", cn.uuid);
    }
    let cluster = t.cluster("mo").await;
    let bootstrap = cluster
        .status
        .and_then(|s| s.log_bootstrap)
        .expect("the bootstrap decision is recorded");
    assert!(bootstrap.done, "HAKeeper seen serving: {bootstrap:?}");

    // Every LOG pod deleted and recreated in turn: the data is still there.
    let log_restart = Instant::now();
    for i in 0..3 {
        let pod = format!("mo-log-{i}");
        restart_pod(&t, &pod).await;
        t.wait_ready("mo", READY_LIMIT).await;
        let after = mo_sqlload::table_states(&proxy, "e2e", &tables)
            .await
            .expect("SQL after a LOG restart");
        assert_eq!(after, before, "after {pod} restarted");
    }
    let figure = serde_json::json!({
        "boot_to_ready_seconds": boot.as_secs_f64(),
        "three_log_restarts_seconds": log_restart.elapsed().as_secs_f64(),
    });
    println!("real cluster: {figure}");
    write_figure("real-lifecycle.json", &figure);
}
