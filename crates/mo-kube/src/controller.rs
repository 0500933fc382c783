//! The `MatrixOneCluster` controller: on every change of a cluster's objects (its pods, their
//! nodes, its disruption budgets, the cluster itself) and at least every tick, observe (API
//! server + kernel), let the decision core decide, persist its progress record in the status,
//! then act.
//!
//! Order matters and is the safety argument: the record (and any template version an action
//! will change) is written to the API server *before* the action is carried out, so an
//! operator killed at any point resumes from a record that covers every action it may have
//! taken; each action is idempotent and guarded by the pod UID it names.

use crate::crd::{FIELD_MANAGER, FINALIZER, MatrixOneCluster, MatrixOneClusterStatus};
use crate::events::{EventPublisher, EventType};
use crate::kernel::KernelClients;
use crate::kernel_config;
use crate::metrics::{ActionLabels, ClusterLabels, DrainLabels, Metrics};
use crate::observation::{self, component_of};
use crate::resources::{self, LABEL_CLUSTER, LABEL_PREPULL};
use crate::status;
use crate::validation::{self, FieldError, OperatorRules, StoredCluster};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action as Requeue, Config as ControllerConfig, Controller};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use mo_core::{
    Action, ActionError, ActionOutput, ActionResult, Component, Millis, Policy, PolicyInput,
    PolicyNote, SafeConfig, SafePolicy,
};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(String),
    #[error("cluster object has no {0}")]
    Incomplete(&'static str),
    #[error("{0}")]
    NotLeading(#[from] crate::leader::NotLeading),
    #[error("the reconcile panicked: {0}")]
    Panicked(String),
    /// The API server refuses an object the spec makes (422, 400).
    #[error("{object}: refused by the API server: {message}")]
    Refused { object: String, message: String },
}

/// An API error on object `object` (`StatefulSet mo-log`): a refusal of what the spec makes is
/// named as such; anything else is an error to retry.
fn refused(object: String) -> impl FnOnce(kube::Error) -> Error {
    move |e| match e {
        kube::Error::Api(s)
            if s.code == 422
                || s.code == 400
                // The namespace's Pod Security level refuses the pod (a hostPath, a custom
                // security context): the spec's doing, named; RBAC's 403s stay errors.
                || (s.code == 403 && s.message.contains("PodSecurity")) =>
        {
            Error::Refused {
                object,
                message: s.message,
            }
        }
        other => Error::Kube(other),
    }
}

/// The API clients of the operator: `requests` bounds every call (a hung connection is an
/// error, not a wait); `watches` streams without a read timeout (kube-runtime's watcher has
/// its own idle timeout).
#[derive(Clone)]
pub struct Clients {
    pub requests: Client,
    pub watches: Client,
}

impl Clients {
    /// Both from one configuration; `timeout` bounds each request's wait for an answer.
    pub fn new(config: kube::Config, timeout: Duration) -> Result<Clients, kube::Error> {
        let watches = Client::try_from(config.clone())?;
        let mut bounded = config;
        bounded.read_timeout = Some(timeout);
        bounded.write_timeout = Some(timeout);
        // The timeout counts from the request, not from when its pooled connection went idle.
        bounded.reset_reader_on_write = true;
        Ok(Clients {
            requests: Client::try_from(bounded)?,
            watches,
        })
    }
}

#[derive(Clone, Debug)]
pub struct Settings {
    /// How often each cluster is observed and decided on while something is under way (the
    /// core's timers: stability windows, resends, stall clocks).
    pub tick: Duration,
    /// How often a calm cluster is observed (no rollout, drain, removal or hold, every pod
    /// Ready): the age its kernel reading can reach. Watch events still wake it at once, and
    /// disruption reviews read the kernel afresh.
    pub idle_tick: Duration,
    /// Watch events of one cluster closer together than this wake one reconcile.
    pub debounce: Duration,
    /// The kernel of one cluster is read at most once per this (a burst of watch events does
    /// not become a burst of RPCs).
    pub min_kernel_read_gap: Duration,
    /// Owned objects are re-applied at least this often: a safety net, since a change of one
    /// by anyone is seen by its watch and repaired at once.
    pub reapply_every: Duration,
    /// Identity for events (the pod name in a deployment).
    pub instance: String,
    /// Only clusters (and pods) of this namespace; all namespaces when unset.
    pub namespace: Option<String>,
    /// The preStop drain hook CN pods are created with (none: no hook).
    pub drain_hook: Option<resources::DrainHook>,
    /// What the operator's configuration allows of a spec (hostPath directories).
    pub rules: OperatorRules,
}

/// What the controller keeps per cluster between ticks (rebuilt from the status on restart).
#[derive(Default)]
pub(crate) struct ClusterState {
    pub(crate) policy: Option<SafePolicy>,
    pub(crate) config: Option<SafeConfig>,
    results: Vec<ActionResult>,
    applied: Option<(u64, Instant)>,
    last_status: Option<MatrixOneClusterStatus>,
    /// The template versions this process last recorded: the cached object's status may lag
    /// behind our own writes, and a stale version would recreate a pod on the old image.
    templates: Option<BTreeMap<String, String>>,
    /// Budgets last applied (applied again only when they change).
    budgets: Option<BTreeMap<Component, crate::protection::Budget>>,
    /// The LOG bootstrap decision this process last recorded (the cached status may lag).
    bootstrap: Option<crate::crd::LogBootstrap>,
    /// The Secrets the spec names, found carrying the opt-in label, and when.
    secrets_checked: Option<(Vec<String>, Instant)>,
    /// When the kernel was last read for this cluster.
    kernel_read_at: Option<Instant>,
}

pub struct Context {
    pub(crate) client: Client,
    watch_client: Client,
    /// The fence every act runs inside (see [`crate::leader`]).
    pub leadership: crate::leader::Leadership,
    pub(crate) kernel: Arc<KernelClients>,
    pub metrics: Arc<Metrics>,
    events: EventPublisher,
    pub(crate) pods: Store<Pod>,
    pub(crate) nodes: Store<Node>,
    states: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<ClusterState>>>>,
    wakeups: Arc<Wakeups>,
    settings: Settings,
}

/// Changes seen by the pod and node caches, turned into reconciles of the clusters they
/// concern (one watch per kind feeds both the caches and the controller).
#[derive(Default)]
struct Wakeups {
    /// Set while the controller runs; before that its first pass covers every cluster.
    to: Mutex<Option<tokio::sync::mpsc::UnboundedSender<ObjectRef<StoredCluster>>>>,
    /// The first change per cluster (`namespace/name`) not yet answered by a reconcile.
    since: Mutex<BTreeMap<String, Instant>>,
    /// What the core reads of each node, hashed: node status updates that change none of it
    /// wake nobody.
    nodes: Mutex<BTreeMap<String, u64>>,
    /// Each owned object's spec as last seen (`kind/namespace/name` → its generation, or its
    /// version for kinds without one).
    owned: Mutex<BTreeMap<String, String>>,
    /// Clusters (`namespace/name`) one of whose owned objects was changed or deleted: their
    /// next reconcile applies them again.
    drifted: Mutex<BTreeSet<String>>,
}

impl Wakeups {
    fn wake(&self, cluster: ObjectRef<StoredCluster>) {
        let to = self.to.lock().expect("wakeups lock");
        let Some(to) = to.as_ref() else {
            return;
        };
        let key = format!(
            "{}/{}",
            cluster.namespace.as_deref().unwrap_or_default(),
            cluster.name
        );
        self.since
            .lock()
            .expect("wakeups lock")
            .entry(key)
            .or_insert_with(Instant::now);
        let _ = to.send(cluster);
    }

    fn on_pod(&self, pod: &Pod) {
        if let Some(cluster) = cluster_of(pod) {
            self.wake(cluster);
        }
    }

    fn on_node(&self, node: &Node, pods: &Store<Pod>) {
        let seen = hash_of(&node_essentials(node));
        let changed = self
            .nodes
            .lock()
            .expect("wakeups lock")
            .insert(node.name_any(), seen)
            != Some(seen);
        if changed {
            for cluster in clusters_on_node(pods, &node.name_any()) {
                self.wake(cluster);
            }
        }
    }

    /// An owned object (Service, ConfigMap, StatefulSet, budget) seen by its watch.
    fn on_owned(&self, kind: &str, meta: &ObjectMeta, deleted: bool) {
        let (Some(ns), Some(name), Some(cluster)) = (
            meta.namespace.as_deref(),
            meta.name.as_deref(),
            meta.labels
                .as_ref()
                .and_then(|l| l.get(resources::LABEL_CLUSTER)),
        ) else {
            return;
        };
        let key = format!("{kind}/{ns}/{name}");
        let changed = {
            let mut owned = self.owned.lock().expect("wakeups lock");
            if deleted {
                owned.remove(&key);
                true
            } else {
                let spec = meta
                    .generation
                    .map(|g| g.to_string())
                    .or_else(|| meta.resource_version.clone())
                    .unwrap_or_default();
                owned.insert(key, spec.clone()) != Some(spec)
            }
        };
        if changed {
            self.drifted
                .lock()
                .expect("wakeups lock")
                .insert(format!("{ns}/{cluster}"));
            self.wake(ObjectRef::new(cluster).within(ns));
        }
    }

    /// Whether an owned object of the cluster changed since the last call (and forget it).
    fn take_drift(&self, ns: &str, name: &str) -> bool {
        self.drifted
            .lock()
            .expect("wakeups lock")
            .remove(&format!("{ns}/{name}"))
    }

    fn answered(&self, ns: &str, name: &str) -> Option<Instant> {
        self.since
            .lock()
            .expect("wakeups lock")
            .remove(&format!("{ns}/{name}"))
    }
}

impl Context {
    pub(crate) fn state(&self, uid: &str) -> Arc<tokio::sync::Mutex<ClusterState>> {
        self.states
            .lock()
            .expect("states lock")
            .entry(uid.to_string())
            .or_default()
            .clone()
    }

    /// The API client requests go through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// What the operator's configuration allows of a spec.
    pub(crate) fn rules(&self) -> &OperatorRules {
        &self.settings.rules
    }

    fn forget(&self, uid: &str) {
        self.states.lock().expect("states lock").remove(uid);
    }

    pub(crate) async fn event(
        &self,
        cluster: &impl Resource<DynamicType = ()>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let note: String = note.chars().take(1000).collect();
        if let Err(e) = self
            .events
            .publish(&cluster.object_ref(&()), type_, reason, &note)
            .await
        {
            tracing::warn!(error = %e, "publishing an event failed");
        }
    }
}

pub(crate) fn now_millis() -> Millis {
    Millis(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

impl Context {
    /// Starts the pod and node caches (ready when this returns); the controller runs with
    /// [`run`], and the disruption reviews use the same state.
    pub async fn start(
        clients: Clients,
        kernel: Arc<KernelClients>,
        metrics: Arc<Metrics>,
        settings: Settings,
        leadership: crate::leader::Leadership,
    ) -> Arc<Context> {
        let Clients {
            requests: client,
            watches: watch_client,
        } = clients;
        let pod_selector = format!("{}={}", resources::LABEL_MANAGED_BY, resources::MANAGED_BY);
        let wakeups = Arc::new(Wakeups::default());
        let on_pod = wakeups.clone();
        let pods = crate::cache::cache_with(
            scoped::<Pod>(&watch_client, settings.namespace.as_deref()),
            watcher::Config::default().labels(&pod_selector),
            crate::observation::trim_pod,
            move |pod| on_pod.on_pod(pod),
        );
        let (on_node, pods_by_node) = (wakeups.clone(), pods.clone());
        let nodes = crate::cache::cache_with(
            Api::<Node>::all(watch_client.clone()),
            watcher::Config::default(),
            crate::observation::trim_node,
            move |node| on_node.on_node(node, &pods_by_node),
        );
        let _ = pods.wait_until_ready().await;
        let _ = nodes.wait_until_ready().await;
        let events = EventPublisher::new(client.clone(), FIELD_MANAGER, &settings.instance);
        Arc::new(Context {
            client,
            watch_client,
            leadership,
            kernel,
            metrics,
            events,
            pods,
            nodes,
            states: Mutex::new(BTreeMap::new()),
            wakeups,
            settings,
        })
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    context: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let namespace = context.settings.namespace.as_deref();
    // Read as stored, spec unread: one cluster's unreadable spec is that cluster's refusal,
    // never a watch failing for every cluster.
    let clusters = scoped::<StoredCluster>(&context.watch_client, namespace);
    let managed = watcher::Config::default().labels(&format!(
        "{}={}",
        resources::LABEL_MANAGED_BY,
        resources::MANAGED_BY
    ));
    let (to, woken) = tokio::sync::mpsc::unbounded_channel();
    *context.wakeups.to.lock().expect("wakeups lock") = Some(to);
    let woken = futures::stream::unfold(woken, |mut rx| async move {
        rx.recv().await.map(|cluster| (cluster, rx))
    });
    // Owned objects are watched by their metadata alone (nothing of them is cached): a change
    // of one by anyone wakes its cluster, which applies them again.
    watch_owned::<StatefulSet>(&context, managed.clone());
    watch_owned::<Service>(&context, managed.clone());
    watch_owned::<ConfigMap>(&context, managed.clone());
    watch_owned::<PodDisruptionBudget>(&context, managed);
    // The clusters' own cache, without field ownership (most of a cluster object once its
    // status has been written a few times; never read).
    let (reader, writer) = kube::runtime::reflector::store();
    let clusters = kube::runtime::reflector(
        writer,
        watcher(clusters, watcher::Config::default())
            .modify(|cluster: &mut StoredCluster| cluster.managed_fields_mut().clear()),
    )
    .default_backoff()
    .applied_objects();
    Controller::for_stream(clusters, reader)
        .with_config(ControllerConfig::default().debounce(context.settings.debounce))
        .reconcile_on(woken)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context.clone())
        .for_each(|result| {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile failed");
            }
            futures::future::ready(())
        })
        .await;
    *context.wakeups.to.lock().expect("wakeups lock") = None;
}

fn watch_owned<K>(context: &Context, config: watcher::Config)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let kind = K::kind(&()).to_string();
    let wakeups = context.wakeups.clone();
    // Metadata-only requests: the objects themselves are never needed here.
    let api = scoped::<PartialObjectMeta<K>>(
        &context.watch_client,
        context.settings.namespace.as_deref(),
    );
    let stream = watcher(api, config)
        .default_backoff()
        .for_each(move |event| {
            match event {
                Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => {
                    wakeups.on_owned(&kind, &m.metadata, false)
                }
                Ok(watcher::Event::Delete(m)) => wakeups.on_owned(&kind, &m.metadata, true),
                _ => {}
            }
            futures::future::ready(())
        });
    tokio::spawn(stream);
}

/// The cluster a managed pod belongs to (its label; same namespace).
fn cluster_of(pod: &Pod) -> Option<ObjectRef<StoredCluster>> {
    let name = pod.labels().get(resources::LABEL_CLUSTER)?;
    Some(ObjectRef::new(name).within(&pod.namespace()?))
}

/// Clusters with a pod on `node`, from the pod cache.
fn clusters_on_node(pods: &Store<Pod>, node: &str) -> Vec<ObjectRef<StoredCluster>> {
    let mut clusters: Vec<ObjectRef<StoredCluster>> = pods
        .state()
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| n == node)
        })
        .filter_map(|p| cluster_of(p))
        .collect();
    clusters.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    clusters.dedup();
    clusters
}

/// What the core reads of a node: cordon, taints, readiness, cached images, deletion.
fn node_essentials(node: &Node) -> serde_json::Value {
    let spec = node.spec.as_ref();
    let status = node.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone());
    let mut images: Vec<&String> = status
        .and_then(|s| s.images.as_ref())
        .into_iter()
        .flatten()
        .flat_map(|i| i.names.iter().flatten())
        .collect();
    images.sort();
    serde_json::json!({
        "unschedulable": spec.and_then(|s| s.unschedulable),
        "taints": spec.and_then(|s| s.taints.as_ref()),
        "ready": ready,
        "images": images,
        "deleting": node.metadata.deletion_timestamp.is_some(),
    })
}

fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

fn error_policy(_cluster: Arc<StoredCluster>, error: &Error, ctx: Arc<Context>) -> Requeue {
    tracing::warn!(%error, "reconcile error; retrying");
    Requeue::requeue(ctx.settings.tick)
}

async fn reconcile(cluster: Arc<StoredCluster>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let started = Instant::now();
    let ns = cluster.namespace().ok_or(Error::Incomplete("namespace"))?;
    let woken_at = ctx.wakeups.answered(&ns, &cluster.name_any());
    let api: Api<StoredCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let work = finalizer(&api, FINALIZER, cluster.clone(), |event| async {
        match event {
            FinalizerEvent::Apply(stored) => match stored.parse(&ctx.settings.rules) {
                Ok(cluster) => apply(Arc::new(cluster), ctx.clone()).await,
                Err(errors) => refuse(&stored, &errors, &ctx).await,
            },
            FinalizerEvent::Cleanup(stored) => cleanup(stored, ctx.clone()).await,
        }
    });
    // Acts only inside the lease; a panic is this cluster's error, never the controller's end.
    let result = match ctx.leadership.act(catch_panic(work)).await {
        Err(not_leading) => {
            ctx.metrics.fenced_acts.inc();
            Err(Error::NotLeading(not_leading))
        }
        Ok(Err(panic)) => {
            ctx.metrics.reconcile_panics.inc();
            tracing::error!(cluster = %cluster.name_any(), namespace = %ns, %panic, "reconcile panicked");
            ctx.event(&*cluster, EventType::Warning, "ReconcilePanicked", format!(
                "the operator failed on this cluster ({panic}); it retries, and other clusters are unaffected"
            ))
            .await;
            Err(Error::Panicked(panic))
        }
        Ok(Ok(result)) => result.map_err(|e| Error::Finalizer(e.to_string())),
    };
    ctx.metrics
        .observe_reconcile(started.elapsed(), result.is_ok());
    if let Some(woken_at) = woken_at {
        // From the watch event to this reconcile's actions carried out.
        ctx.metrics.observe_reaction(woken_at.elapsed());
    }
    result
}

/// A cluster whose spec cannot be used: every refusal in its conditions and one event, and
/// nothing changed in the cluster until the spec is fixed.
async fn refuse(
    stored: &StoredCluster,
    errors: &[FieldError],
    ctx: &Context,
) -> Result<Requeue, Error> {
    let uid = stored.uid().ok_or(Error::Incomplete("uid"))?;
    let state = ctx.state(&uid);
    let mut state = state.lock().await;
    record_refusal(stored, &stored.status(), errors, &mut state, ctx).await
}

async fn record_refusal(
    cluster: &impl Resource<DynamicType = ()>,
    previous: &MatrixOneClusterStatus,
    errors: &[FieldError],
    state: &mut ClusterState,
    ctx: &Context,
) -> Result<Requeue, Error> {
    let text = validation::describe(errors);
    let meta = cluster.meta();
    let status = status::invalid_spec(meta.generation, previous, &text);
    ctx.metrics
        .spec_invalid
        .get_or_create(&cluster_labels(cluster))
        .set(1);
    if state.last_status.as_ref() != Some(&status) {
        let api: Api<StoredCluster> = Api::namespaced(
            ctx.client.clone(),
            meta.namespace.as_deref().unwrap_or_default(),
        );
        patch_status(&api, meta.name.as_deref().unwrap_or_default(), &status).await?;
        ctx.event(cluster, EventType::Warning, "InvalidSpec", text)
            .await;
        state.last_status = Some(status);
    }
    Ok(Requeue::requeue(ctx.settings.tick * 10))
}

/// Runs `work`, turning a panic into its message.
pub async fn catch_panic<F: std::future::Future>(work: F) -> Result<F::Output, String> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(work)
        .catch_unwind()
        .await
        .map_err(|panic| {
            panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into())
        })
}

async fn cleanup(cluster: Arc<StoredCluster>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let uid = cluster.uid().ok_or(Error::Incomplete("uid"))?;
    ctx.forget(&uid);
    ctx.kernel.forget(
        &cluster.namespace().unwrap_or_default(),
        &cluster.name_any(),
    );
    let labels = cluster_labels(&*cluster);
    ctx.metrics.rollout_phase.remove(&labels);
    ctx.metrics.rollout_halted.remove(&labels);
    ctx.metrics.creation_slow.remove(&labels);
    ctx.metrics.holds.remove(&labels);
    ctx.metrics.drains_alarmed.remove(&labels);
    ctx.metrics.spec_invalid.remove(&labels);
    for stage in DRAIN_STAGES {
        ctx.metrics.drains.remove(&DrainLabels {
            namespace: labels.namespace.clone(),
            cluster: labels.cluster.clone(),
            stage: stage.into(),
        });
    }
    ctx.event(
        &*cluster,
        EventType::Normal,
        "Deleting",
        "owned objects are removed by the garbage collector (graceful pod deletion)".into(),
    )
    .await;
    Ok(Requeue::await_change())
}

fn cluster_labels(cluster: &impl Resource<DynamicType = ()>) -> ClusterLabels {
    ClusterLabels {
        namespace: cluster.namespace().unwrap_or_default(),
        cluster: cluster.name_any(),
    }
}

async fn apply(cluster: Arc<MatrixOneCluster>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let ns = cluster.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = cluster.name_any();
    let uid = cluster.uid().ok_or(Error::Incomplete("uid"))?;
    let state = ctx.state(&uid);
    let mut state = state.lock().await;
    let api: Api<StoredCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let previous = cluster.status.clone().unwrap_or_default();

    // Checked when the spec was read (`StoredCluster::parse`); a refusal here is a bug's.
    let (strategy, config) = match (cluster.spec.strategy(), cluster.spec.safe_config()) {
        (Ok(s), Ok(c)) => (s, c),
        (Err(e), _) | (_, Err(e)) => {
            let text = e.to_string();
            let (field, message) = text.split_once(": ").unwrap_or(("spec", &text));
            let errors = [FieldError {
                field: field.into(),
                message: message.into(),
            }];
            return record_refusal(&*cluster, &previous, &errors, &mut state, &ctx).await;
        }
    };
    ctx.metrics
        .spec_invalid
        .get_or_create(&cluster_labels(&*cluster))
        .set(0);
    if state.policy.is_none() || state.config.as_ref() != Some(&config) {
        // A restarted operator (or a changed spec) resumes from the persisted record.
        let record = state
            .policy
            .as_ref()
            .and_then(|p| p.progress_record())
            .or_else(|| previous.progress.clone());
        state.policy = Some(match record {
            Some(record) => SafePolicy::resume(config.clone(), &record),
            None => SafePolicy::new(config.clone()),
        });
        state.config = Some(config);
    }

    let mut templates = state
        .templates
        .clone()
        .unwrap_or_else(|| previous.template_versions.clone());
    for c in Component::ALL {
        templates
            .entry(c.as_str().to_string())
            .or_insert_with(|| cluster.spec.version.clone());
    }
    if state.templates.is_none() && previous.template_versions != templates {
        // Recorded before the first object is created from it.
        let mut first = previous.clone();
        first.template_versions = templates.clone();
        patch_status(&api, &name, &first).await?;
    }
    state.templates = Some(templates.clone());

    // The LOG bootstrap is decided once and recorded before any LOG pod can start with it.
    let bootstrap = match state
        .bootstrap
        .clone()
        .or_else(|| previous.log_bootstrap.clone())
    {
        Some(b) => b,
        None => {
            let b = resources::initial_log_bootstrap(&cluster);
            patch_status_value(&api, &name, serde_json::json!({"logBootstrap": b})).await?;
            b
        }
    };
    state.bootstrap = Some(bootstrap.clone());
    // A configuration the kernel cannot read (a bad override) stops here, naming the field.
    let config_map = match resources::config_map(&cluster, Some(&bootstrap)) {
        Ok(c) => c,
        Err(e) => {
            let text = e.to_string();
            let (field, message) = text.split_once(": ").unwrap_or(("spec", &text));
            let errors = [FieldError {
                field: field.into(),
                message: message.into(),
            }];
            return record_refusal(&*cluster, &previous, &errors, &mut state, &ctx).await;
        }
    };

    if ctx.wakeups.take_drift(&ns, &name) {
        // Someone changed or deleted an owned object: apply every one again now.
        state.applied = None;
        state.budgets = None;
    }
    // No pod names a Secret its owner did not open to clusters.
    let secrets = crate::secrets::referenced(&cluster);
    let fresh = state.secrets_checked.as_ref().is_some_and(|(names, at)| {
        *names == secrets.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>()
            && at.elapsed() < ctx.settings.reapply_every
    });
    if !fresh {
        let errors = crate::secrets::verify(&ctx.client, &ns, &secrets).await?;
        if !errors.is_empty() {
            state.secrets_checked = None;
            return record_refusal(&*cluster, &previous, &errors, &mut state, &ctx).await;
        }
        state.secrets_checked = Some((
            secrets.into_iter().map(|(_, n)| n).collect(),
            Instant::now(),
        ));
    }
    let pods = pods_of_cluster(&ctx, &ns, &name);
    let children = ensure_children(&cluster, &templates, config_map, &pods, &mut state, &ctx).await;
    if let Err(Error::Refused { object, message }) = children {
        // The API server refuses what the spec makes: this cluster waits, named; the others go on.
        let errors = [FieldError {
            field: object,
            message: format!("refused by the API server: {message}"),
        }];
        state.applied = None;
        return record_refusal(&*cluster, &previous, &errors, &mut state, &ctx).await;
    }
    children?;

    let nodes: Vec<Arc<Node>> = ctx.nodes.state();
    let intervals = kernel_config::heartbeat_intervals(&cluster);
    if let Some(last) = state.kernel_read_at {
        // Wait rather than reuse: a reading is as old as the decision it feeds.
        let gap = ctx
            .settings
            .min_kernel_read_gap
            .saturating_sub(last.elapsed());
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    state.kernel_read_at = Some(Instant::now());
    let kernel = ctx.kernel.kernel_view(&ns, &name, &pods, &intervals).await;
    if kernel.hakeeper.is_err() {
        ctx.metrics
            .kernel_unreachable
            .get_or_create(&cluster_labels(&*cluster))
            .inc();
    }
    if !bootstrap.done
        && let Ok(details) = kernel.hakeeper.as_ref()
        && bootstrapped(details, &bootstrap)
    {
        // HAKeeper serves the cluster: later LOG pods start without the bootstrap settings.
        let done = crate::crd::LogBootstrap {
            done: true,
            ..bootstrap.clone()
        };
        patch_status_value(&api, &name, serde_json::json!({"logBootstrap": done})).await?;
        ctx.event(
            &*cluster,
            EventType::Normal,
            "Bootstrapped",
            format!(
                "HAKeeper serves the cluster ({}); LOG pods start without the bootstrap settings from now on",
                bootstrap.members.join(", ")
            ),
        )
        .await;
        state.bootstrap = Some(done);
    }
    let missing_classes = missing_storage_classes(&ctx, &cluster).await;
    let problems = crate::problems::find(&cluster, &pods, &missing_classes);
    let now = now_millis();
    let observation = observation::build(now, &cluster, &pods, &nodes, kernel, strategy, intervals);
    let results = std::mem::take(&mut state.results);
    let state = &mut *state;
    let policy = state.policy.as_mut().expect("set above");
    let decision = policy.decide(PolicyInput {
        observation: &observation,
        results: &results,
    });

    // Record first: the progress record and every template version an action will change.
    for action in &decision.actions {
        if let Action::RestartPod { pod, version, .. } = action
            && let Some(component) = observation.pod(pod).map(|p| p.component)
        {
            templates.insert(component.as_str().to_string(), version.clone());
        }
    }
    let mut new_status = status::build(
        &cluster,
        &previous,
        &observation,
        policy,
        &templates,
        &pods,
        &problems,
    );
    new_status.log_bootstrap = state.bootstrap.clone();
    if state.last_status.as_ref() != Some(&new_status) || !decision.actions.is_empty() {
        patch_status(&api, &name, &new_status).await?;
        state.last_status = Some(new_status.clone());
    }
    state.templates = Some(templates.clone());
    update_gauges(&ctx.metrics, &cluster, &new_status, policy);
    let protection = crate::protection::compute(&observation, policy);
    protect(&ctx, &cluster, &pods, &protection, &mut state.budgets).await?;

    for note in &decision.notes {
        let (type_, reason, text) = describe_note(note);
        ctx.event(&*cluster, type_, reason, text).await;
    }
    let mut results = Vec::with_capacity(decision.actions.len());
    for action in decision.actions {
        let result = execute(&ctx, &cluster, &templates, &pods, &action).await;
        let kind = action_kind(&action);
        ctx.metrics
            .actions
            .get_or_create(&ActionLabels {
                action: kind.into(),
                result: if result.is_ok() { "ok" } else { "error" }.into(),
            })
            .inc();
        match &result {
            Ok(_) => {
                tracing::info!(cluster = %name, action = ?action, "carried out");
                if matches!(
                    action,
                    Action::DeletePod { .. }
                        | Action::RestartPod { .. }
                        | Action::SetProxyServing { .. }
                ) {
                    ctx.event(&*cluster, EventType::Normal, kind, describe_action(&action))
                        .await;
                }
            }
            Err(e) => {
                tracing::warn!(cluster = %name, action = ?action, error = %e, "action failed; the core re-checks before retrying");
                ctx.event(
                    &*cluster,
                    EventType::Warning,
                    "ActionFailed",
                    format!("{}: {e}", describe_action(&action)),
                )
                .await;
            }
        }
        results.push(ActionResult { action, result });
    }
    let calm = results.is_empty()
        && policy.holds().is_empty()
        && policy.record().drains.iter().all(|d| !d.is_active())
        && observation.desired.removals.is_empty()
        && new_status
            .conditions
            .iter()
            .any(|c| c.type_ == status::READY && c.status == "True")
        && policy
            .record()
            .rollout
            .as_ref()
            .is_none_or(|r| r.status != mo_core::rollout::RolloutStatus::Running);
    state.results = results;
    Ok(Requeue::requeue(if calm {
        ctx.settings.idle_tick.max(ctx.settings.tick)
    } else {
        ctx.settings.tick
    }))
}

/// The cluster's pods as the cache has them.
/// The cluster's pods, shared with the cache (a reconcile never copies them).
pub(crate) fn pods_of_cluster(ctx: &Context, ns: &str, name: &str) -> Vec<Arc<Pod>> {
    ctx.pods
        .state()
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_CLUSTER))
                .map(String::as_str)
                == Some(name)
        })
        .cloned()
        .collect()
}

/// Writes only the progress record (a disruption review changed it between ticks).
pub(crate) async fn patch_progress(
    ctx: &Context,
    cluster: &MatrixOneCluster,
    record: &str,
) -> Result<(), kube::Error> {
    let api: Api<StoredCluster> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let body = serde_json::json!({"status": {"progress": record}});
    api.patch_status(
        &cluster.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&body),
    )
    .await?;
    Ok(())
}

async fn patch_status(
    api: &Api<StoredCluster>,
    name: &str,
    status: &MatrixOneClusterStatus,
) -> Result<(), Error> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(status_patch(status)),
    )
    .await?;
    Ok(())
}

/// The merge patch of `status`. A merge patch keeps what it omits, so a field that is now
/// unset is sent as null: a finished rollout must not keep showing what it last waited on.
fn status_patch(status: &MatrixOneClusterStatus) -> serde_json::Value {
    let mut value = serde_json::to_value(status).expect("a status serializes");
    if let Some(rollout) = value.get_mut("rollout").and_then(|r| r.as_object_mut()) {
        rollout
            .entry("waitingOn")
            .or_insert(serde_json::Value::Null);
    }
    serde_json::json!({ "status": value })
}

/// Merges `fields` into the status (one field recorded on its own, before acting on it).
async fn patch_status_value(
    api: &Api<StoredCluster>,
    name: &str,
    fields: serde_json::Value,
) -> Result<(), Error> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": fields })),
    )
    .await?;
    Ok(())
}

/// Every initial HAKeeper member runs its replica and every log shard exists: the bootstrap
/// is over.
fn bootstrapped(details: &mo_core::ClusterDetails, bootstrap: &crate::crd::LogBootstrap) -> bool {
    let hakeeper = details.log_shards.iter().find(|s| s.shard_id == 0);
    let members_up = hakeeper
        .is_some_and(|s| s.replicas.iter().filter(|r| r.up).count() >= bootstrap.members.len());
    let shards = details
        .log_shards
        .iter()
        .filter(|s| s.shard_id != 0)
        .count();
    members_up && shards >= bootstrap.shards.max(1) as usize
}

/// The storage classes the spec names that the API server does not have (a failed read
/// reports nothing: it is not evidence).
async fn missing_storage_classes(ctx: &Context, cluster: &MatrixOneCluster) -> Vec<String> {
    let api: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(ctx.client.clone());
    let mut missing = Vec::new();
    for (_, class) in crate::problems::storage_classes(cluster) {
        if let Ok(None) = api.get_opt(&class).await {
            missing.push(class);
        }
    }
    missing
}

fn hash_of(value: &impl Serialize) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(value)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// Server-side apply of Services, the ConfigMap and the StatefulSets (only when they changed,
/// or now and then to repair drift); CN pods the spec asks for are created when missing.
async fn ensure_children(
    cluster: &MatrixOneCluster,
    templates: &BTreeMap<String, String>,
    config: ConfigMap,
    pods: &[Arc<Pod>],
    state: &mut ClusterState,
    ctx: &Context,
) -> Result<(), Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let version_of = |c: Component| {
        templates
            .get(c.as_str())
            .cloned()
            .unwrap_or_else(|| cluster.spec.version.clone())
    };
    let services: Vec<Service> = Component::ALL
        .iter()
        .map(|c| resources::headless_service(cluster, *c))
        .chain(std::iter::once(resources::sql_service(cluster)))
        .collect();
    let sets: Vec<StatefulSet> = [Component::Log, Component::Tn, Component::Proxy]
        .iter()
        .map(|c| resources::statefulset(cluster, *c, &version_of(*c)))
        .collect();
    let hash = hash_of(&(&services, &config, &sets));
    let due = state
        .applied
        .is_none_or(|(h, at)| h != hash || at.elapsed() >= ctx.settings.reapply_every);
    if due {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let svc_api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
        for s in &services {
            svc_api
                .patch(&s.name_any(), &params, &Patch::Apply(s))
                .await
                .map_err(refused(format!("Service {}", s.name_any())))?;
        }
        let cm_api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
        cm_api
            .patch(&config.name_any(), &params, &Patch::Apply(&config))
            .await
            .map_err(refused(format!("ConfigMap {}", config.name_any())))?;
        let sts_api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
        for s in &sets {
            sts_api
                .patch(&s.name_any(), &params, &Patch::Apply(s))
                .await
                .map_err(refused(format!("StatefulSet {}", s.name_any())))?;
        }
        state.applied = Some((hash, Instant::now()));
    }
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let existing: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    for group in &cluster.spec.cn.groups {
        for ordinal in 0..group.replicas {
            let pod_name = resources::pod_name(&name, &format!("{}-{ordinal}", group.name));
            if existing.contains(&pod_name) {
                continue;
            }
            let pod = resources::cn_pod(
                cluster,
                &group.name,
                ordinal,
                &version_of(Component::Cn),
                ctx.settings.drain_hook.as_ref(),
            );
            match pod_api.create(&PostParams::default(), &pod).await {
                Ok(_) => tracing::info!(pod = %pod_name, "created CN pod"),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(refused(format!("Pod {pod_name}"))(e)),
            }
        }
    }
    // Pre-pull pods that finished have done their job.
    for pod in pods {
        let is_prepull = pod
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(LABEL_PREPULL));
        let finished = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        );
        if is_prepull && finished && pod.metadata.deletion_timestamp.is_none() {
            let _ = pod_api
                .delete(&pod.name_any(), &DeleteParams::default())
                .await;
        }
    }
    Ok(())
}

/// Disruption budgets and autoscaler annotations from this tick's observation.
async fn protect(
    ctx: &Context,
    cluster: &MatrixOneCluster,
    pods: &[Arc<Pod>],
    protection: &crate::protection::Protection,
    applied: &mut Option<BTreeMap<Component, crate::protection::Budget>>,
) -> Result<(), Error> {
    use crate::protection::{DO_NOT_DISRUPT, SAFE_TO_EVICT};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let ns = cluster.namespace().unwrap_or_default();
    if applied.as_ref() != Some(&protection.budgets) {
        let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ns);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for (component, budget) in &protection.budgets {
            let pdb = resources::pdb(cluster, *component, budget.min_available(), &budget.reason);
            api.patch(&pdb.name_any(), &params, &Patch::Apply(&pdb))
                .await
                .map_err(refused(format!("PodDisruptionBudget {}", pdb.name_any())))?;
        }
        *applied = Some(protection.budgets.clone());
    }
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    for pod in pods {
        let name = pod.name_any();
        let Some(&pinned) = protection.pinned.get(&name) else {
            continue;
        };
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let current = annotations.get(DO_NOT_DISRUPT).map(String::as_str) == Some("true")
            && annotations.get(SAFE_TO_EVICT).map(String::as_str) == Some("false");
        let absent =
            !annotations.contains_key(DO_NOT_DISRUPT) && !annotations.contains_key(SAFE_TO_EVICT);
        if (pinned && current) || (!pinned && absent) {
            continue;
        }
        let patch = if pinned {
            serde_json::json!({"metadata": {"annotations": {DO_NOT_DISRUPT: "true", SAFE_TO_EVICT: "false"}}})
        } else {
            serde_json::json!({"metadata": {"annotations": {DO_NOT_DISRUPT: null, SAFE_TO_EVICT: null}}})
        };
        match pod_api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            // Gone meanwhile: nothing left to pin.
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn uid_guard(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

fn delete_error(pod: &str, e: kube::Error) -> ActionError {
    match e {
        kube::Error::Api(s) if s.code == 404 => ActionError::DoesNotExist(format!("pod {pod}")),
        kube::Error::Api(s) if s.code == 409 => {
            ActionError::Conflict(format!("pod {pod} is another instance now: {}", s.message))
        }
        kube::Error::Api(s) if s.code == 429 => {
            ActionError::Unavailable(format!("pod {pod}: {}", s.message))
        }
        other => ActionError::Unavailable(format!("pod {pod}: {other}")),
    }
}

async fn execute(
    ctx: &Context,
    cluster: &MatrixOneCluster,
    templates: &BTreeMap<String, String>,
    pods: &[Arc<Pod>],
    action: &Action,
) -> Result<ActionOutput, ActionError> {
    let ns = cluster.namespace().unwrap_or_default();
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    match action {
        // Graceful: the pod's own grace period; never 0, never without the UID guard.
        Action::DeletePod { pod, uid, .. } => pod_api
            .delete(pod, &uid_guard(uid))
            .await
            .map(|_| ActionOutput::Done)
            .map_err(|e| delete_error(pod, e)),
        Action::RestartPod { pod, uid, version } => {
            let component = pods
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(pod.as_str()))
                .and_then(|p| component_of(p))
                .ok_or_else(|| ActionError::DoesNotExist(format!("pod {pod}")))?;
            if component != Component::Cn {
                // The workload recreates the pod from its template: the new version first.
                let sts_api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
                let mut templates = templates.clone();
                templates.insert(component.as_str().into(), version.clone());
                let sts = resources::statefulset(cluster, component, version);
                sts_api
                    .patch(
                        &sts.name_any(),
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&sts),
                    )
                    .await
                    .map_err(|e| ActionError::Unavailable(format!("statefulset: {e}")))?;
            }
            pod_api
                .delete(pod, &uid_guard(uid))
                .await
                .map(|_| ActionOutput::Done)
                .map_err(|e| delete_error(pod, e))
        }
        Action::SetProxyServing { pod, uid, serving } => {
            // Merge patch guarded by the UID: a recreated pod is never relabelled by mistake
            // (it starts in its Service from the template).
            let patch = serde_json::json!({
                "metadata": {
                    "uid": uid,
                    "labels": { resources::LABEL_SERVING: if *serving { "true" } else { "false" } },
                }
            });
            pod_api
                .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ActionOutput::Done)
                .map_err(|e| delete_error(pod, e))
        }
        Action::PrePullImage { node, version } => {
            let pod = resources::prepull_pod(cluster, node, version);
            match pod_api.create(&PostParams::default(), &pod).await {
                Ok(_) => Ok(ActionOutput::Done),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(ActionOutput::Done),
                Err(e) => Err(ActionError::Unavailable(format!("pre-pull pod: {e}"))),
            }
        }
        kernel_call => {
            let name = cluster.name_any();
            let pods = pods_of_cluster(ctx, &ns, &name);
            ctx.kernel.call(&ns, &name, &pods, kernel_call).await
        }
    }
}

fn action_kind(action: &Action) -> &'static str {
    match action {
        Action::SetCnWorkState { .. } => "SetCnWorkState",
        Action::SetRestartService { .. } => "SetRestartService",
        Action::DeleteCnStore { .. } => "DeleteCnStore",
        Action::DeletePod { .. } => "DeletePod",
        Action::RestartPod { .. } => "RestartPod",
        Action::PrePullImage { .. } => "PrePullImage",
        Action::SetProxyServing { .. } => "SetProxyServing",
        Action::TransferLogLeader { .. } => "TransferLogLeader",
        Action::SetTnWalTolerance { .. } => "SetTnWalTolerance",
        Action::BeginDrain { .. } => "BeginDrain",
        Action::CancelDrain { .. } => "CancelDrain",
    }
}

fn describe_action(action: &Action) -> String {
    match action {
        Action::DeletePod { pod, uid, reason } => {
            format!("deleting pod {pod} (uid {uid}): {reason}")
        }
        Action::RestartPod { pod, uid, version } => {
            format!("restarting pod {pod} (uid {uid}) on version {version}")
        }
        Action::SetProxyServing { pod, serving, .. } => {
            if *serving {
                format!("putting proxy {pod} back in the SQL Service")
            } else {
                format!("taking proxy {pod} out of the SQL Service until its clients have left")
            }
        }
        other => format!("{other:?}"),
    }
}

fn describe_note(note: &PolicyNote) -> (EventType, &'static str, String) {
    match note {
        PolicyNote::PhaseStarted { component } => (
            EventType::Normal,
            "RolloutPhaseStarted",
            format!("{component} phase started"),
        ),
        PolicyNote::PhaseFinished { component } => (
            EventType::Normal,
            "RolloutPhaseFinished",
            format!("{component} phase finished; its gate holds"),
        ),
        PolicyNote::UpgradeFinished => (
            EventType::Normal,
            "UpgradeFinished",
            "every component runs the target version and every gate holds".into(),
        ),
        PolicyNote::Holding { subject, reason } => {
            let warning = reason.starts_with("halted")
                || reason.starts_with("rolled back")
                || reason.starts_with("ALARM");
            (
                if warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                "Holding",
                format!("{subject}: {reason}"),
            )
        }
        PolicyNote::Released { subject, reason } => (
            EventType::Normal,
            "DrainConfirmed",
            format!("{subject}: {reason}"),
        ),
        PolicyNote::MovedPastTheCatalog { reason, .. } => {
            (EventType::Warning, "CnMovedPastTheCatalog", reason.clone())
        }
    }
}

fn update_gauges(
    metrics: &Metrics,
    cluster: &MatrixOneCluster,
    status: &MatrixOneClusterStatus,
    policy: &SafePolicy,
) {
    let labels = cluster_labels(cluster);
    let record = policy.record();
    let phase = record.rollout.as_ref().map_or(-1, |r| match r.status {
        mo_core::rollout::RolloutStatus::Complete => r.phases.len() as i64,
        _ => r.phase as i64,
    });
    metrics.rollout_phase.get_or_create(&labels).set(phase);
    let halted = record.rollout.as_ref().is_some_and(|r| {
        matches!(
            r.status,
            mo_core::rollout::RolloutStatus::Halted { .. }
                | mo_core::rollout::RolloutStatus::RolledBack { .. }
        )
    });
    metrics
        .rollout_halted
        .get_or_create(&labels)
        .set(i64::from(halted));
    let creation_slow = record
        .rollout
        .as_ref()
        .is_some_and(|r| r.alarmed && r.status == mo_core::rollout::RolloutStatus::Running);
    metrics
        .creation_slow
        .get_or_create(&labels)
        .set(i64::from(creation_slow));
    metrics
        .holds
        .get_or_create(&labels)
        .set(policy.holds().len() as i64);
    metrics.drains_alarmed.get_or_create(&labels).set(
        record
            .drains
            .iter()
            .filter(|d| d.is_active() && d.alarmed)
            .count() as i64,
    );
    let mut by_stage: BTreeMap<String, i64> = BTreeMap::new();
    for d in &status.drains {
        *by_stage.entry(d.stage.clone()).or_default() += 1;
    }
    for stage in DRAIN_STAGES {
        metrics
            .drains
            .get_or_create(&DrainLabels {
                namespace: labels.namespace.clone(),
                cluster: labels.cluster.clone(),
                stage: stage.into(),
            })
            .set(by_stage.get(stage).copied().unwrap_or(0));
    }
}

/// The drain stages the `drains` gauge reports, one series each.
const DRAIN_STAGES: [&str; 6] = [
    "MarkDraining",
    "MigrateSessions",
    "HandOver",
    "Confirmed",
    "Released",
    "Cancelling",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_patch_clears_what_a_finished_rollout_no_longer_waits_on() {
        let mut status = MatrixOneClusterStatus {
            rollout: Some(crate::crd::RolloutStatusView {
                target: "v2".into(),
                step: "complete".into(),
                waiting_on: None,
            }),
            ..MatrixOneClusterStatus::default()
        };
        let patch = status_patch(&status);
        assert_eq!(
            patch["status"]["rollout"]
                .as_object()
                .expect("rollout")
                .get("waitingOn"),
            Some(&serde_json::Value::Null),
            "{patch}"
        );
        status.rollout.as_mut().expect("rollout").waiting_on = Some("gate".into());
        assert_eq!(
            status_patch(&status)["status"]["rollout"]["waitingOn"],
            "gate"
        );
    }
    use k8s_openapi::api::core::v1::{NodeSpec, PodSpec};
    use kube::api::ObjectMeta;
    use kube::runtime::reflector;

    fn pod(name: &str, cluster: &str, node: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: Some(BTreeMap::from([(
                    resources::LABEL_CLUSTER.to_string(),
                    cluster.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn node(name: &str, unschedulable: bool) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(unschedulable),
                ..NodeSpec::default()
            }),
            ..Node::default()
        }
    }

    fn woken(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<ObjectRef<StoredCluster>>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(c) = rx.try_recv() {
            out.push(c.name);
        }
        out
    }

    #[test]
    fn pods_wake_their_cluster_and_nodes_wake_the_clusters_on_them_only_when_it_matters() {
        let wakeups = Wakeups::default();
        let (store, mut writer) = reflector::store::<Pod>();
        for p in [
            pod("a-cn-0", "a", "n1"),
            pod("b-cn-0", "b", "n1"),
            pod("c-cn-0", "c", "n2"),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(p));
        }
        // Before the controller runs, changes are left to its first pass.
        wakeups.on_pod(&pod("a-cn-0", "a", "n1"));
        assert!(wakeups.answered("ns", "a").is_none());
        let (to, mut rx) = tokio::sync::mpsc::unbounded_channel();
        *wakeups.to.lock().unwrap() = Some(to);

        wakeups.on_pod(&pod("a-cn-0", "a", "n1"));
        assert_eq!(woken(&mut rx), vec!["a"]);
        assert!(wakeups.answered("ns", "a").is_some());
        assert!(wakeups.answered("ns", "a").is_none(), "answered once");

        wakeups.on_node(&node("n1", false), &store);
        assert_eq!(woken(&mut rx), vec!["a", "b"], "first sight of n1");
        wakeups.on_node(&node("n1", false), &store);
        assert!(
            woken(&mut rx).is_empty(),
            "a status update that changes nothing"
        );
        wakeups.on_node(&node("n1", true), &store);
        assert_eq!(woken(&mut rx), vec!["a", "b"], "cordoned");
        wakeups.on_node(&node("n3", true), &store);
        assert!(woken(&mut rx).is_empty(), "no cluster on n3");
    }
}
