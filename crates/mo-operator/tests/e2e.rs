//! End to end on a real kube-apiserver + kube-controller-manager with the simulated MatrixOne
//! data plane: the operator process is the one users deploy.

mod support;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use support::{TestNs, assert_no_harm, small_cluster, wait_for};

const READY_LIMIT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn a_bad_spec_is_refused_by_the_api_server_naming_the_field() {
    let t = TestNs::new("e2e-bad-spec").await;
    let mut spec = small_cluster("v1");
    spec["log"]["replicas"] = 4.into();
    let err = t.create("even", spec).await.expect_err("refused");
    assert!(
        err.to_string().contains("spec.log.replicas must be odd"),
        "{err}"
    );

    let mut spec = small_cluster("v1");
    spec["upgrade"]["strategy"] = serde_json::json!({"cn": ["cn"]});
    let err = t.create("selfwait", spec).await.expect_err("refused");
    assert!(err.to_string().contains("spec.upgrade.strategy"), "{err}");

    let mut spec = small_cluster("v1");
    spec["upgrade"]["stallTimeout"] = "1s".into();
    let err = t.create("stall", spec).await.expect_err("refused");
    assert!(
        err.to_string().contains("stallTimeout must be longer"),
        "{err}"
    );

    let mut spec = small_cluster("v1");
    spec["cn"]["groups"] = serde_json::json!([{"name": "log", "replicas": 1}]);
    let err = t.create("clash", spec).await.expect_err("refused");
    assert!(err.to_string().contains("spec.cn.groups[].name"), "{err}");

    let mut spec = small_cluster("v1");
    spec["upgrade"]["stabilityWindow"] = "soon".into();
    let err = t.create("words", spec).await.expect_err("refused");
    assert!(err.to_string().contains("stabilityWindow"), "{err}");

    // Immutable after creation.
    t.create("fixed", small_cluster("v1"))
        .await
        .expect("valid spec");
    let err = t
        .clusters()
        .patch(
            "fixed",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"log": {"shards": 2}}})),
        )
        .await
        .expect_err("shards are immutable");
    assert!(
        err.to_string().contains("spec.log.shards is immutable"),
        "{err}"
    );
}

#[tokio::test]
async fn owned_objects_changed_or_deleted_by_hand_are_restored_at_once() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use kube::api::{Patch, PatchParams};
    let t = TestNs::new("e2e-drift").await;
    let _operator = t.operator("op-a");
    t.create("mo", small_cluster("v1")).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    let sets: Api<StatefulSet> = Api::namespaced(t.client.clone(), &t.ns);
    let services: Api<Service> = Api::namespaced(t.client.clone(), &t.ns);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(t.client.clone(), &t.ns);
    let image = |s: &StatefulSet| {
        s.spec
            .template
            .spec
            .as_ref()
            .and_then(|p| p.containers[0].image.clone())
    };
    let log_set = sets.get("mo-log").await.expect("log set");
    let original = image(&log_set);
    assert!(original.is_some());
    let container = log_set
        .spec
        .template
        .spec
        .as_ref()
        .map(|p| p.containers[0].name.clone())
        .expect("container");
    let cn_budget = pdbs.get("mo-cn").await.expect("cn budget");
    // Someone edits the LOG set's image and deletes the SQL Service and the CN budget: a
    // calm cluster, with the periodic re-apply minutes away.
    let tamper = serde_json::json!({"spec": {"template": {"spec": {"containers": [
        {"name": container, "image": "tampered:1"}
    ]}}}});
    sets.patch(
        "mo-log",
        &PatchParams::default(),
        &Patch::Strategic(&tamper),
    )
    .await
    .expect("tamper");
    assert_eq!(
        image(&sets.get("mo-log").await.expect("log set")).as_deref(),
        Some("tampered:1")
    );
    services
        .delete("mo-sql", &Default::default())
        .await
        .expect("delete service");
    pdbs.delete("mo-cn", &Default::default())
        .await
        .expect("delete budget");
    let started = std::time::Instant::now();
    wait_for(
        "every owned object restored",
        Duration::from_secs(30),
        || async {
            let set = sets.get("mo-log").await.ok()?;
            let service = services.get_opt("mo-sql").await.ok()??;
            let budget = pdbs.get_opt("mo-cn").await.ok()??;
            (image(&set) == original
                && service.metadata.uid.is_some()
                && budget.spec == cn_budget.spec)
                .then_some(())
        },
    )
    .await;
    println!("restored in {:.1} s", started.elapsed().as_secs_f64());
}

#[tokio::test]
async fn a_cluster_becomes_ready_scales_out_and_in_through_the_drain_arbiter_and_is_cleaned_up() {
    let t = TestNs::new("e2e-lifecycle").await;
    // Installed from the Helm chart: its RBAC, ServiceAccount and the Deployment's arguments.
    let _operator = t.operator_from_chart("op-a");
    t.create("mo", small_cluster("v1")).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    assert_eq!(
        t.pod_names().await,
        [
            "mo-log-0",
            "mo-log-1",
            "mo-log-2",
            "mo-proxy-0",
            "mo-tn-0",
            "mo-tp-0",
            "mo-tp-1"
        ]
    );
    let cluster = t.cluster("mo").await;
    let status = cluster.status.expect("status");
    assert_eq!(status.observed_generation, cluster.metadata.generation);
    assert_eq!(status.components["cn"].ready, 2);
    assert_eq!(status.components["log"].versions["v1"], 3);
    // Clients that honour only PDBs or autoscaler hints are stopped too.
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(t.client.clone(), &t.ns);
    let budget = |name: &'static str| {
        let pdbs = pdbs.clone();
        async move {
            // What the disruption controller allows now: the budget as evictors see it.
            let pdb = pdbs.get_opt(name).await.ok()??;
            let status = pdb.status?;
            (status.observed_generation == pdb.metadata.generation)
                .then_some(status.disruptions_allowed.unwrap_or(0))
        }
    };
    wait_for(
        "LOG budget of one when every shard keeps a majority",
        READY_LIMIT,
        || async { (budget("mo-log").await? == 1).then_some(()) },
    )
    .await;
    for (pdb, why) in [
        ("mo-tn", "the TN has no standby"),
        ("mo-cn", "no CN drain confirmed"),
        ("mo-proxy", "a single proxy"),
    ] {
        wait_for(why, READY_LIMIT, || async {
            (budget(pdb).await? == 0).then_some(())
        })
        .await;
    }
    wait_for("CN pods pinned for autoscalers", READY_LIMIT, || async {
        let pod = t.pods().get("mo-tp-0").await.ok()?;
        let a = pod.metadata.annotations?;
        (a.get("karpenter.sh/do-not-disrupt").map(String::as_str) == Some("true")
            && a.get("cluster-autoscaler.kubernetes.io/safe-to-evict")
                .map(String::as_str)
                == Some("false"))
        .then_some(())
    })
    .await;
    // `mo-operator status`: budgets and hints per pod, in full.
    let status = operator_status(&t, "mo");
    for needle in [
        "Ready        True   AllComponentsReady",
        "mo-cn ",
        "disruptions allowed 0",
        // Creation is the first rollout; done, it waits on nothing.
        "step    complete\n  waiting on nothing",
        "Drains\n  none",
    ] {
        assert!(status.contains(needle), "`{needle}` in:\n{status}");
    }
    for pod in ["mo-log-0", "mo-tn-0", "mo-tp-0", "mo-tp-1", "mo-proxy-0"] {
        let row = status
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{pod} ")))
            .unwrap_or_else(|| panic!("{pod} row in:\n{status}"));
        assert!(row.contains(" yes "), "{pod} ready: {row}");
    }
    let cn_row = status
        .lines()
        .find(|l| l.trim_start().starts_with("mo-tp-0 "))
        .expect("row");
    assert!(
        cn_row.contains("do-not-disrupt"),
        "a CN is pinned for autoscalers: {cn_row}"
    );
    // Printer columns.
    let out = t.kubectl(&["get", "moc", "-n", &t.ns]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("VERSION") && table.contains("WAITING-ON"),
        "{table}"
    );

    // The simulated kernel the operator just managed answers MatrixOne's own client.
    the_kernels_own_client_reads_the_simulated_kernel(&t).await;

    // Scale out: a new CN registers and serves.
    t.patch_spec(
        "mo",
        serde_json::json!({"cn": {"groups": [{"name": "tp", "replicas": 3}]}}),
    )
    .await;
    wait_for("mo-tp-2 registered and ready", READY_LIMIT, || async {
        let c = t.cluster("mo").await;
        let s = c.status?;
        (s.components["cn"].ready == 3
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"))
        .then_some(())
    })
    .await;
    let old_uid = t.pods().get("mo-tp-2").await.expect("pod").uid();

    // Scale in: the pod leaves only after the drain of that instance is confirmed.
    t.patch_spec(
        "mo",
        serde_json::json!({"cn": {"groups": [{"name": "tp", "replicas": 2}]}}),
    )
    .await;
    let mut stages = BTreeSet::new();
    let mut drain_shown = false;
    let start = std::time::Instant::now();
    loop {
        if let Some(s) = t.cluster("mo").await.status {
            for d in s.drains.iter().filter(|d| d.pod == "mo-tp-2") {
                assert_eq!(Some(&d.pod_uid), old_uid.as_ref(), "bound to the instance");
                stages.insert(d.stage.clone());
            }
            if !drain_shown && s.drains.iter().any(|d| d.pod == "mo-tp-2") {
                // The drain, its instance and what it waits on, as `status` shows them.
                let status = operator_status(&t, "mo");
                if let Some(line) = status
                    .lines()
                    .find(|l| l.trim_start().starts_with("mo-tp-2 (pod uid"))
                {
                    assert!(
                        line.contains(old_uid.as_deref().expect("uid")) && line.contains("stage "),
                        "{line}"
                    );
                    assert!(status.contains("waiting on: "), "{status}");
                    drain_shown = true;
                }
            }
        }
        if t.pods().get_opt("mo-tp-2").await.expect("get").is_none() {
            break;
        }
        assert!(
            start.elapsed() < READY_LIMIT,
            "mo-tp-2 not removed; stages {stages:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        stages.contains("HandOver") || stages.contains("Confirmed"),
        "the removal went through the arbiter: {stages:?}"
    );
    assert!(drain_shown, "`mo-operator status` showed the drain");
    t.wait_ready("mo", READY_LIMIT).await;
    let events = t.kubectl(&["get", "events", "-n", &t.ns, "-o", "json"]);
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(
        events.contains("DrainConfirmed"),
        "event for the confirmation"
    );
    let report = t.report("mo").await;
    assert_no_harm(&report);

    // Delete: the finalizer runs, the garbage collector removes what the cluster owned.
    t.clusters()
        .delete("mo", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("everything owned is gone", READY_LIMIT, || async {
        let gone_cluster = t.clusters().get_opt("mo").await.ok()?.is_none();
        let sts: Api<StatefulSet> = Api::namespaced(t.client.clone(), &t.ns);
        let svc: Api<Service> = Api::namespaced(t.client.clone(), &t.ns);
        let cms: Api<ConfigMap> = Api::namespaced(t.client.clone(), &t.ns);
        let lp = ListParams::default().labels("ops.matrixorigin.io/cluster=mo");
        let left = sts.list(&lp).await.ok()?.items.len()
            + svc.list(&lp).await.ok()?.items.len()
            + cms.list(&lp).await.ok()?.items.len()
            + t.pods().list(&lp).await.ok()?.items.len();
        (gone_cluster && left == 0).then_some(())
    })
    .await;
}

/// `mo-operator status <cluster> -n <ns>` against the test control plane.
fn operator_status(t: &TestNs, cluster: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mo-operator"))
        .args(["status", cluster, "-n", &t.ns])
        .env("KUBECONFIG", t.kubeconfig())
        .output()
        .expect("mo-operator status runs");
    assert!(
        out.status.success(),
        "mo-operator status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Pod name → every UID seen for it, while `until` has not happened.
async fn watch_uids(t: &TestNs, seen: &mut BTreeMap<String, BTreeSet<String>>) {
    if let Ok(list) = t.pods().list(&ListParams::default()).await {
        for p in list.items {
            if p.labels().contains_key("ops.matrixorigin.io/prepull") {
                continue;
            }
            seen.entry(p.name_any())
                .or_default()
                .insert(p.uid().unwrap_or_default());
        }
    }
}

#[tokio::test]
async fn an_upgrade_survives_operator_kills_and_restarts_each_pod_exactly_once() {
    let t = TestNs::new("e2e-upgrade").await;
    let mut operator = t.operator_with_deployed_rbac("op-1");
    t.create("mo", small_cluster("v1")).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    let mut uids = BTreeMap::new();
    watch_uids(&t, &mut uids).await;

    // The CN phase cannot pass its first hand-over until the fault is lifted, so the second
    // kill lands in it whatever the polling rhythm.
    t.fault("mo", serde_json::json!({"handover_never_confirms": true}))
        .await;
    t.patch_spec("mo", serde_json::json!({"version": "v2"}))
        .await;
    // Kill the operator in the LOG phase, once a LOG pod has been restarted.
    let mut kills = 0;
    let mut killed_at_steps = Vec::new();
    let mut generation = 1;
    let limit = Duration::from_secs(600);
    let start = std::time::Instant::now();
    loop {
        watch_uids(&t, &mut uids).await;
        let c = t.cluster("mo").await;
        // Until the operator saw the new version, the status still shows the finished v1 rollout.
        let step = c
            .status
            .as_ref()
            .and_then(|s| s.rollout.as_ref())
            .filter(|r| r.target == "v2")
            .map(|r| r.step.clone())
            .unwrap_or_default();
        if step == "complete" {
            break;
        }
        let log_restarted = uids
            .iter()
            .any(|(n, u)| n.starts_with("mo-log") && u.len() > 1);
        let cn_restarting = step.contains("upgrade cn");
        if (kills == 0 && log_restarted) || (kills == 1 && cn_restarting) {
            operator.kill();
            kills += 1;
            killed_at_steps.push(step.clone());
            generation += 1;
            // The new replica must wait out the old lease, then resume from the record.
            operator = t.operator_with_deployed_rbac(&format!("op-{generation}"));
            if kills == 2 {
                t.fault("mo", serde_json::json!({"handover_never_confirms": false}))
                    .await;
            }
        }
        assert!(
            start.elapsed() < limit,
            "upgrade did not finish; at step {step}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        killed_at_steps.first().is_some_and(|s| s.contains("log"))
            && killed_at_steps.get(1).is_some_and(|s| s.contains("cn")),
        "killed in the LOG phase, then in the CN phase: {killed_at_steps:?}"
    );
    assert_eq!(
        kills, 2,
        "the operator was killed in the LOG and in the CN phase"
    );
    t.wait_ready("mo", READY_LIMIT).await;
    watch_uids(&t, &mut uids).await;
    for (pod, seen) in &uids {
        assert_eq!(seen.len(), 2, "{pod} restarted exactly once: {seen:?}");
    }
    let images: Vec<(String, String)> = t
        .pods()
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
        .iter()
        .map(|p| {
            let image = p.spec.as_ref().and_then(|s| s.containers[0].image.clone());
            (p.name_any(), image.unwrap_or_default())
        })
        .collect();
    for (pod, image) in &images {
        assert!(
            image.ends_with(":v2"),
            "{pod} runs {image}; all: {images:?}"
        );
    }
    let status = t.cluster("mo").await.status.expect("status");
    assert_eq!(status.rollout.expect("rollout").step, "complete");
    let report = t.report("mo").await;
    assert_no_harm(&report);
}

/// What two operator replicas were seen doing, sampled every 100 ms for the whole test: both
/// `/metrics` endpoints and the Lease in the API server.
#[derive(Default, Debug)]
struct LeadershipSamples {
    samples: u64,
    /// Samples in which both replicas reported `mo_operator_leader 1`.
    both_lead: u64,
    /// Samples before the kill in which the standby had reconciled anything.
    standby_reconciled_before_kill: u64,
    /// Lease holders in the order seen.
    holders: Vec<String>,
}

fn leads(metrics: &str) -> bool {
    metrics.lines().any(|l| l.trim() == "mo_operator_leader 1")
}

/// Samples until `stop` is set; `killed` marks the moment the first replica was killed.
fn sample_leadership(
    t: &TestNs,
    ports: [u16; 2],
    killed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<LeadershipSamples> {
    use std::sync::atomic::Ordering;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(t.client.clone(), &t.ns);
    tokio::spawn(async move {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("http client");
        let mut seen = LeadershipSamples::default();
        while !stop.load(Ordering::SeqCst) {
            let was_killed = killed.load(Ordering::SeqCst);
            let mut texts = Vec::new();
            for port in ports {
                let text = match http
                    .get(format!("http://127.0.0.1:{port}/metrics"))
                    .send()
                    .await
                {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(_) => String::new(), // a killed replica answers nothing
                };
                texts.push(text);
            }
            seen.samples += 1;
            if texts.iter().filter(|m| leads(m)).count() > 1 {
                seen.both_lead += 1;
            }
            if !was_killed && texts[1].contains("mo_operator_reconciles_total") {
                seen.standby_reconciled_before_kill += 1;
            }
            if let Ok(Some(lease)) = leases.get_opt("mo-operator-leader").await
                && let Some(holder) = lease.spec.and_then(|s| s.holder_identity)
                && seen.holders.last() != Some(&holder)
            {
                seen.holders.push(holder);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        seen
    })
}

/// Events the API server holds for `pod`, with the replica that reported each.
fn events_about(t: &TestNs, pod: &str) -> Vec<(String, String)> {
    let out = t.kubectl(&["get", "events", "-n", &t.ns, "-o", "json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("events json");
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.contains(pod)))
        .map(|e| {
            (
                e["reportingInstance"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                e["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_drain_resumes_after_an_operator_restart_and_two_replicas_never_act_together() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let t = TestNs::new("e2e-drain-restart").await;
    let mut a = t.operator("op-a");
    // op-a takes the lease before op-b starts.
    wait_for("op-a leads", READY_LIMIT, || async {
        leads(&a.try_metrics().await?).then_some(())
    })
    .await;
    let mut b = t.operator("op-b");
    let killed = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_leadership(
        &t,
        [a.metrics_port, b.metrics_port],
        killed.clone(),
        stop.clone(),
    );
    let mut spec = small_cluster("v1");
    spec["cn"]["groups"] = serde_json::json!([{"name": "tp", "replicas": 3}]);
    t.create("mo", spec).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;

    // The drain cannot finish while the kernel withholds the confirmation: the leader is
    // killed in the middle of it, deterministically.
    t.fault("mo", serde_json::json!({"handover_never_confirms": true}))
        .await;
    let victim = t
        .pods()
        .get("mo-tp-2")
        .await
        .expect("pod")
        .uid()
        .expect("uid");
    t.patch_spec(
        "mo",
        serde_json::json!({"cn": {"groups": [{"name": "tp", "replicas": 2}]}}),
    )
    .await;
    wait_for("op-a hands mo-tp-2 over", READY_LIMIT, || async {
        let s = t.cluster("mo").await.status?;
        s.drains
            .iter()
            .any(|d| d.pod == "mo-tp-2" && d.pod_uid == victim && d.stage == "HandOver")
            .then_some(())
    })
    .await;
    killed.store(true, Ordering::SeqCst);
    a.kill();
    // op-b takes over the drain it finds in the record: the same instance, still waiting.
    wait_for("op-b leads", READY_LIMIT, || async {
        leads(&b.try_metrics().await?).then_some(())
    })
    .await;
    assert!(
        t.pods().get("mo-tp-2").await.expect("pod").uid().as_deref() == Some(victim.as_str()),
        "nothing released the victim while the kernel withheld the confirmation"
    );
    t.fault("mo", serde_json::json!({"handover_never_confirms": false}))
        .await;
    wait_for("mo-tp-2 removed by the new leader", READY_LIMIT, || async {
        t.pods()
            .get_opt("mo-tp-2")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(b.alive());
    t.wait_ready("mo", READY_LIMIT).await;
    stop.store(true, Ordering::SeqCst);
    let seen = sampler.await.expect("sampler");
    assert!(seen.samples > 20, "sampled throughout: {seen:?}");
    assert_eq!(seen.both_lead, 0, "two replicas led at once: {seen:?}");
    assert_eq!(
        seen.standby_reconciled_before_kill, 0,
        "the standby reconciled while op-a led: {seen:?}"
    );
    assert_eq!(
        seen.holders,
        ["op-a", "op-b"],
        "the lease went from op-a to op-b once: {seen:?}"
    );
    // The API server's record: the deletion of exactly that instance, by the new leader.
    let events = events_about(&t, "mo-tp-2");
    let deletions: Vec<&(String, String)> = events
        .iter()
        .filter(|(_, m)| m.starts_with("deleting pod mo-tp-2"))
        .collect();
    assert!(
        !deletions.is_empty()
            && deletions
                .iter()
                .all(|(by, m)| by == "op-b" && m.contains(&format!("(uid {victim})"))),
        "{events:?}"
    );
    assert!(
        events.iter().all(|(by, _)| by == "op-a" || by == "op-b"),
        "{events:?}"
    );
    let report = t.report("mo").await;
    assert_no_harm(&report);
    drop(b);
}

/// `morpc-interop call` (MatrixOne v1.2.4's own morpc client and message types) against the
/// simulated kernel's RPC, at the pod addresses the operator itself uses: every HAKeeper,
/// lock allocator and query service method the operator's client has.
async fn the_kernels_own_client_reads_the_simulated_kernel(t: &TestNs) {
    let bin = mo_testenv::morpc_interop().expect("morpc-interop (needs Go)");
    let call = |address: String, service: &'static str, request: serde_json::Value| {
        let bin = bin.clone();
        async move {
            let out = tokio::process::Command::new(&bin)
                .args([
                    "call",
                    "--address",
                    &address,
                    "--service",
                    service,
                    "--timeout",
                    "5s",
                ])
                .arg("--request")
                .arg(request.to_string())
                .output()
                .await
                .expect("run morpc-interop call");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{service} {request}: {stdout}");
            let answer: serde_json::Value =
                serde_json::from_str(stdout.trim()).expect("JSON answer");
            answer
        }
    };
    let ip = |pod: &'static str| async move {
        t.pod(pod)
            .await
            .and_then(|p| p.status?.pod_ip)
            .unwrap_or_else(|| panic!("{pod} has an IP"))
    };
    let log = format!("{}:32001", ip("mo-log-1").await);
    let tn_ip = ip("mo-tn-0").await;
    let cn_ip = ip("mo-tp-0").await;
    let cn = mo_core::component::cn_uuid("mo-tp-0");

    let r = call(log.clone(), "logservice", serde_json::json!({"Method": 10})).await;
    assert_eq!(r["response"]["IsHAKeeper"], true, "{r}");
    let r = call(log.clone(), "logservice", serde_json::json!({"Method": 11})).await;
    let details = &r["response"]["ClusterDetails"];
    let cns = details["CNStores"].as_array().expect("CN stores");
    assert_eq!(cns.len(), 2, "{details}");
    let tp0 = cns
        .iter()
        .find(|c| c["UUID"] == cn.as_str())
        .expect("mo-tp-0 registered");
    assert_eq!(tp0["QueryAddress"], format!("{cn_ip}:19998"));
    assert_eq!(
        details["TNStores"][0]["LockServiceAddress"],
        format!("{tn_ip}:22002")
    );
    let r = call(
        log.clone(),
        "logservice",
        serde_json::json!({"Method": 12, "LogRequest": {"ShardID": 0}}),
    )
    .await;
    assert_eq!(
        r["response"]["ShardInfo"]["Replicas"]
            .as_object()
            .map(|m| m.len()),
        Some(3),
        "{r}"
    );
    let r = call(log.clone(), "logservice", serde_json::json!({"Method": 14})).await;
    let state = &r["response"]["CheckerState"];
    assert_eq!(
        state["CNState"]["Stores"][&cn]["WorkState"], 1,
        "Working: {state}"
    );
    assert!(
        state["LogState"]["Shards"]
            .as_object()
            .is_some_and(|s| !s.is_empty())
    );
    // Calls that change nothing: an unknown CN is "does not exist" (deleting it is a no-op).
    for request in [
        serde_json::json!({"Method": 16, "CNWorkState": {"UUID": "cn-nobody", "State": 2}}),
        serde_json::json!({"Method": 17, "CNStateLabel": {"UUID": "cn-nobody", "State": 2}}),
        serde_json::json!({"Method": 15, "CNStoreLabel": {"UUID": "cn-nobody"}}),
    ] {
        let r = call(log.clone(), "logservice", request.clone()).await;
        assert_eq!(r["response"]["ErrorCode"], 20101, "{request}: {r}");
        assert_eq!(
            r["response"]["ErrorMessage"],
            "internal error: CN [cn-nobody] does not exist"
        );
    }
    let r = call(
        log.clone(),
        "logservice",
        serde_json::json!({"Method": 15, "CNStoreLabel": {"UUID": cn}}),
    )
    .await;
    assert!(r["response"].get("ErrorCode").is_none(), "{r}");
    let r = call(
        log.clone(),
        "logservice",
        serde_json::json!({"Method": 18, "DeleteCNStore": {"StoreID": "cn-nobody"}}),
    )
    .await;
    assert!(r["response"].get("ErrorCode").is_none(), "{r}");
    let r = call(log.clone(), "logservice", serde_json::json!({"Method": 26})).await;
    assert!(
        r["response"].get("ErrorCode").is_none(),
        "CHECK_HEALTH: {r}"
    );

    let tn = format!("{tn_ip}:22002");
    let r = call(
        tn.clone(),
        "lock",
        serde_json::json!({"Method": 14, "CanRestartService": {"ServiceID": cn}}),
    )
    .await;
    // Not restarting: the kernel's "cannot restart" and -1.
    assert!(
        r["response"]["CanRestartService"].get("OK").is_none(),
        "{r}"
    );
    let r = call(
        tn.clone(),
        "lock",
        serde_json::json!({"Method": 13, "RemainTxnInService": {"ServiceID": cn}}),
    )
    .await;
    assert_eq!(r["response"]["RemainTxnInService"]["RemainTxn"], -1, "{r}");
    let r = call(
        tn.clone(),
        "lock",
        serde_json::json!({"Method": 12, "SetRestartService": {"ServiceID": "cn-nobody"}}),
    )
    .await;
    assert_eq!(r["response"]["SetRestartService"]["OK"], true, "{r}");

    let query = format!("{cn_ip}:19998");
    let r = call(
        query.clone(),
        "query",
        serde_json::json!({"CmdMethod": 1, "ShowProcessListRequest": {"SysTenant": true}}),
    )
    .await;
    assert!(r.get("moerr").is_none(), "{r}");
    let sessions = r["response"]["ShowProcessListResponse"]["Sessions"]
        .as_array()
        .map_or(0, Vec::len);
    assert!(sessions > 0, "a tp CN serves client sessions: {r}");
    let r = call(
        query.clone(),
        "query",
        serde_json::json!({"CmdMethod": 19, "GetPipelineInfoRequest": {}}),
    )
    .await;
    assert!(
        r.get("moerr").is_none() && r["response"].get("GetPipelineInfoResponse").is_some(),
        "{r}"
    );
    let r = call(
        query,
        "query",
        serde_json::json!({"CmdMethod": 24, "GetReplicaCount": {}}),
    )
    .await;
    assert!(
        r.get("moerr").is_none() && r["response"].get("GetReplicaCount").is_some(),
        "{r}"
    );
}

/// When `identity` logged `message` first (Unix seconds), if it did.
fn logged_at(t: &TestNs, identity: &str, message: &str) -> Option<f64> {
    t.operator_log(identity)
        .into_iter()
        .find(|(_, m)| m.contains(message))
        .map(|(at, _)| at)
}

/// The leader's API connection freezes (a partition: no byte passes, no error comes back). It
/// must stop acting before the standby can take the lease over, on its own clock, however long
/// its renewal hangs; the standby then repairs what changed meanwhile.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_stops_acting_before_the_standby_starts() {
    let t = TestNs::new("e2e-lease-freeze").await;
    let server = t
        .shared
        .plane
        .server()
        .trim_start_matches("https://")
        .to_string();
    let proxy = support::FreezableProxy::start(&server).await;
    let mut a = t.operator_via("op-a", &format!("https://{}", proxy.address), "4s");
    wait_for("op-a leads", READY_LIMIT, || async {
        leads(&a.try_metrics().await?).then_some(())
    })
    .await;
    let b = t.operator("op-b");
    t.create("mo", small_cluster("v1")).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;

    proxy.freeze();
    let frozen_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    // Something only a leader repairs: it waits for the standby.
    let services: Api<Service> = Api::namespaced(t.client.clone(), &t.ns);
    services
        .delete("mo-sql", &DeleteParams::default())
        .await
        .expect("delete the SQL Service");
    wait_for("op-b leads", READY_LIMIT, || async {
        leads(&b.try_metrics().await?).then_some(())
    })
    .await;
    wait_for("op-b restores the SQL Service", READY_LIMIT, || async {
        services.get_opt("mo-sql").await.ok()?.map(|_| ())
    })
    .await;
    let gone = std::time::Instant::now();
    while a.alive() {
        assert!(
            gone.elapsed() < Duration::from_secs(30),
            "op-a never stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stopped =
        logged_at(&t, "op-a", "stopped leading").expect("op-a says when it stopped leading");
    let took_over = logged_at(&t, "op-b", "acquired the leader lease")
        .expect("op-b says when it took the lease");
    eprintln!(
        "timeline from the freeze: op-a stopped leading at +{:.2} s, op-b acquired the lease at +{:.2} s",
        stopped - frozen_at,
        took_over - frozen_at
    );
    assert!(
        stopped < took_over,
        "op-a stopped at {stopped}, op-b took over at {took_over}: they overlapped"
    );
    assert!(
        t.operator_log("op-a")
            .iter()
            .all(|(at, m)| *at <= stopped || !m.contains("carried out")),
        "op-a carried an action out after it stopped leading"
    );
    drop(proxy);
}

/// A leader told to stop (SIGTERM, as Kubernetes does) closes its fence and releases the lease:
/// the standby leads within one look, not after the lease's whole duration.
#[tokio::test]
async fn a_leader_stopped_by_sigterm_releases_the_lease_at_once() {
    let t = TestNs::new("e2e-lease-release").await;
    let server = t.shared.plane.server().to_string();
    let a = t.operator_via("op-a", &server, "12s");
    wait_for("op-a leads", READY_LIMIT, || async {
        leads(&a.try_metrics().await?).then_some(())
    })
    .await;
    let b = t.operator_via("op-b", &server, "12s");
    // op-b has seen the lease held.
    wait_for("op-b stands by", READY_LIMIT, || async {
        logged_at(&t, "op-b", "standing by").map(|_| ())
    })
    .await;
    let sent = std::time::Instant::now();
    let out = std::process::Command::new("kill")
        .args(["-TERM", &a.pid().to_string()])
        .output()
        .expect("kill runs");
    assert!(out.status.success());
    wait_for("op-b leads", READY_LIMIT, || async {
        leads(&b.try_metrics().await?).then_some(())
    })
    .await;
    let took = sent.elapsed();
    eprintln!(
        "op-b led {:.2} s after op-a's SIGTERM (lease 12 s)",
        took.as_secs_f64()
    );
    assert!(
        took < Duration::from_secs(6),
        "op-b waited {took:?}: the lease was not released"
    );
    assert!(
        logged_at(&t, "op-a", "leader lease released").is_some(),
        "op-a released the lease"
    );
}

/// A TN pod and a CN pod their kubelet ended for good (evicted under node pressure: phase
/// `Failed`) are replaced, with the delete webhook on and the controllers acting as their own
/// ServiceAccounts: the TN's by its StatefulSet, the CN's by the operator. Nothing runs in a
/// terminal pod, so there is nothing to drain or protect; the cluster is Ready again.
#[tokio::test]
async fn pods_their_kubelet_failed_are_replaced_and_the_cluster_recovers() {
    let t = TestNs::new("e2e-failed-pods").await;
    let _op = t.operator_with_deployed_rbac("op");
    t.create("mo", small_cluster("v1")).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    for pod in ["mo-tn-0", "mo-tp-1"] {
        let before = t.pod(pod).await.and_then(|p| p.uid()).expect("pod uid");
        t.fail_pod(pod).await;
        wait_for(
            &format!("{pod} replaced and Ready"),
            READY_LIMIT,
            || async {
                let now = t.pod(pod).await?;
                let ready = now
                    .status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                (now.uid()? != before && ready).then_some(())
            },
        )
        .await;
        t.wait_ready("mo", READY_LIMIT).await;
    }
    let events = events_about(&t, "mo-tp-1");
    assert!(
        events.iter().any(|(_, m)| m.contains("terminal (Failed)")),
        "the operator said why it deleted mo-tp-1: {events:?}"
    );
}

/// A token the API server issues for `audience`, bound to pod `pod` (as a kubelet asks).
async fn pod_token(t: &TestNs, pod: &str, audience: &str) -> String {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::ServiceAccount;
    let uid = t.pod(pod).await.and_then(|p| p.uid()).expect("pod uid");
    let api: Api<ServiceAccount> = Api::namespaced(t.client.clone(), &t.ns);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience.to_string()]),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                uid: Some(uid),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    api.create_token_request("default", &Default::default(), &request)
        .await
        .expect("token request")
        .status
        .and_then(|s| s.token)
        .expect("a token")
}

/// Only a CN pod itself may ask the operator whether it may stop: a request without a token,
/// with another pod's token, or with a token for another audience is refused (401) and
/// counted; the pod's own token is heard.
#[tokio::test]
async fn a_drain_hook_request_must_come_from_the_pod_it_names() {
    let t = TestNs::new("e2e-hook-auth").await;
    let op = t.operator_with_deployed_rbac("op");
    t.create("mo", small_cluster("v1")).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    let pod = t.pod("mo-tp-0").await.expect("pod");
    let body = serde_json::json!({
        "namespace": t.ns, "pod": "mo-tp-0", "uid": pod.uid().expect("uid"),
    });
    let url = format!("http://127.0.0.1:{}/v1/drain-hook", op.metrics_port);
    let http = reqwest::Client::new();
    let ask = |token: Option<String>| {
        let mut post = http.post(&url).json(&body);
        if let Some(token) = token {
            post = post.bearer_auth(token);
        }
        async move {
            let answer = post.send().await.expect("the operator answers");
            let code = answer.status().as_u16();
            let json: serde_json::Value = answer.json().await.expect("json");
            (
                code,
                json["allowed"].as_bool(),
                json["reason"].as_str().unwrap_or_default().to_string(),
            )
        }
    };
    let audience = mo_kube::hook_auth::AUDIENCE;
    let forged = [
        ("no token", None),
        (
            "another pod's token",
            Some(pod_token(&t, "mo-tp-1", audience).await),
        ),
        (
            "a token for another audience",
            Some(
                pod_token(
                    &t,
                    "mo-tp-0",
                    "https://kubernetes.default.svc.cluster.local",
                )
                .await,
            ),
        ),
        ("not a token", Some("x.y.z".to_string())),
    ];
    for (what, token) in forged {
        let (code, allowed, reason) = ask(token).await;
        assert_eq!((code, allowed), (401, Some(false)), "{what}: {reason}");
        eprintln!("{what}: refused: {reason}");
    }
    let (code, allowed, reason) = ask(Some(pod_token(&t, "mo-tp-0", audience).await)).await;
    assert_eq!((code, allowed), (200, Some(false)), "{reason}");
    assert!(reason.contains("not being deleted"), "{reason}");
    let metrics = op.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "mo_operator_hook_refusals_total 4"),
        "{metrics}"
    );
}

/// In a namespace whose Pod Security level is `restricted`, every pod the operator makes is
/// admitted: the StatefulSets' LOG, TN and proxy pods, the CN pods with their hook installer,
/// the pre-pull pods of an upgrade, and the pods an upgrade recreates.
#[tokio::test]
async fn every_pod_the_operator_makes_is_admitted_at_the_restricted_pod_security_level() {
    let t = TestNs::new("e2e-restricted").await;
    let out = t.kubectl(&[
        "label",
        "namespace",
        &t.ns,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _op = t.operator_with_deployed_rbac("op");
    let mut spec = small_cluster("v1");
    // hostPath volumes are what the restricted level refuses first: S3 here.
    spec["sharedStorage"] =
        serde_json::json!({"s3": {"endpoint": "https://s3.example.com", "bucket": "mo-data"}});
    t.create("mo", spec).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    t.patch_spec("mo", serde_json::json!({"version": "v2"}))
        .await;
    let prepulls = std::sync::Mutex::new(BTreeSet::new());
    wait_for("the upgrade to v2 completes", READY_LIMIT * 2, || async {
        for p in t.pod_list().await {
            if p.labels().contains_key("ops.matrixorigin.io/prepull") {
                prepulls.lock().expect("lock").insert(p.name_any());
            }
        }
        let status = t.cluster("mo").await.status?;
        (status.rollout?.step == "complete").then_some(())
    })
    .await;
    // The pre-pull pods live for a moment; the one this cluster makes on a node is
    // admitted as such (a server-side dry run goes through the same admission).
    let cluster = t.cluster("mo").await;
    let pull = mo_kube::resources::prepull_pod(&cluster, "node-1", "v3");
    let dry = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    t.pods()
        .create(&dry, &pull)
        .await
        .expect("a pre-pull pod is admitted");
    eprintln!(
        "pre-pull pods seen during the upgrade: {:?}",
        prepulls.into_inner().expect("lock")
    );
    let pods = t.pod_list().await;
    assert!(pods.len() >= 7, "{}", pods.len());
    for p in &pods {
        let spec = p.spec.as_ref().expect("spec");
        let context = spec
            .security_context
            .as_ref()
            .expect("a pod security context");
        assert_eq!(context.run_as_non_root, Some(true), "{}", p.name_any());
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            assert!(
                c.resources
                    .as_ref()
                    .and_then(|r| r.requests.as_ref())
                    .is_some(),
                "{}/{}",
                p.name_any(),
                c.name
            );
        }
    }
    // Nothing the API server refused along the way (a refusal is a Warning event).
    let out = t.kubectl(&["get", "events", "-n", &t.ns, "-o", "json"]);
    let events: serde_json::Value = serde_json::from_slice(&out.stdout).expect("events");
    let refused: Vec<&str> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["message"].as_str())
        .filter(|m| m.contains("PodSecurity") || m.contains("violates"))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
}
