//! Every voluntary way out of a MatrixOne pod, reviewed by the decision core: the Eviction API
//! (`kubectl drain`, autoscalers, consolidation agents), plain deletes by anyone but the
//! operator, and the CN's preStop hook. One function answers all three from a fresh
//! observation, records what the core decided before answering, and says why on a refusal.
//!
//! Uncertainty refuses: an unknown cluster state, an unreadable kernel, a stale cache, a record
//! that could not be written — the pod stays, the caller retries.

use crate::controller::{Context, now_millis, patch_progress, pods_of_cluster};
use crate::crd::MatrixOneCluster;
use crate::observation::{self, component_of};
use crate::resources::LABEL_CLUSTER;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use mo_core::{EvictionRequest, EvictionVerdict, Policy, SafePolicy};
use std::time::Instant;

/// Which door the pod is leaving through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Door {
    /// `POST pods/eviction`: the evictor retries on 429.
    Eviction,
    /// `DELETE pod` by `user` (not the operator).
    Delete { user: String },
    /// The CN's preStop hook: the pod is already being deleted; its process waits.
    PreStop,
}

impl Door {
    pub fn name(&self) -> &'static str {
        match self {
            Door::Eviction => "eviction",
            Door::Delete { .. } => "delete",
            Door::PreStop => "prestop",
        }
    }

    fn source(&self) -> String {
        match self {
            Door::Eviction => "the Eviction API".into(),
            Door::Delete { user } => format!("a delete by {user}"),
            Door::PreStop => "the preStop hook of a deleted pod".into(),
        }
    }
}

/// What the caller gets: allowed, or refused with the reason (HTTP 429: retry later).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Review {
    pub allowed: bool,
    pub reason: String,
}

impl Review {
    fn allow(reason: impl Into<String>) -> Review {
        Review {
            allowed: true,
            reason: reason.into(),
        }
    }
    fn deny(reason: impl Into<String>) -> Review {
        Review {
            allowed: false,
            reason: reason.into(),
        }
    }
}

/// Reviews pod `name` (`uid`, when the caller knows which instance it means) leaving
/// through `door`. `pod` is the object when the caller has it (a DELETE carries it).
pub async fn review(
    ctx: &Context,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    pod: Option<Pod>,
    door: Door,
) -> Review {
    let started = Instant::now();
    let (component, review) = review_inner(ctx, namespace, name, uid, pod, &door).await;
    ctx.metrics.observe_review(
        door.name(),
        component.as_deref().unwrap_or("unknown"),
        review.allowed,
        started.elapsed(),
    );
    tracing::info!(
        door = door.name(),
        namespace,
        pod = name,
        allowed = review.allowed,
        reason = %review.reason,
        took_ms = started.elapsed().as_secs_f64() * 1000.0,
        "disruption reviewed"
    );
    review
}

async fn review_inner(
    ctx: &Context,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    pod: Option<Pod>,
    door: &Door,
) -> (Option<String>, Review) {
    // The pod as the API server has it now (the cache may lag behind a recreation).
    let pod = match pod {
        Some(p) => p,
        None => {
            let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
            match api.get_opt(name).await {
                Ok(Some(p)) => p,
                Ok(None) if *door == Door::Eviction => {
                    // The API server answers "not found" to the evictor itself.
                    return (None, Review::allow(format!("pod {name} does not exist")));
                }
                Ok(None) => {
                    return (
                        None,
                        Review::deny(format!("cannot find pod {name}: it stays until verified")),
                    );
                }
                Err(e) => {
                    return (
                        None,
                        Review::deny(format!("cannot read pod {name} ({e}): retry")),
                    );
                }
            }
        }
    };
    let pod_uid = pod.uid().unwrap_or_default();
    if let Some(expected) = uid
        && expected != pod_uid
    {
        return (
            None,
            Review::deny(format!(
                "pod {name} is instance {pod_uid}, not {expected}: it stays until verified"
            )),
        );
    }
    let Some(component) = component_of(&pod) else {
        return (None, Review::allow("not a MatrixOne pod of this operator"));
    };
    let component_name = Some(component.as_str().to_string());
    if *door == Door::PreStop && pod.metadata.deletion_timestamp.is_none() {
        return (
            component_name,
            Review::deny(format!("pod {name} is not being deleted")),
        );
    }
    let Some(cluster_name) = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_CLUSTER))
        .cloned()
    else {
        return (
            component_name,
            Review::allow("not part of a MatrixOne cluster"),
        );
    };
    let clusters: Api<MatrixOneCluster> = Api::namespaced(ctx.client.clone(), namespace);
    let cluster = match clusters.get_opt(&cluster_name).await {
        Ok(Some(c)) => c,
        // The whole cluster is being removed: its pods go with it.
        Ok(None) => {
            return (
                component_name,
                Review::allow(format!("cluster {cluster_name} no longer exists")),
            );
        }
        Err(e) => {
            return (
                component_name,
                Review::deny(format!("cannot read cluster {cluster_name} ({e}): retry")),
            );
        }
    };
    if cluster.metadata.deletion_timestamp.is_some() {
        return (
            component_name,
            Review::allow(format!("cluster {cluster_name} is being deleted")),
        );
    }
    let (Ok(strategy), Ok(_)) = (cluster.spec.strategy(), cluster.spec.safe_config()) else {
        return (
            component_name,
            Review::deny(format!(
                "cluster {cluster_name} has an invalid spec: nothing leaves until it is fixed"
            )),
        );
    };
    let Some(cluster_uid) = cluster.uid() else {
        return (
            component_name,
            Review::deny("cluster has no UID yet: retry"),
        );
    };
    let state = ctx.state(&cluster_uid);
    let mut state = state.lock().await;
    let Some(config) = state.config.clone() else {
        return (
            component_name,
            Review::deny("the operator has not observed this cluster yet: retry"),
        );
    };
    if state.policy.is_none() {
        return (
            component_name,
            Review::deny("the operator has not observed this cluster yet: retry"),
        );
    }

    let mut pods = pods_of_cluster(ctx, namespace, &cluster_name);
    // This pod as read above, not as cached.
    pods.retain(|p| p.metadata.name.as_deref() != Some(name));
    pods.push(pod.clone());
    let nodes: Vec<_> = ctx.nodes.state().iter().map(|n| (**n).clone()).collect();
    let kernel = ctx.admin.kernel_view(namespace, &cluster_name).await;
    let obs = observation::build(now_millis(), &cluster, &pods, &nodes, kernel, strategy);

    let policy = state.policy.as_mut().expect("checked above");
    let before = policy.progress_record();
    let verdict = policy.review_eviction(
        &obs,
        &EvictionRequest {
            pod: name.to_string(),
            uid: pod_uid.clone(),
            source: door.source(),
        },
    );
    let after = policy.progress_record();
    // Recorded before answering: an allowed eviction (a released drain) or a started drain
    // survives an operator restart.
    if after != before {
        let record = after.clone().unwrap_or_default();
        if let Err(e) = patch_progress(ctx, &cluster, &record).await {
            // Not recorded: forget it and refuse; the caller retries.
            state.policy = Some(match &before {
                Some(r) => SafePolicy::resume(config, r),
                None => SafePolicy::new(config),
            });
            return (
                component_name,
                Review::deny(format!("could not record the decision ({e}): retry")),
            );
        }
    }
    drop(state);
    let review = match verdict {
        EvictionVerdict::Allow => Review::allow(format!(
            "{name}: the cluster survives it (drain confirmed for this instance, or gates hold)"
        )),
        EvictionVerdict::Deny { reason } => Review::deny(reason),
    };
    if after != before {
        let (type_, reason) = if review.allowed {
            (EventType::Normal, "DisruptionAllowed")
        } else {
            (EventType::Normal, "DrainStarted")
        };
        ctx.event(
            &cluster,
            type_,
            reason,
            format!(
                "{} of pod {name} ({pod_uid}): {}",
                door.source(),
                review.reason
            ),
        )
        .await;
    }
    (component_name, review)
}
