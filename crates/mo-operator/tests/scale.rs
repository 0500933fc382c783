//! Operator footprint with 50 clusters (`MO_SCALE_CLUSTERS`, e.g. 200) on the test control
//! plane (a measurement, run on demand):
//! `cargo test --profile dist -p mo-operator --test scale -- --ignored --nocapture` (the profile
//! the image ships).
//! Writes `target/figures/operator-<N>-clusters.json`: time to Ready, RSS, reconcile latency in
//! the steady state, and the reaction time from a watch event to the reconcile's actions (over
//! the whole run, and in the steady state when a proxy is taken out of its Service by hand).

mod support;

use kube::ResourceExt;
use std::time::{Duration, Instant};
use support::{TestNs, wait_for};

fn cluster_count() -> usize {
    std::env::var("MO_SCALE_CLUSTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Reconciles the operator has finished so far (its Prometheus counter).
async fn reconciles(operator: &support::Operator) -> u64 {
    let text = operator.try_metrics().await.expect("metrics");
    text.lines()
        .filter(|l| l.starts_with("mo_operator_reconciles_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test]
#[ignore = "measurement: 50 clusters or more, several minutes"]
async fn many_clusters_reach_ready_and_the_operator_footprint_is_measured() {
    let clusters = cluster_count();
    let t = TestNs::new(&format!("scale-{clusters}")).await;
    let operator = t.operator_ticking("op-scale", "1s");
    let start = Instant::now();
    let mut spec = support::small_cluster("v1");
    spec["cn"]["groups"] = serde_json::json!([{"name": "tp", "replicas": 1}]);
    // Pods per cluster, from the spec itself: LOG + TN (1) + CN groups + proxies.
    let per_cluster = spec["log"]["replicas"].as_u64().expect("log replicas")
        + 1
        + spec["cn"]["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .map(|g| g["replicas"].as_u64().expect("replicas"))
            .sum::<u64>()
        + spec["proxy"]["replicas"].as_u64().expect("proxy replicas");
    let pods_expected = per_cluster as usize * clusters;
    for i in 0..clusters {
        t.create(&format!("mo-{i:02}"), spec.clone())
            .await
            .expect("create");
    }
    // Ready as the pods' own condition (written by the data plane's kubelet), not the
    // operator's view of them.
    let pods_ready = wait_for(
        "every MatrixOne pod Ready",
        Duration::from_secs(1200),
        || async {
            let pods = t.pods().list(&Default::default()).await.ok()?;
            let ready = pods
                .items
                .iter()
                .filter(|p| !p.labels().contains_key("ops.matrixorigin.io/prepull"))
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count();
            (ready == pods_expected).then_some(ready)
        },
    )
    .await;
    let pods_ready_after = start.elapsed();
    wait_for("all clusters Ready", Duration::from_secs(1200), || async {
        let list = t.clusters().list(&Default::default()).await.ok()?;
        let ready = list
            .items
            .iter()
            .filter(|c| {
                c.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                })
            })
            .count();
        (ready == clusters).then_some(())
    })
    .await;
    let all_ready = start.elapsed();
    // Steady state: nothing changes; every calm cluster is observed every idle tick.
    let mut peak = 0;
    let steady = Instant::now();
    let before = reconciles(&operator).await;
    while steady.elapsed() < Duration::from_secs(60) {
        peak = peak.max(rss_kib(operator.pid()));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let steady_samples = (reconciles(&operator).await - before) as usize;
    let whole_run = operator.latency().await;
    // The samples of the steady minute only (the endpoint keeps the newest 20,000).
    let latency = operator.latency_of_newest(steady_samples.min(20_000)).await;
    let reaction = operator.reaction_latency().await;
    // Reaction in the steady state: one proxy per cluster is taken out of its Service by hand
    // (its serving label), 100 ms apart; each wakes its cluster, whose next action puts the
    // proxy back.
    let reactions_before = reaction["samples"].as_u64().unwrap_or(0);
    let label = "ops.matrixorigin.io/serving";
    for i in 0..clusters {
        let patch = serde_json::json!({"metadata": {"labels": {label: "false"}}});
        t.pods()
            .patch(
                &format!("mo-{i:02}-proxy-0"),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .expect("take a proxy out by hand");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for(
        "every proxy put back into its Service",
        Duration::from_secs(120),
        || async {
            let pods = t.pods().list(&Default::default()).await.ok()?;
            let out = pods
                .items
                .iter()
                .filter(|p| p.labels().get(label).map(String::as_str) == Some("false"))
                .count();
            (out == 0).then_some(())
        },
    )
    .await;
    let reacted = operator.reaction_latency().await["samples"]
        .as_u64()
        .unwrap_or(0)
        - reactions_before;
    let reaction_steady = operator.reaction_latency_of_newest(reacted as usize).await;
    let figures = serde_json::json!({
        "clusters": clusters,
        "pods_ready": pods_ready,
        "pods_ready_seconds": pods_ready_after.as_secs_f64(),
        "clusters_ready_seconds": all_ready.as_secs_f64(),
        "operator_rss_mib_now": rss_kib(operator.pid()) as f64 / 1024.0,
        "operator_rss_mib_peak_steady": peak as f64 / 1024.0,
        "reconcile_latency_steady": latency,
        "reconcile_latency_whole_run": whole_run,
        "reconciles_before_the_steady_minute": before,
        "reconciles_in_the_steady_minute": steady_samples,
        "reaction_latency_whole_run": reaction,
        "reaction_latency_steady_proxy_put_back": reaction_steady,
    });
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../figures");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join(format!("operator-{clusters}-clusters.json")),
        serde_json::to_string_pretty(&figures).expect("json"),
    )
    .expect("write figures");
    println!("{}", serde_json::to_string_pretty(&figures).expect("json"));
    // Every cluster was observed several times in the steady minute (the idle tick is 5 s).
    assert!(
        steady_samples >= clusters * 6,
        "{steady_samples} reconciles"
    );
    // Pods turning Ready woke their clusters (the watches work).
    assert!(reaction["samples"].as_u64().unwrap_or(0) >= clusters as u64);
    assert!(
        reacted >= clusters as u64,
        "each proxy taken out woke its cluster"
    );
}
