//! What a policy sees. Every reading that comes from the MatrixOne kernel can fail, and the
//! failure is kept as a typed value: a policy must be able to tell "zero sessions" from
//! "could not ask".

use crate::component::Component;
use crate::strategy::Strategy;
use crate::time::Millis;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why a reading is missing. Each of these is uncertainty, never an answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum ObservationError {
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("does not exist: {0}")]
    DoesNotExist(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PodPhase {
    Pending,
    Running,
    /// Terminal (Kubernetes `Failed` or `Succeeded`): every container stopped for good and the
    /// kubelet will not start them again (an eviction under node pressure, a node shutdown).
    /// Nothing runs there to drain or protect; only a new pod brings the member back.
    Failed,
}

/// Pool phases of the CN pool (claims bind Idle pods to owners).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolPhase {
    Idle,
    Bound,
    Draining,
    Terminating,
}

/// HAKeeper work states (values as in the kernel: Unknown=0 … Drained=3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkState {
    Unknown,
    Working,
    Draining,
    Drained,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodObservation {
    pub name: String,
    pub uid: String,
    pub component: Component,
    pub node: String,
    pub phase: PodPhase,
    pub ready: bool,
    /// Version of the running container (the image tag).
    pub version: String,
    /// A deletion was requested (the pod is shutting down).
    pub terminating: bool,
    pub restarts: u32,
    /// When the pod's running container started, in the observation's clock (Kubernetes'
    /// `startedAt`, one-second precision). With the pod's UID and restart count this is the
    /// instance: HAKeeper cannot tell a quickly restarted process from the old one.
    #[serde(default)]
    pub started_at: Option<Millis>,
    /// For CN pods: the UUID derived from the pod's DNS name.
    pub cn_uuid: Option<String>,
    pub pool_phase: Option<PoolPhase>,
    /// For proxy pods: selected by its Service, so new client connections reach it. The
    /// operator takes a proxy out before stopping it: the kernel's proxy closes every
    /// connection at once when it stops (v1.2.4 `proxy/server.go` `Server.Close`).
    #[serde(default = "in_service")]
    pub serving: bool,
}

fn in_service() -> bool {
    true
}

/// A CN as HAKeeper knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CnStoreView {
    pub uuid: String,
    /// Start epoch of the service instance that last heartbeated (its service id's timestamp).
    pub start_epoch: u64,
    pub work_state: WorkState,
    pub heartbeat_age: Millis,
    pub version: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TnStoreView {
    pub uuid: String,
    pub start_epoch: u64,
    pub heartbeat_age: Millis,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogReplicaView {
    /// The log store (pod name) hosting the replica.
    pub store: String,
    pub up: bool,
    pub caught_up: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogShardView {
    pub shard_id: u64,
    pub leader: Option<String>,
    pub term: u64,
    pub replicas: Vec<LogReplicaView>,
}

/// `GetClusterDetails` as far as the operator uses it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterDetails {
    pub cns: Vec<CnStoreView>,
    pub tns: Vec<TnStoreView>,
    pub log_shards: Vec<LogShardView>,
}

/// The lock-table allocator's answers to today's restart handshake, per CN UUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartAnswer {
    /// `CanRestartService(uuid)`.
    pub can_restart: bool,
    /// `RemainTxnInService(uuid)`; −1 when the allocator is inconsistent.
    pub remaining_txns: i64,
}

/// `QueryDrain(id)` of the instance-bound drain protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum DrainAnswer {
    /// Tables not yet handed over; `remaining_txns` still hold locks on the instance.
    Pending {
        remaining_txns: u64,
    },
    /// That exact instance handed every table over and no transaction remains.
    Done,
    Cancelled,
    /// The instance the drain was bound to is no longer running.
    InstanceGone,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorView {
    /// Only UUIDs for which `SetRestartService` was called appear here.
    pub restarting: BTreeMap<String, RestartAnswer>,
    /// The kernel offers `BeginDrain` / `QueryDrain` / `CancelDrain`.
    pub drain_protocol: bool,
    /// `QueryDrain(id)` for every drain id the allocator knows (ids are lost when the TN
    /// restarts: an id missing here is "unknown", never "done").
    pub drains: BTreeMap<u64, DrainAnswer>,
}

/// What a CN's query service reports (ShowProcessList, GetPipelineInfo, GetReplicaCount,
/// and for a draining CN GetLockInfo).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CnActivity {
    pub sessions: u32,
    pub pipelines: u32,
    pub replicas: u32,
    /// Locks in the CN's own lock tables that some transaction holds or waits for; `None`
    /// when not read (only draining CNs are asked) or not answered.
    #[serde(default)]
    pub locks: Option<u32>,
    /// The oldest transaction the CN's transaction client runs (GetTxnInfo); read from every
    /// CN only while one of them hands its lock tables over.
    #[serde(default)]
    pub oldest_txn: OldestTxn,
    /// For a draining CN: how many transactions holding a lock in its own lock tables some
    /// running CN still runs (its GetLockInfo holders against every CN's GetTxnInfo). `None`
    /// when not read, or when any running CN's transaction list was not read.
    #[serde(default)]
    pub live_lock_holders: Option<u32>,
}

/// What a CN's GetTxnInfo said about the transactions it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OldestTxn {
    /// Not asked, or not answered.
    #[default]
    NotRead,
    /// The CN runs no transaction.
    NoneRunning,
    /// The oldest one it runs was created then (the CN's wall clock, Unix milliseconds).
    CreatedAt(Millis),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemovalReason {
    ScaleIn,
    PoolReclaim { requested_by: String },
}

/// A CN the owner of the cluster wants gone (the pod keeps running until a policy deletes it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovalRequest {
    pub id: u64,
    pub pod: String,
    pub uid: String,
    pub reason: RemovalReason,
    pub requested_at: Millis,
}

/// A request on the Eviction API, reviewed synchronously as an admission webhook would.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictionRequest {
    pub pod: String,
    pub uid: String,
    /// Who asks: `kubectl-drain`, `consolidation-agent`, …
    pub source: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeSpec {
    pub target_version: String,
    pub strategy: Strategy,
}

/// The spec side: what the cluster's owner asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredState {
    pub upgrade: Option<UpgradeSpec>,
    pub removals: Vec<RemovalRequest>,
    /// Pods the spec asks for, per component. A component with fewer live pods than this has
    /// a pod missing (deleted and not yet recreated): its gate does not hold. Components not
    /// listed are judged on the pods observed.
    #[serde(default)]
    pub replicas: BTreeMap<Component, usize>,
}

/// What the kernel's admin side answers (HAKeeper, the TN lock allocator, CN query services,
/// proxies): the MatrixOne half of an [`Observation`], as one admin API call returns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelView {
    pub hakeeper: Result<ClusterDetails, ObservationError>,
    pub lock_allocator: Result<AllocatorView, ObservationError>,
    /// Per CN pod name.
    pub cn_activity: BTreeMap<String, Result<CnActivity, ObservationError>>,
    /// Per proxy pod name.
    pub proxy_routes: BTreeMap<String, Result<u32, ObservationError>>,
    /// Per proxy pod name: its client connections (see [`Observation::proxy_connections`]).
    #[serde(default)]
    pub proxy_connections: BTreeMap<String, Result<u32, ObservationError>>,
    pub tn_wal_tolerance: Option<Millis>,
}

impl KernelView {
    /// Nothing could be asked: every reading carries the same error.
    pub fn unreachable(error: ObservationError) -> KernelView {
        KernelView {
            hakeeper: Err(error.clone()),
            lock_allocator: Err(error),
            cn_activity: BTreeMap::new(),
            proxy_routes: BTreeMap::new(),
            proxy_connections: BTreeMap::new(),
            tn_wal_tolerance: None,
        }
    }
}

/// One consistent look at the cluster, taken at `now`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    pub now: Millis,
    pub pods: Vec<PodObservation>,
    pub hakeeper: Result<ClusterDetails, ObservationError>,
    pub lock_allocator: Result<AllocatorView, ObservationError>,
    /// Per CN pod name.
    pub cn_activity: BTreeMap<String, Result<CnActivity, ObservationError>>,
    /// Per proxy pod: how many Working CNs it can route new sessions to.
    pub proxy_routes: BTreeMap<String, Result<u32, ObservationError>>,
    /// Per proxy pod: the client sessions it carries, counted on every CN's query service
    /// (ShowProcessList's `ProxyHost`). Any CN unread makes the count an error: a proxy's
    /// connections are never judged gone from a partial look.
    #[serde(default)]
    pub proxy_connections: BTreeMap<String, Result<u32, ObservationError>>,
    /// Images present on each node (`node.status.images`).
    pub node_images: BTreeMap<String, Vec<String>>,
    /// Nodes new pods cannot go to (cordoned or not Ready).
    pub unschedulable_nodes: Vec<String>,
    /// Nodes that are not Ready (failed or unreachable).
    pub not_ready_nodes: Vec<String>,
    /// The TN's WAL tolerance override as configured now (`None`: the kernel default).
    pub tn_wal_tolerance: Option<Millis>,
    /// How often the services are configured to heartbeat to HAKeeper: what a fresh reading
    /// of their records means follows it.
    #[serde(default)]
    pub heartbeat_intervals: HeartbeatIntervals,
    pub desired: DesiredState,
}

/// The kernel's configured heartbeat intervals per role; the defaults are v1.2.4's: LOG
/// stores, the TN and CNs 1 s, proxies 3 s (`pkg/proxy/config.go`
/// `defaultHeartbeatInterval`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatIntervals {
    pub log: Millis,
    pub tn: Millis,
    pub cn: Millis,
    pub proxy: Millis,
}

impl Default for HeartbeatIntervals {
    fn default() -> Self {
        HeartbeatIntervals {
            log: Millis::from_secs(1),
            tn: Millis::from_secs(1),
            cn: Millis::from_secs(1),
            proxy: Millis::from_secs(3),
        }
    }
}

impl HeartbeatIntervals {
    /// A LOG store's record older than this is a stale reading.
    pub fn log_fresh(&self) -> Millis {
        fresh_within(self.log)
    }

    /// A proxy's record older than this is a stale reading.
    pub fn proxy_fresh(&self) -> Millis {
        fresh_within(self.proxy)
    }

    /// A CN record older than this is a stale reading.
    pub fn cn_fresh(&self) -> Millis {
        fresh_within(self.cn)
    }

    /// A TN record older than this is a stale reading.
    pub fn tn_fresh(&self) -> Millis {
        fresh_within(self.tn)
    }
}

/// Three intervals: two lost heartbeats are a hiccup, a third is not fresh. A constant limit
/// would flap on a kernel configured to beat less often than it.
fn fresh_within(interval: Millis) -> Millis {
    Millis(interval.0.saturating_mul(3))
}

impl Observation {
    pub fn pods_of(&self, component: Component) -> impl Iterator<Item = &PodObservation> {
        self.pods.iter().filter(move |p| p.component == component)
    }

    pub fn pod(&self, name: &str) -> Option<&PodObservation> {
        self.pods.iter().find(|p| p.name == name)
    }
}
