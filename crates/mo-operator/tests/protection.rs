//! Eviction protection on a real API server, with the real `kubectl`: the controlled
//! regression of incident 000 (a `kubectl drain` of the node of an idle CN that owns the lock
//! table other CNs' DML uses), its never-confirming variant, plain deletes through the webhook
//! and through the preStop hook, and incident 002 on Kubernetes.

mod support;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{ListParams, PostParams};
use mo_kube::crd::MatrixOneCluster;
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const READY_LIMIT: Duration = Duration::from_secs(240);
const OWNER: &str = "mo-idle-0";

/// CN A (`idle-0`) serves no session but owns `documents`, the only table the DML of the
/// other CNs (`tp-0`, `tp-1`) locks.
async fn lock_owner_cluster(t: &TestNs, drain: serde_json::Value) {
    let cluster: MatrixOneCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "ops.matrixorigin.io/v1alpha1",
        "kind": "MatrixOneCluster",
        "metadata": {"name": "mo", "annotations": {
            "sim.ops.matrixorigin.io/idle-cn-groups": "idle",
            "sim.ops.matrixorigin.io/lock-tables": "documents=idle-0",
        }},
        "spec": {
            "version": "v1",
            "log": {"replicas": 3},
            "sharedStorage": {"fileSystem": {"path": "/tmp/mo-shared"}},
            "cn": {"groups": [{"name": "tp", "replicas": 2}, {"name": "idle", "replicas": 1}]},
            "proxy": {"replicas": 1},
            "upgrade": {"stabilityWindow": "2s", "stallTimeout": "3m"},
            "drain": drain,
        },
    }))
    .expect("cluster object");
    t.clusters()
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    wait_for("the idle CN owns the lock table", READY_LIMIT, || async {
        (t.lock_tables("mo")
            .await
            .get("documents")
            .map(String::as_str)
            == Some(OWNER))
        .then_some(())
    })
    .await;
}

async fn node_of(t: &TestNs, pod: &str) -> String {
    t.pod(pod)
        .await
        .and_then(|p| p.spec?.node_name)
        .expect("the pod is bound")
}

/// Every pod (of any namespace) bound to `node`.
async fn pods_on(t: &TestNs, node: &str) -> Vec<String> {
    let all: kube::Api<Pod> = kube::Api::all(t.client.clone());
    all.list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("list pods")
        .items
        .iter()
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect()
}

fn kubectl_drain(t: &TestNs, node: &str, timeout: &str, log: &str) -> std::process::Child {
    let file = std::fs::File::create(log).expect("log");
    Command::new(t.shared.plane.kubectl())
        .args([
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            &format!("--timeout={timeout}"),
        ])
        .env("KUBECONFIG", t.shared.plane.kubeconfig())
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .stdin(Stdio::null())
        .spawn()
        .expect("kubectl drain starts")
}

async fn drain_of(t: &TestNs, pod: &str, uid: &str) -> Option<(String, String)> {
    let status = t.cluster("mo").await.status?;
    status
        .drains
        .into_iter()
        .find(|d| d.pod == pod && d.pod_uid == uid)
        .map(|d| (d.stage, d.waiting_on.unwrap_or_default()))
}

#[tokio::test]
async fn kubectl_drain_waits_until_the_lock_owner_is_drained_and_no_transaction_breaks() {
    let t = TestNs::new("e2e-kubectl-drain").await;
    let operator = t.operator_with_deployed_rbac("op-1");
    lock_owner_cluster(&t, serde_json::json!({"alarmAfter": "5m"})).await;
    let a = t.pod(OWNER).await.expect("CN A");
    let a_uid = a.uid().expect("uid");
    let node = node_of(&t, OWNER).await;
    assert_eq!(
        pods_on(&t, &node).await,
        vec![format!("{}/{OWNER}", t.ns)],
        "CN A is alone on its node"
    );
    let before = t.report("mo").await;
    assert_eq!(
        before.txns.unknown + before.txns.failed_definite,
        0,
        "{before:?}"
    );

    let log = format!("{}/kubectl-drain-{}.log", env!("CARGO_TARGET_TMPDIR"), t.ns);
    let mut drain = kubectl_drain(&t, &node, "300s", &log);
    let start = Instant::now();
    let mut stages_seen = BTreeSet::new();
    let exit = loop {
        if let Some(status) = drain.try_wait().expect("kubectl") {
            break status;
        }
        // Until this instance's drain is confirmed, A is not even terminating.
        let drain_state = drain_of(&t, OWNER, &a_uid).await;
        if let Some((stage, _)) = &drain_state {
            stages_seen.insert(stage.clone());
        }
        let confirmed = matches!(&drain_state, Some((s, _)) if s == "Confirmed" || s == "Released");
        if let Some(pod) = t.pod(OWNER).await
            && pod.uid().as_deref() == Some(a_uid.as_str())
            && !confirmed
            && drain_state.is_some()
        {
            assert!(
                pod.metadata.deletion_timestamp.is_none(),
                "{OWNER} was deleted before its drain was confirmed: {drain_state:?}"
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "kubectl drain did not finish: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let output = std::fs::read_to_string(&log).expect("kubectl log");
    assert!(exit.success(), "kubectl drain failed: {output}");
    // The Eviction API refused first, with the webhook's reason, and kubectl retried.
    assert!(
        output.contains("evictions.ops.matrixorigin.io") && output.contains("draining"),
        "kubectl saw the refusal: {output}"
    );
    assert!(output.contains(&format!("pod/{OWNER} evicted")), "{output}");
    assert!(
        stages_seen.contains("HandOver") || stages_seen.contains("MigrateSessions"),
        "the drain went through its stages: {stages_seen:?}"
    );
    // A is gone; the operator recreated it (a new instance, elsewhere).
    wait_for(
        "CN A's old instance gone",
        Duration::from_secs(60),
        || async {
            (t.pod(OWNER).await.and_then(|p| p.uid()) != Some(a_uid.clone())).then_some(())
        },
    )
    .await;
    let owner = t.lock_tables("mo").await.get("documents").cloned();
    assert_ne!(owner.as_deref(), Some(OWNER), "the lock table moved off A");
    // Every transaction outcome definite: 0 unknown, 0 failed, no unsafe stop of A.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = t.report("mo").await;
    assert_no_harm(&report);
    assert!(report.txns.committed > before.txns.committed);

    let latency = operator.review_latency().await;
    let metrics = operator.metrics().await;
    let reviews: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("mo_operator_disruption_reviews_total"))
        .collect();
    println!("review latency: {latency}; reviews: {reviews:?}");
    assert!(
        reviews
            .iter()
            .any(|l| l.contains("door=\"eviction\"") && l.contains("verdict=\"deny\"")),
        "{reviews:?}"
    );
    assert!(
        reviews
            .iter()
            .any(|l| l.contains("door=\"eviction\"") && l.contains("verdict=\"allow\"")),
        "{reviews:?}"
    );
    let _ = t.kubectl(&["uncordon", &node]);
}

#[tokio::test]
async fn when_the_kernel_never_confirms_the_lock_owner_keeps_running_and_nothing_is_forced() {
    let t = TestNs::new("e2e-never-confirms").await;
    let _operator = t.operator_with_deployed_rbac("op-1");
    lock_owner_cluster(
        &t,
        serde_json::json!({"alarmAfter": "20s", "evictionAbandon": "30s"}),
    )
    .await;
    t.fault("mo", serde_json::json!({"handover_never_confirms": true}))
        .await;
    let a_uid = t.pod(OWNER).await.and_then(|p| p.uid()).expect("uid");
    let node = node_of(&t, OWNER).await;

    let log = format!("{}/kubectl-drain-{}.log", env!("CARGO_TARGET_TMPDIR"), t.ns);
    let mut drain = kubectl_drain(&t, &node, "60s", &log);
    let start = Instant::now();
    let mut why = None;
    let exit = loop {
        if let Some(status) = drain.try_wait().expect("kubectl") {
            break status;
        }
        if let Some(c) = t.condition("mo", "Draining").await
            && c.0 == "True"
        {
            why = Some(c);
        }
        assert!(start.elapsed() < Duration::from_secs(120), "kubectl hung");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let output = std::fs::read_to_string(&log).expect("kubectl log");
    assert!(!exit.success(), "kubectl drain must not succeed: {output}");
    assert!(output.contains("evictions.ops.matrixorigin.io"), "{output}");
    let (_, reason, message) = why.expect("the Draining condition was set");
    assert_eq!(reason, "EvictionWaiting");
    assert!(
        message.contains(OWNER) && message.contains("lock tables"),
        "the condition says what it waits for: {message}"
    );
    let degraded = t.condition("mo", "Degraded").await.expect("Degraded");
    assert_eq!(
        (degraded.0.as_str(), degraded.1.as_str()),
        ("True", "DrainAlarm"),
        "{degraded:?}"
    );
    // Long after every timeout (alarm, eviction abandon, kubectl's own), A is the same
    // instance, running, never deleted; the abandoned drain hands it back to work.
    tokio::time::sleep(Duration::from_secs(45)).await;
    let a = t.pod(OWNER).await.expect("A still exists");
    assert_eq!(a.uid().as_deref(), Some(a_uid.as_str()));
    assert!(a.metadata.deletion_timestamp.is_none(), "never deleted");
    let running = a
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .is_some_and(|c| c.ready);
    assert!(running, "A keeps running: {:?}", a.status);
    let report = t.report("mo").await;
    assert_no_harm(&report);
    let _ = t.kubectl(&["uncordon", &node]);
}

#[tokio::test]
async fn a_plain_delete_is_refused_until_the_drain_is_confirmed_and_the_prestop_hook_waits_for_it()
{
    let mut t = TestNs::new("e2e-plain-delete").await;
    let _operator = t.operator_with_deployed_rbac("op-1");
    lock_owner_cluster(&t, serde_json::json!({"alarmAfter": "5m"})).await;
    let a_uid = t.pod(OWNER).await.and_then(|p| p.uid()).expect("uid");

    // The webhook refuses the delete and starts the drain; a retry after the confirmation
    // goes through.
    let first = t.kubectl(&["delete", "pod", OWNER, "-n", &t.ns, "--wait=false"]);
    assert!(!first.status.success(), "refused at first");
    let refusal = String::from_utf8_lossy(&first.stderr).to_string();
    assert!(
        refusal.contains("pod-deletes.ops.matrixorigin.io"),
        "{refusal}"
    );
    let deleted = wait_for(
        "the delete goes through",
        Duration::from_secs(240),
        || async {
            let out = t.kubectl(&["delete", "pod", OWNER, "-n", &t.ns, "--wait=false"]);
            if out.status.success() {
                return Some(());
            }
            // Refused while the drain runs: A is still this instance and not terminating.
            let pod = t.pod(OWNER).await?;
            assert_eq!(pod.uid().as_deref(), Some(a_uid.as_str()));
            assert!(pod.metadata.deletion_timestamp.is_none());
            tokio::time::sleep(Duration::from_secs(1)).await;
            None
        },
    );
    deleted.await;
    let (stage, _) = drain_of(&t, OWNER, &a_uid).await.expect("a drain of A");
    assert!(
        stage == "Released" || stage == "Confirmed" || stage == "Finished",
        "{stage}"
    );
    wait_for("A's old instance gone", Duration::from_secs(60), || async {
        (t.pod(OWNER).await.and_then(|p| p.uid()) != Some(a_uid.clone())).then_some(())
    })
    .await;
    assert_ne!(
        t.lock_tables("mo")
            .await
            .get("documents")
            .map(String::as_str),
        Some(OWNER)
    );

    // Through a door the webhook does not guard (its off switch): the pod is deleted at
    // once, and its preStop hook keeps the process running until the drain is confirmed.
    let b = "mo-tp-1";
    let b_uid = t.pod(b).await.and_then(|p| p.uid()).expect("uid");
    let out = t.kubectl(&[
        "delete",
        "pod",
        b,
        "-n",
        &t.ns,
        "--wait=false",
        "--dry-run=server",
    ]);
    assert!(!out.status.success(), "a dry run is not allowed through");
    drop(_operator);
    t.protect_deletes = false;
    let operator = t.operator_with_deployed_rbac("op-2");
    let metrics_url = format!("http://127.0.0.1:{}/metrics", operator.metrics_port);
    wait_for("op-2 leads", Duration::from_secs(60), || async {
        let text = reqwest::get(&metrics_url).await.ok()?.text().await.ok()?;
        text.contains("mo_operator_leader 1").then_some(())
    })
    .await;
    wait_for(
        "the delete webhook is switched off",
        Duration::from_secs(60),
        || async {
            let out = t.kubectl(&[
                "get",
                "validatingwebhookconfiguration",
                &format!("mo-operator-{}", t.ns),
                "-o",
                "jsonpath={.webhooks[*].name}",
            ]);
            let names = String::from_utf8_lossy(&out.stdout).to_string();
            (!names.contains("pod-deletes")).then_some(())
        },
    )
    .await;
    // While the kernel withholds the confirmation, the deleted pod must keep running: only
    // the hook can hold it (without one the kubelet sends SIGTERM at once).
    t.fault("mo", serde_json::json!({"handover_never_confirms": true}))
        .await;
    let out = t.kubectl(&["delete", "pod", b, "-n", &t.ns, "--wait=false"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let running = |pod: &Pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .is_some_and(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_some())
    };
    let held_from = Instant::now();
    while held_from.elapsed() < Duration::from_secs(10) {
        let pod = t.pod(b).await.expect("the deleted pod is still there");
        assert_eq!(pod.uid().as_deref(), Some(b_uid.as_str()));
        assert!(pod.metadata.deletion_timestamp.is_some(), "deleted");
        assert!(running(&pod), "{b} stopped while its drain was unconfirmed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hook = t
        .prestop(&b_uid)
        .await
        .expect("the kubelet ran the preStop hook");
    assert_eq!(hook["running"], true, "the hook holds {b}: {hook}");
    // The kubelet started the hook when it saw the deletion and updates its record every tick:
    // most of the 10 s watched above, whatever the machine's load.
    assert!(hook["held_ms"].as_u64().unwrap_or(0) >= 5_000, "{hook}");
    // The kernel confirms: the hook returns by itself and the instance goes.
    t.fault("mo", serde_json::json!({"handover_never_confirms": false}))
        .await;
    wait_for(
        "the old instance of B gone",
        Duration::from_secs(240),
        || async { (t.pod(b).await.and_then(|p| p.uid()) != Some(b_uid.clone())).then_some(()) },
    )
    .await;
    let hook = t.prestop(&b_uid).await.expect("hook record");
    assert_eq!(
        (
            hook["running"].as_bool(),
            hook["exit_code"].as_i64(),
            hook["killed_at_grace_end"].as_bool()
        ),
        (Some(false), Some(0), Some(false)),
        "the hook returned by itself once the drain was confirmed: {hook}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_no_harm(&t.report("mo").await);
}

/// Incident 002's strategy (LOG → CN → DN → proxy) on Kubernetes.
fn incident_002_spec() -> serde_json::Value {
    serde_json::json!({
        "version": "v1",
        "log": {"replicas": 3},
        "sharedStorage": {"fileSystem": {"path": "/tmp/mo-shared"}},
        "cn": {"groups": [{"name": "tp", "replicas": 2}]},
        "proxy": {"replicas": 2},
        "upgrade": {
            "stabilityWindow": "2s",
            "stallTimeout": "40s",
            "strategy": {"proxy": ["dn"], "dn": ["cn"], "cn": ["log"], "log": []},
        },
    })
}

async fn uids_of(t: &TestNs, prefix: &str) -> BTreeMap<String, String> {
    t.pods()
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
        .iter()
        .filter(|p| p.name_any().starts_with(prefix))
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn incident_002_halts_in_the_cn_phase_and_never_touches_the_proxies() {
    let t = TestNs::new("e2e-incident-002").await;
    let _operator = t.operator_with_deployed_rbac("op-1");
    t.create("mo", incident_002_spec()).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    let proxies = uids_of(&t, "mo-proxy").await;
    assert_eq!(proxies.len(), 2);
    t.fault(
        "mo",
        serde_json::json!({"cn_never_heartbeats_after_restart": true}),
    )
    .await;
    let before = t.report("mo").await;
    t.patch_spec("mo", serde_json::json!({"version": "v2"}))
        .await;
    let (_, reason, message) = wait_for("the rollout halts", Duration::from_secs(300), || async {
        let c = t.condition("mo", "Halted").await?;
        (c.0 == "True").then_some(c)
    })
    .await;
    assert_eq!(reason, "StallTimeout");
    assert!(message.contains("Nothing was deleted"), "{message}");
    let rollout = t
        .cluster("mo")
        .await
        .status
        .and_then(|s| s.rollout)
        .expect("rollout");
    assert!(
        rollout.step.contains("cn"),
        "halted in the CN phase: {rollout:?}"
    );
    // Proxies untouched: same instances, old version.
    assert_eq!(uids_of(&t, "mo-proxy").await, proxies);
    for p in t
        .pods()
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
    {
        if p.name_any().starts_with("mo-proxy") {
            let image = p.spec.and_then(|s| s.containers[0].image.clone());
            assert!(image.is_some_and(|i| i.ends_with(":v1")));
        }
    }
    // The service went on: commits kept flowing, nothing failed or ended unknown.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let report = t.report("mo").await;
    assert!(report.txns.committed > before.txns.committed);
    assert_eq!(
        report.txns.unknown + report.txns.failed_definite,
        0,
        "{:?}",
        report.txns
    );
    assert_eq!(report.tn_fatal_exits, 0);
    assert_eq!(
        report.unsafe_actions.total(),
        0,
        "{:?}",
        report.unsafe_action_log
    );
}

#[tokio::test]
async fn incident_002_without_the_fault_completes_with_no_tn_fatal_exit() {
    let t = TestNs::new("e2e-incident-002-ok").await;
    let _operator = t.operator_with_deployed_rbac("op-1");
    t.create("mo", incident_002_spec()).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    t.patch_spec("mo", serde_json::json!({"version": "v2"}))
        .await;
    wait_for(
        "the upgrade completes",
        Duration::from_secs(420),
        || async {
            let rollout = t.cluster("mo").await.status?.rollout?;
            (rollout.target == "v2" && rollout.step == "complete").then_some(())
        },
    )
    .await;
    t.wait_ready("mo", READY_LIMIT).await;
    for p in t
        .pods()
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
    {
        if p.labels().contains_key("ops.matrixorigin.io/prepull") {
            continue;
        }
        let image = p.spec.and_then(|s| s.containers[0].image.clone());
        assert!(
            image.as_deref().is_some_and(|i| i.ends_with(":v2")),
            "{image:?}"
        );
    }
    let report = t.report("mo").await;
    assert_eq!(report.tn_fatal_exits, 0);
    assert_no_harm(&report);
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// The TN (no standby) is never evicted; 300 evictions measure the webhook's decision time as
/// the operator sees it and the whole Eviction API call as an evictor sees it.
#[tokio::test]
async fn tn_evictions_are_always_refused_and_the_webhook_decision_latency_is_measured() {
    let t = TestNs::new("e2e-webhook-latency").await;
    let operator = t.operator_with_deployed_rbac("op-1");
    t.create("mo", small_cluster("v1")).await.expect("create");
    t.wait_ready("mo", READY_LIMIT).await;
    // No client-side retry: each call is one eviction, refused or not.
    let once = t.shared.plane.client_retrying(false).await.expect("client");
    let pods: kube::Api<Pod> = kube::Api::namespaced(once, &t.ns);
    let mut client_ms = Vec::new();
    for _ in 0..300 {
        let started = Instant::now();
        let result = pods
            .evict("mo-tn-0", &kube::api::EvictParams::default())
            .await;
        client_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        match result {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 429, "{e:?}");
                assert!(e.message.contains("only TN"), "{}", e.message);
            }
            other => panic!("the TN was not protected: {other:?}"),
        }
    }
    client_ms.sort_by(f64::total_cmp);
    let operator_side = operator.review_latency().await;
    let figure = serde_json::json!({
        "evictions": client_ms.len(),
        "operator_review_ms": operator_side,
        "eviction_api_call_ms": {
            "p50": percentile(&client_ms, 0.5),
            "p99": percentile(&client_ms, 0.99),
        },
    });
    println!("webhook latency: {figure}");
    write_figure("webhook-latency.json", &figure);
    assert_eq!(operator_side["samples"], 300);
    let pod = t.pod("mo-tn-0").await.expect("the TN stays");
    assert!(pod.metadata.deletion_timestamp.is_none());
}
