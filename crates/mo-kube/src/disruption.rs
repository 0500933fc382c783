//! Every voluntary way out of a MatrixOne pod, reviewed by the decision core: the Eviction API
//! (`kubectl drain`, autoscalers, consolidation agents), plain deletes by anyone but the
//! operator, and the CN's preStop hook. One function answers all three from a fresh
//! observation, records what the core decided before answering, and says why on a refusal.
//!
//! Uncertainty refuses: an unknown cluster state, an unreadable kernel, a stale cache, a record
//! that could not be written — the pod stays, the caller retries.

use crate::controller::{Context, now_millis, patch_progress, pods_of_cluster};
use crate::events::EventType;
use crate::kernel_config;
use crate::observation::{self, component_of};
use crate::resources::LABEL_CLUSTER;
use crate::validation::StoredCluster;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use mo_core::{EvictionRequest, EvictionVerdict, Policy, SafePolicy};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// HTTP status of a refusal: 429 (retry later) or 404 (no such pod: the evictor is done).
    pub code: u16,
}

impl Review {
    pub fn allow(reason: impl Into<String>) -> Review {
        Review {
            allowed: true,
            reason: reason.into(),
            code: 200,
        }
    }
    pub fn deny(reason: impl Into<String>) -> Review {
        Review {
            allowed: false,
            reason: reason.into(),
            code: 429,
        }
    }
}

/// How long a review waits for the cluster's state (a tick may hold it): well inside the API
/// server's webhook timeout, so the caller always gets our answer (a refusal: retry).
const STATE_WAIT: Duration = Duration::from_secs(4);
/// How long recording a decision may take before the review gives up on it (and refuses).
const RECORD_WAIT: Duration = Duration::from_secs(3);

/// Reviews pod `name` (`uid`, when the caller knows which instance it means) leaving
/// through `door`. `pod` is the object when the caller has it (a DELETE carries it).
///
/// Runs as a task of its own: a caller that goes away (the API server's timeout) cannot cut a
/// review between its decision and the recording of it.
pub async fn review(
    ctx: Arc<Context>,
    namespace: String,
    name: String,
    uid: Option<String>,
    pod: Option<Pod>,
    door: Door,
) -> Review {
    let task = tokio::spawn(async move {
        review_timed(&ctx, &namespace, &name, uid.as_deref(), pod, door).await
    });
    task.await
        .unwrap_or_else(|e| Review::deny(format!("the review failed ({e}): retry")))
}

async fn review_timed(
    ctx: &Context,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    pod: Option<Pod>,
    door: Door,
) -> Review {
    let started = Instant::now();
    // A review may record a decision (a drain started, a release): only inside the lease.
    let (component, review) = match ctx
        .leadership
        .act(review_inner(ctx, namespace, name, uid, pod, &door))
        .await
    {
        Ok(answer) => answer,
        Err(not_leading) => {
            ctx.metrics.fenced_acts.inc();
            (None, Review::deny(format!("{not_leading}: retry")))
        }
    };
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
                    // Refused as "not found" (the evictor is done with it), never allowed: a
                    // pod of that name created meanwhile must not go unreviewed.
                    return (
                        None,
                        Review {
                            code: 404,
                            ..Review::deny(format!("pod {name} does not exist"))
                        },
                    );
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
    let clusters: Api<StoredCluster> = Api::namespaced(ctx.client.clone(), namespace);
    let stored = match clusters.get_opt(&cluster_name).await {
        Ok(Some(c)) => c,
        // The whole cluster was removed and the garbage collector takes its pods; a pod that
        // no cluster owns (orphaned, or mislabelled) is not let go blindly.
        Ok(None) => {
            let owned = owned_by_removed_cluster(ctx, namespace, &pod, &cluster_name).await;
            return (
                component_name,
                if owned {
                    Review::allow(format!("cluster {cluster_name} no longer exists"))
                } else {
                    Review::deny(format!(
                        "pod {name} names cluster {cluster_name}, which does not exist, and no \
                         cluster owns it: it stays until someone decides"
                    ))
                },
            );
        }
        Err(e) => {
            return (
                component_name,
                Review::deny(format!("cannot read cluster {cluster_name} ({e}): retry")),
            );
        }
    };
    if stored.metadata.deletion_timestamp.is_some() {
        return (
            component_name,
            Review::allow(format!("cluster {cluster_name} is being deleted")),
        );
    }
    let cluster = match stored.parse(ctx.rules()) {
        Ok(cluster) => cluster,
        Err(errors) => {
            return (
                component_name,
                Review::deny(format!(
                    "cluster {cluster_name} has an invalid spec ({}): nothing leaves until it is fixed",
                    crate::validation::describe(&errors)
                )),
            );
        }
    };
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
    let Ok(mut state) = tokio::time::timeout(STATE_WAIT, state.lock()).await else {
        return (
            component_name,
            Review::deny("the operator is busy with this cluster: retry"),
        );
    };
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
    pods.push(Arc::new(pod.clone()));
    let nodes = ctx.nodes.state();
    let intervals = kernel_config::heartbeat_intervals(&cluster);
    let kernel = ctx
        .kernel
        .kernel_view(namespace, &cluster_name, &pods, &intervals)
        .await;
    let obs = observation::build(
        now_millis(),
        &cluster,
        &pods,
        &nodes,
        kernel,
        strategy,
        intervals,
    );

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
        let recorded = tokio::time::timeout(RECORD_WAIT, patch_progress(ctx, &cluster, &record))
            .await
            .unwrap_or_else(|_| Err(kube::Error::Service("timed out".into())));
        if let Err(e) = recorded {
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

/// The pod belongs to a cluster that is gone, through the owner chain the garbage collector
/// follows: owned by the cluster itself (CN), or by a StatefulSet that the cluster owned or
/// that is itself gone or being deleted (LOG, TN, proxy). Unknown answers are "no".
async fn owned_by_removed_cluster(
    ctx: &Context,
    namespace: &str,
    pod: &Pod,
    cluster_name: &str,
) -> bool {
    use k8s_openapi::api::apps::v1::StatefulSet;
    let Some(owner) = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    else {
        return false;
    };
    match owner.kind.as_str() {
        "MatrixOneCluster" => owner.name == cluster_name,
        "StatefulSet" => {
            let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), namespace);
            match api.get_opt(&owner.name).await {
                Ok(None) => true,
                Ok(Some(sts)) => {
                    sts.metadata.uid.as_deref() != Some(owner.uid.as_str())
                        || sts.metadata.deletion_timestamp.is_some()
                        || sts
                            .metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .any(|o| o.kind == "MatrixOneCluster" && o.name == cluster_name)
                }
                Err(_) => false,
            }
        }
        _ => false,
    }
}
