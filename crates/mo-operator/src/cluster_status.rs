//! `mo-operator status <cluster>`: what `kubectl get moc` summarizes, in full. The rollout's
//! step and what it waits on, each drain with its instance and what it waits on, the
//! disruption budgets, and per pod its version, readiness, serving label and autoscaler hints.
//! Reads the API server only (what the operator wrote); it changes nothing.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use mo_kube::crd::MatrixOneCluster;
use mo_kube::observation::running_version;
use mo_kube::protection::{DO_NOT_DISRUPT, SAFE_TO_EVICT};
use mo_kube::resources::{LABEL_CLUSTER, LABEL_COMPONENT, LABEL_PREPULL, LABEL_SERVING};
use serde::Serialize;
use std::fmt::Write;

#[derive(clap::Args)]
pub struct Args {
    /// The MatrixOneCluster's name.
    pub cluster: String,
    /// Its namespace (default: the kubeconfig context's).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Recent events of the cluster shown (newest last).
    #[arg(long, default_value_t = 10)]
    pub events: usize,
    /// Print one JSON object instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// Everything the command shows, as read.
#[derive(Serialize)]
pub struct ClusterView {
    pub cluster: MatrixOneCluster,
    pub pods: Vec<Pod>,
    pub budgets: Vec<PodDisruptionBudget>,
    pub events: Vec<Event>,
}

pub async fn run(args: Args) -> Result<()> {
    let client = Client::try_default()
        .await
        .context("no Kubernetes cluster: set KUBECONFIG or run in a pod")?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let view = read(&client, &namespace, &args.cluster, args.events).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", render(&view));
    }
    Ok(())
}

async fn read(client: &Client, namespace: &str, name: &str, events: usize) -> Result<ClusterView> {
    let cluster = Api::<MatrixOneCluster>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| format!("MatrixOneCluster {namespace}/{name}"))?;
    let selector = ListParams::default().labels(&format!("{LABEL_CLUSTER}={name}"));
    // The cluster's own pods, not the image pre-pull pods of an upgrade.
    let pod_selector =
        ListParams::default().labels(&format!("{LABEL_CLUSTER}={name},!{LABEL_PREPULL}"));
    let mut pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&pod_selector)
        .await
        .context("listing the cluster's pods")?
        .items;
    pods.sort_by_key(|p| p.name_any());
    let mut budgets = Api::<PodDisruptionBudget>::namespaced(client.clone(), namespace)
        .list(&selector)
        .await
        .context("listing the cluster's disruption budgets")?
        .items;
    budgets.sort_by_key(|b| b.name_any());
    // This cluster's events only (a deleted cluster of the same name had another UID).
    let uid = cluster.uid().unwrap_or_default();
    let mut all_events = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().fields(&format!(
            "involvedObject.kind=MatrixOneCluster,involvedObject.name={name},involvedObject.uid={uid}"
        )))
        .await
        .context("listing the cluster's events")?
        .items;
    all_events.sort_by_key(last_seen);
    let skip = all_events.len().saturating_sub(events);
    Ok(ClusterView {
        cluster,
        pods,
        budgets,
        events: all_events.into_iter().skip(skip).collect(),
    })
}

/// When an event was last seen: a repeated event (events.k8s.io series) counts from its
/// latest occurrence, not its first.
fn last_seen(e: &Event) -> Option<k8s_openapi::jiff::Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
}

/// How many times an event happened.
fn occurrences(e: &Event) -> i32 {
    e.series
        .as_ref()
        .and_then(|s| s.count)
        .or(e.count)
        .unwrap_or(1)
        .max(1)
}

/// The text the command prints.
pub fn render(view: &ClusterView) -> String {
    let mut out = String::new();
    let c = &view.cluster;
    let status = c.status.clone().unwrap_or_default();
    let stale = match (status.observed_generation, c.metadata.generation) {
        (Some(seen), Some(now)) if seen < now => " — not yet for the current spec",
        (None, _) => " — no status yet",
        _ => "",
    };
    let _ = writeln!(
        out,
        "MatrixOneCluster {}/{}: version {} (generation {}, status for {}{stale})",
        c.namespace().unwrap_or_default(),
        c.name_any(),
        c.spec.version,
        c.metadata.generation.unwrap_or(0),
        status
            .observed_generation
            .map_or("none".to_string(), |g| g.to_string())
    );

    let _ = writeln!(out, "\nConditions");
    if status.conditions.is_empty() {
        let _ = writeln!(out, "  (none yet)");
    }
    for cond in &status.conditions {
        let _ = writeln!(
            out,
            "  {:<12} {:<6} {:<20} {}",
            cond.type_, cond.status, cond.reason, cond.message
        );
    }

    let _ = writeln!(out, "\nComponents");
    for (component, s) in &status.components {
        let versions: Vec<String> = s
            .versions
            .iter()
            .map(|(v, n)| format!("{v}: {n}"))
            .collect();
        let _ = writeln!(
            out,
            "  {component:<6} {}/{} ready   {}",
            s.ready,
            s.replicas,
            versions.join(", ")
        );
    }

    let _ = writeln!(out, "\nRollout");
    match &status.rollout {
        Some(r) => {
            let _ = writeln!(out, "  target  {}\n  step    {}", r.target, r.step);
            let _ = writeln!(
                out,
                "  waiting {}",
                r.waiting_on.as_deref().unwrap_or("on nothing")
            );
        }
        None => {
            let _ = writeln!(out, "  none");
        }
    }

    let _ = writeln!(out, "\nDrains");
    if status.drains.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for d in &status.drains {
        let _ = writeln!(
            out,
            "  {} (pod uid {}, CN {}): {}, stage {}",
            d.pod, d.pod_uid, d.cn_uuid, d.purpose, d.stage
        );
        let _ = writeln!(
            out,
            "    waiting on: {}",
            d.waiting_on.as_deref().unwrap_or("nothing")
        );
    }

    let _ = writeln!(out, "\nDisruption budgets");
    for b in &view.budgets {
        let min = b
            .spec
            .as_ref()
            .and_then(|s| s.min_available.as_ref())
            .map_or("?".to_string(), |m| match m {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i) => i.to_string(),
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s.clone(),
            });
        let allowed = b
            .status
            .as_ref()
            .and_then(|s| s.disruptions_allowed)
            .map_or("?".to_string(), |n| n.to_string());
        let reason = b
            .annotations()
            .get("ops.matrixorigin.io/reason")
            .cloned()
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:<16} minAvailable {:<3} disruptions allowed {:<3} {}",
            b.name_any(),
            min,
            allowed,
            reason
        );
    }

    let _ = writeln!(out, "\nPods");
    let _ = writeln!(
        out,
        "  {:<28} {:<10} {:<12} {:<6} {:<8} {:<16} NODE",
        "NAME", "COMPONENT", "VERSION", "READY", "SERVING", "AUTOSCALER-HINT"
    );
    for p in &view.pods {
        let labels = p.labels();
        let annotations = p.annotations();
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        // Only the autoscalers' hints: evictions and deletes are reviewed by the webhooks
        // and the budgets whatever they say.
        let pinned = annotations.get(DO_NOT_DISRUPT).map(String::as_str) == Some("true")
            || annotations.get(SAFE_TO_EVICT).map(String::as_str) == Some("false");
        let state = if p.metadata.deletion_timestamp.is_some() {
            "terminating"
        } else if pinned {
            "do-not-disrupt"
        } else {
            "none"
        };
        let _ = writeln!(
            out,
            "  {:<28} {:<10} {:<12} {:<6} {:<8} {:<16} {}",
            p.name_any(),
            labels.get(LABEL_COMPONENT).map_or("?", String::as_str),
            running_version(p),
            if ready { "yes" } else { "no" },
            labels.get(LABEL_SERVING).map_or("-", String::as_str),
            state,
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or("-")
        );
    }

    let _ = writeln!(out, "\nRecent events");
    if view.events.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for e in &view.events {
        let times = match occurrences(e) {
            1 => String::new(),
            n => format!(" (×{n})"),
        };
        let _ = writeln!(
            out,
            "  {} {:<8} {:<20} {}{times}",
            last_seen(e).map_or("-".to_string(), |t| t.to_string()),
            e.type_.as_deref().unwrap_or(""),
            e.reason.as_deref().unwrap_or(""),
            e.message.as_deref().unwrap_or("")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> ClusterView {
        let cluster: MatrixOneCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "ops.matrixorigin.io/v1alpha1",
            "kind": "MatrixOneCluster",
            "metadata": {"name": "mo", "namespace": "db", "generation": 4},
            "spec": {
                "version": "v2",
                "log": {"replicas": 3},
                "cn": {"groups": [{"name": "tp", "replicas": 2}]},
                "sharedStorage": {"fileSystem": {"path": "/data"}}
            },
            "status": {
                "observedGeneration": 4,
                "conditions": [{"type": "Ready", "status": "False", "reason": "Upgrading",
                    "message": "v1 to v2", "lastTransitionTime": "2026-12-06T00:00:00Z"}],
                "components": {"cn": {"replicas": 2, "ready": 1, "versions": {"v1": 1, "v2": 1}}},
                "rollout": {"target": "v2", "step": "phase cn: restart mo-tp-1",
                    "waitingOn": "drain of mo-tp-1: sessions left 3"},
                "drains": [{"pod": "mo-tp-1", "podUid": "uid-1", "cnUuid": "cn-1",
                    "purpose": "restart on v2", "stage": "MigrateSessions",
                    "waitingOn": "sessions left 3"}]
            }
        }))
        .expect("cluster");
        let pod = |name: &str, pinned: bool| -> Pod {
            let mut annotations = serde_json::json!({});
            if pinned {
                annotations[DO_NOT_DISRUPT] = "true".into();
            }
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {LABEL_COMPONENT: "cn"},
                    "annotations": annotations},
                "spec": {"containers": [{"name": "main", "image": "matrixorigin/matrixone:v1"}],
                    "nodeName": "node-a"},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}
            }))
            .expect("pod")
        };
        let budget: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "mo-cn", "annotations": {"ops.matrixorigin.io/reason": "no CN drain confirmed"}},
            "spec": {"minAvailable": 2},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 2}
        }))
        .expect("pdb");
        ClusterView {
            cluster,
            pods: vec![pod("mo-tp-0", false), pod("mo-tp-1", true)],
            budgets: vec![budget],
            events: Vec::new(),
        }
    }

    #[test]
    fn the_text_shows_the_rollout_each_drain_budgets_and_hints() {
        let text = render(&view());
        for needle in [
            "MatrixOneCluster db/mo: version v2 (generation 4, status for 4)",
            "Ready        False  Upgrading",
            "cn     1/2 ready   v1: 1, v2: 1",
            "step    phase cn: restart mo-tp-1",
            "waiting drain of mo-tp-1: sessions left 3",
            "mo-tp-1 (pod uid uid-1, CN cn-1): restart on v2, stage MigrateSessions",
            "waiting on: sessions left 3",
            "mo-cn            minAvailable 2   disruptions allowed 0   no CN drain confirmed",
        ] {
            assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
        }
        let line = |pod: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(pod) && l.ends_with("node-a"))
                .unwrap_or_else(|| panic!("{pod} row"))
                .to_string()
        };
        assert!(
            line("mo-tp-1").contains("do-not-disrupt"),
            "{}",
            line("mo-tp-1")
        );
        assert!(line("mo-tp-0").contains(" none "), "{}", line("mo-tp-0"));
        assert!(line("mo-tp-0").contains(" v1 "), "{}", line("mo-tp-0"));
    }
}
