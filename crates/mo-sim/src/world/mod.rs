//! The simulated world: Kubernetes objects, MatrixOne processes, clients and the event queue.
//!
//! Everything is kept in ordered containers (`Vec`, `BTreeMap`) so iteration order, and with it
//! the whole run, depends on nothing but the scenario and the seed.

mod k8s;
mod kernel;
mod lockservice;
mod observer;
mod workload;

#[cfg(test)]
mod tests;

use crate::duration::Dur;
use crate::policy::make_policy;
use crate::report::{PhaseReport, Report, TxnCounts, UnsafeActions, UpgradeReport};
use crate::scenario::{ConsolidationMethod, EventKind, Scenario};
use crate::timings::Timings;
use mo_core::{
    ActionResult, Component, Millis, Policy, PoolPhase, RemovalRequest, UpgradeSpec, WorkState,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

pub(crate) type PodId = usize;
pub(crate) type ClientId = usize;
pub(crate) type TxnId = u64;

/// One incarnation of a process: the pod and the start epoch of its container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Instance {
    pub pod: PodId,
    pub epoch: u64,
}

/// Why a pod deleted through a real API server (the attached data plane) went: the world
/// cannot tell an upgrade's restart from another deletion until the next instance starts.
pub(crate) const API_DELETE: &str = "deleted through the API server";

/// Why a process stopped: voluntary disruptions must never cost a transaction; involuntary
/// ones (injected faults) are accounted separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    Voluntary,
    Involuntary,
    /// The operator's restart of the TN to upgrade it: the stock kernel cannot restart its TN
    /// without losing the commits in flight and the locks held across it, so these losses are
    /// the operator's, counted apart (and the checker allows one such restart per version).
    TnRestart,
    /// The operator's restart of the only proxy: the kernel's proxy closes its connections at
    /// once (`Server.Close`) and no other proxy could have taken its clients first. Counted apart.
    ProxyRestart,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PodStatus {
    Pending,
    Running,
    Gone,
}

#[derive(Clone, Debug)]
pub(crate) struct Deletion {
    pub cause: Cause,
    /// The workload controller creates the pod again (same name, new UID).
    pub recreate: bool,
    /// Why it was deleted (a CN's stop is judged when its process is told to stop).
    pub why: String,
}

#[derive(Clone, Debug)]
pub(crate) struct Pod {
    pub name: String,
    pub uid: String,
    pub component: Component,
    pub node: usize,
    pub version: String,
    pub status: PodStatus,
    pub ready: bool,
    /// The container's process is running (possibly shutting down).
    pub process_alive: bool,
    pub epoch: u64,
    pub sigterm_sent: bool,
    pub deletion: Option<Deletion>,
    pub restarts: u32,
    pub backoff: Millis,
    pub last_start: Millis,
    pub cn_group: Option<usize>,
    pub pool_phase: Option<PoolPhase>,
    /// For CN pods: the UUID derived from the pod's name.
    pub cn_uuid: Option<String>,
    /// The grace period of this pod's deletion when the API server gave one (attached mode).
    pub grace_override: Option<Millis>,
    /// For proxies: the SQL Service selects it (the operator's `SetProxyServing`).
    pub serving: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub name: String,
    pub alive: bool,
    pub cordoned: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct CnGroup {
    pub name: String,
}

/// Events of the discrete-event loop. Stale events carry the epoch they were scheduled for
/// and are ignored when it no longer matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Ev {
    Scenario(usize),
    OperatorTick,
    /// A decision sooner than the next tick (see `Timings::operator_reaction`).
    OperatorWake,
    HeartbeatTick,
    /// One proxy's CN-list refresh (each on its own timer from its start).
    ProxyRefresh(PodId, u64),
    ProxyRebalance,
    ConsolidationTick,
    EvictionRetry(usize),
    HakeeperOutageEnd,
    PodStart(PodId),
    PodSigterm(PodId),
    PodKill(PodId, u64),
    ProcessExit(PodId, u64),
    ContainerRestart(PodId),
    NodeEvictPods(usize),
    LogJoined {
        shard: usize,
        replica: usize,
        epoch: u64,
    },
    LogCaughtUp {
        shard: usize,
        replica: usize,
        epoch: u64,
        generation: u64,
    },
    LogElection {
        shard: usize,
    },
    TnStarted(u64),
    TnHakeeperDeadline(u64),
    TnWalDeadline {
        epoch: u64,
        generation: u64,
    },
    CnStarted(PodId, u64),
    CnStartDeadline(PodId, u64),
    CnLockClose(PodId, u64),
    CnKeepalive(PodId, u64),
    BindInvalidate(PodId, u64),
    OrphanCheck(PodId, u64),
    ProxyStarted(PodId, u64),
    ImagePulled(usize, usize),
    LeaderTransfer {
        shard: usize,
        to: usize,
        term: u64,
    },
    ClientNext(ClientId),
    StmtDone(ClientId, TxnId),
    CommitAtTn(ClientId, TxnId),
    WalDone(TxnId),
    CommitTimeout(ClientId, TxnId),
    UnlockRetry(ClientId, TxnId),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReplicaState {
    Down,
    Replaying,
    Joined { caught_up: bool },
}

#[derive(Clone, Debug)]
pub(crate) struct Replica {
    pub store: String,
    pub state: ReplicaState,
    /// Epoch of the store process that hosts this replica incarnation.
    pub epoch: u64,
    /// Bumped whenever catching up is interrupted (the shard lost its leader).
    pub catch_up_generation: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct Shard {
    pub id: u64,
    pub replicas: Vec<Replica>,
    pub leader: Option<usize>,
    pub term: u64,
    pub election_scheduled: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TnPhase {
    Down,
    WaitingForHakeeper,
    Starting,
    Running,
    /// SIGTERM received: admits no new commit, finishes the appends it has.
    Stopping,
}

#[derive(Clone, Debug)]
pub(crate) struct Bind {
    pub owner: Instance,
    pub uuid: String,
    pub version: u64,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Allocator {
    pub binds: BTreeMap<String, Bind>,
    /// The lock services this allocator knows (`serviceBinds`), keyed by the process: the
    /// kernel keys them by service id, the CN's start time and UUID, so a CN restarted with the
    /// same UUID is a second entry beside the old one until the old one is removed. A CN
    /// registers at its first `GetBind` since the allocator started (v1.2.4
    /// `lockservice/lock_table_allocator.go` `Get` → `registerService`), owner or not.
    pub services: BTreeMap<Instance, ServiceEntry>,
    /// When this allocator's invalidation check began (`checkInvalidBinds`: a timer of
    /// `keepBindTimeout`, reset after every round).
    pub checks_since: Millis,
}

/// The allocator's side of the restart handshake for one entry (`pb.Status` in `serviceBinds`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryStatus {
    Enable,
    /// `SetRestartService` set it; the CN learns at its next keepalive.
    Waiting,
    /// The CN reported "unlock success": the entry is disabled, its binds invalid.
    CanRestart,
}

/// One lock service as the allocator knows it (`serviceBinds`).
#[derive(Clone, Debug)]
pub(crate) struct ServiceEntry {
    pub uuid: String,
    pub status: EntryStatus,
    /// Set with `CanRestart`: keepalives are refused (`active` answers false) and the entry's
    /// keepalive time no longer moves; a second `SetRestartService` sets it back to Waiting,
    /// where it stays (the wedge: `canRestartService` false, `remainTxnInService` −1).
    pub disabled_at: Option<Millis>,
    /// The transaction ids the CN reported at its last keepalive while not Enable (`txnIDs`):
    /// what `remainTxnInService` counts.
    pub reported_txns: usize,
}

pub(crate) fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KernelDrainState {
    Pending,
    Done,
    Cancelled,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelDrain {
    pub instance: Instance,
    pub state: KernelDrainState,
}

#[derive(Clone, Debug)]
pub(crate) struct Tn {
    pub pod: PodId,
    pub phase: TnPhase,
    pub epoch: u64,
    pub allocator: Allocator,
    pub wal_waiting: Vec<TxnId>,
    pub wal_blocked_since: Option<Millis>,
    pub wal_generation: u64,
    pub wal_try: u32,
    /// Why the TN process last stopped (its pod's deletion, a crash, a fatal exit): what a
    /// transaction it cut is attributed to.
    pub stop_cause: Cause,
    /// Lock binds with a version at or below this were granted by an allocator that a TN
    /// restart replaced (the new one starts empty).
    pub binds_lost_up_to: u64,
    /// Whether an involuntary fault kept the WAL's shard from committing at some point of the
    /// current blocked window.
    pub wal_block_cause: Cause,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CnPhase {
    Down,
    Starting,
    Running,
    Stopping,
}

impl Cn {
    pub(crate) fn new(uuid: String, epoch: u64, phase: CnPhase) -> Cn {
        Cn {
            uuid,
            phase,
            epoch,
            lock_open: false,
            heartbeats: true,
            keepalive_due: false,
            restart_mode: RestartMode::None,
            restart_time: None,
            holders: BTreeSet::new(),
            stale_holders: BTreeMap::new(),
            sessions: BTreeSet::new(),
            confirmed_epoch: None,
            kernel_drain: None,
            stop_cause: Cause::Voluntary,
        }
    }
}

/// The CN's own lock-service status (`pb.Status` in `lockservice/service.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RestartMode {
    None,
    /// Refuses new locks except to transactions already active here.
    Waiting,
    /// No active transaction left (`ServiceUnLockSucc`, later `ServiceCanRestart`); the
    /// allocator learns it at the next keepalive.
    UnlockSuccess,
}

#[derive(Clone, Debug)]
pub(crate) struct Cn {
    pub uuid: String,
    pub phase: CnPhase,
    pub epoch: u64,
    pub lock_open: bool,
    pub heartbeats: bool,
    /// A bind keepalive of this instance is scheduled (the model runs the 1 s keepalive only
    /// while it can change something: a handshake, or the first one to a new allocator).
    pub keepalive_due: bool,
    pub restart_mode: RestartMode,
    /// When it learnt it is to restart (`restartTime`): transactions whose snapshot is not
    /// newer may still lock the tables it references.
    pub restart_time: Option<Millis>,
    /// Transactions holding locks on tables this CN owns (local or remote holders).
    pub holders: BTreeSet<TxnId>,
    /// Transactions this lock service still counts as active though they ended, with the CN
    /// instance that ran them: a remote holder whose CN died without unlocking (an orphan), or
    /// whose unlock came under a bind a TN restart changed and was refused (v1.2.4
    /// `service_remote.go` `handleRemoteUnlock`). Only the orphan check removes them, once the
    /// requester's instance is gone (`unlockTimeoutRemoteTxn`, `getTimeoutRemoveTxn`).
    pub stale_holders: BTreeMap<TxnId, Instance>,
    pub sessions: BTreeSet<ClientId>,
    /// The epoch whose tables the allocator took back ("can restart", or the extension's
    /// drain done): the ground truth of a hand-over for that instance.
    pub confirmed_epoch: Option<u64>,
    /// Instance-bound kernel drain in progress, if any.
    pub kernel_drain: Option<u64>,
    pub stop_cause: Cause,
}

#[derive(Clone, Debug)]
pub(crate) struct CnRecord {
    pub pod: PodId,
    /// The instance that created the record: what HAKeeper reports as its `UpTime`. A
    /// heartbeat never changes it (`CNState.Update`), so a CN restarted before its record
    /// expired looks like its old instance.
    pub epoch: u64,
    /// The instance that sent the last heartbeat: the model's ground truth, never observed.
    pub heard_from: u64,
    pub work_state: WorkState,
    pub last_heartbeat: Millis,
    pub version: String,
}

/// What a LOG store told HAKeeper about one of its replicas at its last heartbeat: the shard,
/// and the leader and term it follows (`LogReplicaInfo`; nothing about how far its log is).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReplicaReport {
    pub shard: usize,
    pub leader: Option<usize>,
    pub term: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct LogStoreRecord {
    pub last_heartbeat: Millis,
    pub replicas: Vec<ReplicaReport>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct HaKeeper {
    pub cns: BTreeMap<String, CnRecord>,
    pub tn_last_heartbeat: Option<(u64, Millis)>,
    /// LOG stores by name (heartbeat every `log_heartbeat`; expire after `log_store_expiry`).
    pub log_stores: BTreeMap<String, LogStoreRecord>,
    /// Proxies by pod name: their last heartbeat (every `proxy_heartbeat`; expire after
    /// `proxy_expiry`).
    pub proxies: BTreeMap<String, Millis>,
    /// Since when HAKeeper's shard could not commit, so its tick stood still.
    pub ticks_paused_since: Option<Millis>,
    pub outage_until: Option<Millis>,
    pub was_available: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct Proxy {
    pub running: bool,
    pub epoch: u64,
    /// CN UUIDs and work states as of the last refresh.
    pub cache: Vec<(String, WorkState)>,
    /// Set by the operator's restart of the only proxy (see `Cause::ProxyRestart`).
    pub stop_cause: Option<Cause>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxnStage {
    Statements,
    Committing,
    /// Committed at the TN; COMMIT has not returned: the CN retries the unlock of a lock table
    /// whose owner is gone until the allocator shows its bind changed (v1.2.4
    /// `lockservice/lock_table_remote.go` `unlock`, deferred inside `txn/client/operator.go`
    /// `doWrite`). Its `locks` are those still being unlocked.
    Unlocking,
}

#[derive(Clone, Debug)]
pub(crate) struct HeldLock {
    pub table: usize,
    pub owner: Instance,
    pub version: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct Txn {
    pub client: ClientId,
    pub cn: Instance,
    /// When the transaction began (what a CN's `GetTxnInfo` reports as its creation time).
    pub created_at: Millis,
    pub tables: Vec<usize>,
    pub next_stmt: usize,
    pub stage: TxnStage,
    pub locks: Vec<HeldLock>,
    /// The CN retries an unavailable TN until then.
    pub tn_wait_deadline: Option<Millis>,
    /// When COMMIT was sent; its client-side timeout is armed only once the commit waits.
    pub commit_sent_at: Millis,
    pub timeout_armed: bool,
    /// Whether the client has been told an outcome.
    pub reported: bool,
}

impl Txn {
    /// A transaction about to run its first statement.
    pub(crate) fn new(client: ClientId, cn: Instance, now: Millis, tables: Vec<usize>) -> Txn {
        Txn {
            client,
            cn,
            created_at: now,
            tables,
            next_stmt: 0,
            stage: TxnStage::Statements,
            locks: Vec::new(),
            tn_wait_deadline: None,
            commit_sent_at: Millis::ZERO,
            timeout_armed: false,
            reported: false,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Client {
    pub session: Option<Instance>,
    pub proxy: Option<PodId>,
    pub txn: Option<TxnId>,
    pub wakeup_pending: bool,
    /// The proxy wanted to move this session during a transaction: it moves as soon as the
    /// transaction ends (v1.2.4 `proxy/tunnel.go` `transferIntent`).
    pub transfer_intent: bool,
    /// When its connection through the proxy was opened (clients close connections older than
    /// the workload's `connection_lifetime` between transactions, as connection pools do).
    pub connected_at: Millis,
    /// Not a client: the kernel's own background work on this CN pod (by name, so it follows
    /// the pod across restarts).
    pub background_on: Option<String>,
}

#[derive(Clone, Debug)]
pub(crate) struct PendingEviction {
    pub pod: String,
    pub source: String,
    pub retry: Millis,
    /// The evictor stops retrying at this time (None: never).
    pub give_up_at: Option<Millis>,
    pub done: bool,
}

/// Observer state used to count unsafe actions and record the upgrade's phases.
#[derive(Clone, Debug, Default)]
pub(crate) struct UpgradeTracker {
    pub requested_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    pub phases: Vec<(Component, Option<Millis>, Option<Millis>)>,
    /// Components a pod of which the policy has stopped to upgrade it: the first such stop is
    /// the phase's real start, judged from the pods whatever the policy announces.
    pub advanced: Vec<Component>,
    /// Components seen functional (every pod on the target, the kernel's gate passing) since
    /// the last stop of one of their pods for the upgrade.
    pub functional_seen: Vec<Component>,
    /// The policy said its rollout is halted (until the next requested version).
    pub halted: bool,
    /// What each component's pods ran when the first upgrade was requested, or the last one
    /// after the one before it completed: a rollback's destination.
    pub original_versions: BTreeMap<Component, BTreeSet<String>>,
    /// Pods were running when the first upgrade was requested (it is no creation).
    pub cluster_existed: bool,
    /// CN pods restarting onto another version, not yet Ready again.
    pub cns_moving: BTreeSet<String>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Keep the human-readable event log (costs time and memory on long runs).
    pub record_events: bool,
    /// Keep every transaction outcome for invariant checks (tests, campaigns).
    pub audit: bool,
    /// Check the safety invariants after every event (campaigns).
    pub check_invariants: bool,
    /// Keep a structured timeline for reports.
    pub trace: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutcomeKind {
    Committed,
    Failed,
    Unknown,
}

/// Per-transaction record of what clients were told and what really committed.
#[derive(Clone, Debug, Default)]
pub struct Audit {
    pub outcomes: Vec<(u64, OutcomeKind)>,
    pub truth_committed: Vec<u64>,
}

pub struct Simulation {
    pub(crate) scenario: Scenario,
    pub(crate) t: Timings,
    pub(crate) now: Millis,
    pub(crate) seq: u64,
    pub(crate) queue: BinaryHeap<Reverse<(Millis, u64, Ev)>>,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) policy: Box<dyn Policy>,
    pub(crate) last_results: Vec<ActionResult>,
    pub(crate) record_events: bool,
    pub(crate) audit: Option<Audit>,
    pub(crate) event_log: Vec<String>,
    pub(crate) events_processed: u64,
    pub(crate) epoch_counter: u64,
    pub(crate) uid_counter: u64,

    pub(crate) nodes: Vec<Node>,
    pub(crate) pods: Vec<Pod>,
    pub(crate) pod_by_name: BTreeMap<String, PodId>,
    pub(crate) template_version: BTreeMap<String, String>,
    /// The version of the last CN restart the operator asked for: what it creates a missing CN
    /// pod with (CN pods have no workload of their own; `mo-kube` keeps one CN template).
    pub(crate) cn_template: Option<String>,
    pub(crate) groups: Vec<CnGroup>,
    pub(crate) removals: Vec<RemovalRequest>,
    pub(crate) removal_counter: u64,
    pub(crate) evictions: Vec<PendingEviction>,
    pub(crate) pdbs: BTreeMap<Component, usize>,
    pub(crate) consolidation_target: Option<usize>,

    pub(crate) shards: Vec<Shard>,
    pub(crate) hakeeper: HaKeeper,
    pub(crate) tn: Tn,
    pub(crate) cns: BTreeMap<PodId, Cn>,
    pub(crate) proxies: BTreeMap<PodId, Proxy>,
    pub(crate) fault_cn_never_heartbeats: bool,
    /// The lock allocator never answers "can restart" (a kernel that never confirms).
    pub(crate) fault_handover_never_confirms: bool,
    /// Cold start: lock tables reserved for a CN (table → pod name), bound to it on first use.
    pub(crate) preset_owners: BTreeMap<String, String>,
    pub(crate) tn_wal_tolerance: Option<Millis>,
    pub(crate) drain_protocol: bool,
    pub(crate) leader_transfer: bool,
    pub(crate) wal_tolerance: bool,
    pub(crate) kernel_drains: BTreeMap<u64, KernelDrain>,
    pub(crate) drain_counter: u64,
    pub(crate) node_images: Vec<BTreeSet<String>>,
    /// Pulls in progress: (node, version) -> when the image is there.
    pub(crate) pulls: BTreeMap<(usize, String), Millis>,
    pub(crate) versions: Vec<String>,
    pub(crate) policy_record: Option<String>,
    /// The operator decides again `operator_reaction` after a change, as the kube controller
    /// reconciles on its watches (the safe policy only; the others were calibrated on the tick).
    pub(crate) reacts_to_changes: bool,
    /// The work state a CN registers with (`[cn] init-work-state`): Draining under the safe
    /// operator, which renders it and puts each CN into service; Working (the kernel's default)
    /// under the others.
    pub(crate) cn_init_work_state: WorkState,
    /// An `OperatorWake` is scheduled.
    pub(crate) wake_pending: bool,
    pub(crate) crash_pending: Option<bool>,
    pub(crate) operator_restarts: u64,
    pub(crate) check_invariants: bool,
    pub(crate) trace: Option<crate::report::Trace>,
    pub(crate) violations: Vec<crate::report::Violation>,
    pub(crate) seen: (u64, u64, usize),
    pub(crate) last_failure: String,
    pub(crate) upgrade: Option<UpgradeSpec>,

    /// The clients' tables first, then the kernel's internal ones.
    pub(crate) tables: Vec<String>,
    pub(crate) client_tables: usize,
    pub(crate) clients: Vec<Client>,
    /// Draws of the background transactions, apart from the clients' (which stay as they were
    /// with background work on or off).
    pub(crate) background_rng: ChaCha8Rng,
    pub(crate) background_counts: TxnCounts,
    /// How often the run went through each kernel mechanism the safety claims depend on (what
    /// a clean campaign shows it covered).
    pub(crate) mechanisms: BTreeMap<&'static str, u64>,
    pub(crate) txns: BTreeMap<TxnId, Txn>,
    pub(crate) txn_counter: TxnId,
    pub(crate) bind_version_bump: u64,
    pub(crate) route_ok: bool,

    // Measurements.
    pub(crate) counts: TxnCounts,
    pub(crate) errors_by_kind: BTreeMap<String, u64>,
    pub(crate) tn_fatal_exit_times: Vec<Millis>,
    /// What caused each TN fatal exit, judged from the kernel's state at the time.
    pub(crate) tn_fatal_exit_causes: Vec<Cause>,
    /// The newest catalog a CN has run here (`mo_core::generation::catalog` of its release);
    /// None while every CN ran a release the table cannot place.
    pub(crate) catalog_reached: Option<(u32, u32, u32)>,
    /// Why each LOG store's process last stopped (by store name).
    pub(crate) log_stop_cause: BTreeMap<String, Cause>,
    pub(crate) no_route: Millis,
    pub(crate) truth_committed: u64,
    pub(crate) failures_voluntary: u64,
    pub(crate) failures_involuntary: u64,
    pub(crate) failures_tn_restart: u64,
    pub(crate) failures_proxy_restart: u64,
    /// When a commit that locked each table last happened (by table index).
    pub(crate) last_commit_on: BTreeMap<usize, Millis>,
    pub(crate) longest_table_stall: Millis,
    /// The versions the policy restarted the TN to (one restart per version is needed).
    pub(crate) tn_restarts_to: Vec<String>,
    /// A TN deleted through a real API server, judged when its next instance starts: the
    /// version it ran.
    pub(crate) tn_deleted_from: Option<String>,
    pub(crate) unsafe_actions: UnsafeActions,
    pub(crate) unsafe_log: Vec<String>,
    pub(crate) tracker: UpgradeTracker,
}

impl Simulation {
    /// Builds the world of `scenario` with its policy; the scenario's seed drives every choice.
    pub fn new(scenario: Scenario, options: RunOptions) -> Simulation {
        let policy = make_policy(&scenario.policy, &scenario, None)
            .expect("scenario validation accepts only known policies");
        Simulation::with_policy(scenario, policy, options)
    }

    pub fn with_policy(scenario: Scenario, policy: Box<dyn Policy>, options: RunOptions) -> Self {
        let mut sim = Simulation::build(scenario, policy, options);
        sim.bootstrap();
        sim
    }

    /// The world of `scenario` with nothing started yet.
    pub(crate) fn build(scenario: Scenario, policy: Box<dyn Policy>, options: RunOptions) -> Self {
        let t = scenario.timings.clone();
        let nodes = scenario
            .node_names()
            .into_iter()
            .map(|name| Node {
                name,
                alive: true,
                cordoned: false,
            })
            .collect();
        let groups = scenario
            .topology
            .cn_groups
            .iter()
            .map(|g| CnGroup {
                name: g.name.clone(),
            })
            .collect();
        let reacts_to_changes =
            policy.name() == "safe" && t.operator_reaction.millis() != Millis::ZERO;
        let cn_init_work_state = if policy.name() == "safe" {
            WorkState::Draining
        } else {
            WorkState::Working
        };
        Simulation {
            rng: ChaCha8Rng::seed_from_u64(scenario.seed),
            t,
            now: Millis::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            policy,
            last_results: Vec::new(),
            record_events: options.record_events,
            audit: options.audit.then(Audit::default),
            event_log: Vec::new(),
            events_processed: 0,
            epoch_counter: 0,
            uid_counter: 0,
            nodes,
            pods: Vec::new(),
            pod_by_name: BTreeMap::new(),
            template_version: BTreeMap::new(),
            cn_template: None,
            groups,
            removals: Vec::new(),
            removal_counter: 0,
            evictions: Vec::new(),
            pdbs: scenario
                .pdbs
                .iter()
                .map(|p| (p.component, p.max_unavailable))
                .collect(),
            consolidation_target: None,
            shards: Vec::new(),
            hakeeper: HaKeeper::default(),
            tn: Tn {
                pod: 0,
                phase: TnPhase::Down,
                epoch: 0,
                allocator: Allocator::default(),
                wal_waiting: Vec::new(),
                wal_blocked_since: None,
                wal_generation: 0,
                wal_try: 0,
                // Nothing stopped it yet; a failure with no cause on record is held against
                // the policy, never excused.
                stop_cause: Cause::Voluntary,
                binds_lost_up_to: 0,
                wal_block_cause: Cause::Voluntary,
            },
            cns: BTreeMap::new(),
            proxies: BTreeMap::new(),
            fault_cn_never_heartbeats: false,
            fault_handover_never_confirms: false,
            preset_owners: BTreeMap::new(),
            tn_wal_tolerance: None,
            drain_protocol: scenario.kernel.drain_protocol,
            leader_transfer: scenario.kernel.leader_transfer,
            wal_tolerance: scenario.kernel.wal_tolerance,
            kernel_drains: BTreeMap::new(),
            drain_counter: 0,
            node_images: Vec::new(),
            pulls: BTreeMap::new(),
            versions: Vec::new(),
            policy_record: None,
            reacts_to_changes,
            cn_init_work_state,
            wake_pending: false,
            crash_pending: None,
            operator_restarts: 0,
            check_invariants: options.check_invariants,
            trace: options.trace.then(|| crate::report::Trace {
                bucket_seconds: 10.0,
                ..Default::default()
            }),
            violations: Vec::new(),
            seen: (0, 0, 0),
            last_failure: String::new(),
            upgrade: None,
            tables: scenario
                .workload
                .tables
                .iter()
                .chain(scenario.workload.background.iter().flat_map(|b| &b.tables))
                .cloned()
                .collect(),
            client_tables: scenario.workload.tables.len(),
            clients: vec![Client::default(); scenario.workload.clients],
            background_rng: ChaCha8Rng::seed_from_u64(scenario.seed ^ 0x6b67_726e_6477_726b),
            background_counts: TxnCounts::default(),
            mechanisms: BTreeMap::new(),
            txns: BTreeMap::new(),
            txn_counter: 0,
            bind_version_bump: 1,
            route_ok: false,
            counts: TxnCounts::default(),
            errors_by_kind: BTreeMap::new(),
            tn_fatal_exit_times: Vec::new(),
            tn_fatal_exit_causes: Vec::new(),
            catalog_reached: None,
            log_stop_cause: BTreeMap::new(),
            no_route: Millis::ZERO,
            truth_committed: 0,
            failures_voluntary: 0,
            failures_involuntary: 0,
            failures_tn_restart: 0,
            failures_proxy_restart: 0,
            last_commit_on: BTreeMap::new(),
            longest_table_stall: Millis::ZERO,
            tn_restarts_to: Vec::new(),
            tn_deleted_from: None,
            unsafe_actions: UnsafeActions::default(),
            unsafe_log: Vec::new(),
            tracker: UpgradeTracker::default(),
            scenario,
        }
    }

    /// Pods of the initial topology (Pending, nothing started) and the LOG shards' replicas.
    fn create_topology(&mut self) {
        let version = self.scenario.topology.version.clone();
        self.node_images = vec![BTreeSet::from([version.clone()]); self.nodes.len()];
        let names = self.scenario.pod_names();
        let log_count = self.scenario.topology.log_replicas;
        let mut group_of: BTreeMap<String, usize> = BTreeMap::new();
        let mut pool_bound: BTreeMap<String, bool> = BTreeMap::new();
        for (gi, g) in self.scenario.topology.cn_groups.iter().enumerate() {
            for (i, name) in g.pod_name_list().into_iter().enumerate() {
                group_of.insert(name.clone(), gi);
                if g.pool {
                    pool_bound.insert(name, i < g.bound);
                }
            }
        }
        for (i, name) in names.iter().enumerate() {
            let component = if name.starts_with("log-") && i < log_count {
                Component::Log
            } else if name.starts_with("tn-") {
                Component::Tn
            } else if name.starts_with("proxy-") {
                Component::Proxy
            } else {
                Component::Cn
            };
            self.template_version.insert(name.clone(), version.clone());
            let node = i % self.nodes.len();
            let id = self.create_pod(name, component, node);
            let pod = &mut self.pods[id];
            pod.cn_group = group_of.get(name).copied();
            pod.pool_phase = pool_bound.get(name).map(|bound| {
                if *bound {
                    PoolPhase::Bound
                } else {
                    PoolPhase::Idle
                }
            });
        }
        // LOG shards: shard 0 is HAKeeper, shard 1 the TN's WAL; every store hosts both.
        for id in 0..2u64 {
            let replicas = (0..log_count)
                .map(|i| Replica {
                    store: format!("log-{i}"),
                    state: ReplicaState::Down,
                    epoch: 0,
                    catch_up_generation: 0,
                })
                .collect();
            self.shards.push(Shard {
                id,
                replicas,
                leader: None,
                term: 0,
                election_scheduled: false,
            });
        }
    }

    /// A cluster whose pods have not arrived yet: every process starts when its pod is
    /// attached (see [`crate::attached`]), LOG shards elect their first leader once a majority
    /// of stores joined, the TN and CNs wait for HAKeeper as they do at a real first start.
    pub(crate) fn bootstrap_cold(&mut self) {
        self.create_topology();
        if let Some(tn) = (0..self.pods.len()).find(|&p| self.pods[p].component == Component::Tn) {
            self.tn.pod = tn;
        }
        self.schedule(self.t.heartbeat.millis(), Ev::HeartbeatTick);
        self.schedule(self.t.proxy_rebalance.millis(), Ev::ProxyRebalance);
        let start = self.scenario.workload.start.millis();
        for c in 0..self.clients.len() {
            let jitter = Millis(rand::Rng::random_range(&mut self.rng, 0..1000));
            self.schedule(start + jitter, Ev::ClientNext(c));
        }
        self.start_background_work();
        let line = format!("cold start: {} pods expected", self.pods.len());
        self.log("sim", || line);
    }

    /// The cluster starts healthy: every pod Running and Ready, LOG shards led, CNs registered.
    fn bootstrap(&mut self) {
        let version = self.scenario.topology.version.clone();
        self.create_topology();
        // Start every process as if it had been running for a long time.
        for id in 0..self.pods.len() {
            let pod = &mut self.pods[id];
            pod.status = PodStatus::Running;
            pod.process_alive = true;
            pod.ready = true;
            self.epoch_counter += 1;
            pod.epoch = self.epoch_counter;
        }
        for shard in &mut self.shards {
            for r in &mut shard.replicas {
                let pod = self.pod_by_name[&r.store];
                r.state = ReplicaState::Joined { caught_up: true };
                r.epoch = self.pods[pod].epoch;
            }
            shard.leader = Some(0);
            shard.term = 1;
        }
        self.hakeeper.was_available = true;
        for id in 0..self.pods.len() {
            let (component, epoch, name) = {
                let p = &self.pods[id];
                (p.component, p.epoch, p.name.clone())
            };
            match component {
                Component::Tn => {
                    self.tn.pod = id;
                    self.tn.phase = TnPhase::Running;
                    self.tn.epoch = epoch;
                    self.hakeeper.tn_last_heartbeat = Some((epoch, Millis::ZERO));
                }
                Component::Cn => {
                    let uuid = cn_uuid(&name);
                    let mut cn = Cn::new(uuid.clone(), epoch, CnPhase::Running);
                    cn.lock_open = true;
                    // The cluster's catalog is its CNs' release's.
                    let catalog = mo_core::generation::catalog(&self.pods[id].version);
                    self.catalog_reached = self.catalog_reached.max(catalog);
                    self.cns.insert(id, cn);
                    self.hakeeper.cns.insert(
                        uuid,
                        CnRecord {
                            pod: id,
                            epoch,
                            heard_from: epoch,
                            work_state: WorkState::Working,
                            last_heartbeat: Millis::ZERO,
                            version: version.clone(),
                        },
                    );
                }
                Component::Proxy => {
                    self.proxies.insert(
                        id,
                        Proxy {
                            running: true,
                            epoch,
                            cache: Vec::new(),
                            stop_cause: None,
                        },
                    );
                }
                Component::Log => {}
            }
        }
        for lt in self.scenario.lock_tables.clone() {
            let pod = self.pod_by_name[&lt.owner];
            // A bind's owner got it through GetBind, which registered it with the allocator.
            let uuid = self.cns[&pod].uuid.clone();
            let owner = Instance {
                pod,
                epoch: self.pods[pod].epoch,
            };
            self.tn.allocator.register(owner, &uuid);
            self.tn.allocator.binds.insert(
                lt.table.clone(),
                Bind {
                    owner,
                    uuid: self.cns[&pod].uuid.clone(),
                    version: 1,
                },
            );
        }
        // Every proxy has loaded the CN list once, each at its own phase of the refresh timer.
        let proxies: Vec<(PodId, u64)> = self.proxies.iter().map(|(&p, x)| (p, x.epoch)).collect();
        let period = self.t.proxy_refresh.millis().0.max(1);
        for (p, epoch) in proxies {
            self.refresh_proxy(p);
            let phase = splitmix(self.scenario.seed ^ (p as u64).rotate_left(40)) % period;
            self.schedule(Millis(phase), Ev::ProxyRefresh(p, epoch));
        }
        self.update_route_state();

        // Periodic and scheduled events.
        self.schedule(Millis::ZERO, Ev::OperatorTick);
        self.schedule(self.t.heartbeat.millis(), Ev::HeartbeatTick);
        self.schedule(self.t.proxy_rebalance.millis(), Ev::ProxyRebalance);
        if let Some(c) = &self.scenario.consolidation {
            self.schedule(c.start.millis(), Ev::ConsolidationTick);
        }
        for i in 0..self.scenario.events.len() {
            let at = self.scenario.events[i].at.millis();
            self.schedule(at, Ev::Scenario(i));
        }
        let start = self.scenario.workload.start.millis();
        for c in 0..self.clients.len() {
            // Spread client starts over the first second so they do not move in lockstep.
            let jitter = Millis(rand::Rng::random_range(&mut self.rng, 0..1000));
            self.schedule(start + jitter, Ev::ClientNext(c));
        }
        self.start_background_work();
        let line = format!(
            "start: {} pods on {} nodes, policy {}",
            self.pods.len(),
            self.nodes.len(),
            self.policy.name()
        );
        self.log("sim", || line);
    }

    pub(crate) fn schedule(&mut self, at: Millis, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, ev)));
    }

    pub(crate) fn after(&mut self, delay: Dur, ev: Ev) {
        let at = self.now + delay.millis();
        self.schedule(at, ev);
    }

    pub(crate) fn trace(&mut self, lane: &str, kind: &str, text: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            trace.events.push(crate::report::TraceEvent {
                at: self.now.as_secs_f64(),
                lane: lane.to_string(),
                kind: kind.to_string(),
                text: text(),
            });
        }
    }

    /// The structured timeline, when it was kept.
    pub fn timeline(&self) -> Option<&crate::report::Trace> {
        self.trace.as_ref()
    }

    pub(crate) fn log(&mut self, source: &str, message: impl FnOnce() -> String) {
        if self.record_events {
            let line = format!("{:>12} {:<10} {}", self.now.to_string(), source, message());
            self.event_log.push(line);
        }
    }

    /// Counts one pass through a kernel mechanism (see `mechanisms`).
    pub(crate) fn saw(&mut self, mechanism: &'static str) {
        *self.mechanisms.entry(mechanism).or_default() += 1;
    }

    pub(crate) fn next_epoch(&mut self) -> u64 {
        self.epoch_counter += 1;
        self.epoch_counter
    }

    /// Runs to the scenario's end. `progress` is called now and then with the simulated time.
    pub fn run(&mut self, progress: &mut dyn FnMut(Millis)) -> Report {
        let started = std::time::Instant::now();
        let end = self.scenario.duration.millis();
        self.run_until(end, progress);
        progress(self.now);
        self.finish(started.elapsed().as_secs_f64())
    }

    /// Processes every event due at or before `until`, then sets the clock to `until`.
    pub fn run_until(&mut self, until: Millis, progress: &mut dyn FnMut(Millis)) {
        while let Some(Reverse((at, _, _))) = self.queue.peek() {
            if *at > until {
                break;
            }
            let Some(Reverse((at, _, ev))) = self.queue.pop() else {
                break;
            };
            if at > self.now {
                self.account_interval(at);
            }
            self.now = at;
            self.events_processed += 1;
            if self.events_processed % 65_536 == 0 {
                progress(self.now);
            }
            self.handle(ev);
            if self.check_invariants {
                self.check_event_invariants();
            }
        }
        if until > self.now {
            self.account_interval(until);
            self.now = until;
        }
    }

    /// The report as of now (the run may go on).
    pub fn report(&mut self) -> Report {
        self.finish(0.0)
    }

    pub fn event_log(&self) -> &[String] {
        &self.event_log
    }

    pub fn audit(&self) -> Option<&Audit> {
        self.audit.as_ref()
    }

    /// CN pods whose removal was requested and has not happened yet.
    pub fn pending_removals(&self) -> Vec<String> {
        self.removals.iter().map(|r| r.pod.clone()).collect()
    }

    /// Integrates time-based measurements over `[now, until)`.
    fn account_interval(&mut self, until: Millis) {
        if self.now >= self.scenario.workload.start.millis() && !self.any_proxy_can_route() {
            self.no_route += until - self.now;
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Scenario(i) => self.scenario_event(i),
            Ev::OperatorTick => {
                self.operator_tick();
                self.after(self.t.operator_tick, Ev::OperatorTick);
            }
            Ev::OperatorWake => {
                self.wake_pending = false;
                self.operator_tick();
            }
            Ev::HeartbeatTick => {
                self.heartbeat_tick();
                self.after(self.t.heartbeat, Ev::HeartbeatTick);
            }
            Ev::ProxyRefresh(p, epoch) => {
                if self
                    .proxies
                    .get(&p)
                    .is_some_and(|x| x.epoch == epoch && x.running)
                {
                    self.refresh_proxy(p);
                    self.update_route_state();
                    self.after(self.t.proxy_refresh, Ev::ProxyRefresh(p, epoch));
                }
            }
            Ev::ProxyRebalance => {
                self.rebalance_sessions();
                self.after(self.t.proxy_rebalance, Ev::ProxyRebalance);
            }
            Ev::ConsolidationTick => self.consolidation_tick(),
            Ev::EvictionRetry(i) => self.retry_eviction(i),
            Ev::HakeeperOutageEnd => {
                if self.hakeeper.outage_until.is_some_and(|u| u <= self.now) {
                    self.hakeeper.outage_until = None;
                    self.log("fault", || "HAKeeper reachable again".into());
                    self.on_log_change();
                }
            }
            Ev::PodStart(p) => self.pod_start(p),
            Ev::PodSigterm(p) => self.pod_sigterm(p),
            Ev::PodKill(p, e) => self.pod_kill(p, e),
            Ev::ProcessExit(p, e) => self.process_exit(p, e),
            Ev::ContainerRestart(p) => self.container_restart(p),
            Ev::NodeEvictPods(n) => self.node_evict_pods(n),
            Ev::LogJoined {
                shard,
                replica,
                epoch,
            } => self.log_joined(shard, replica, epoch),
            Ev::LogCaughtUp {
                shard,
                replica,
                epoch,
                generation,
            } => self.log_caught_up(shard, replica, epoch, generation),
            Ev::LogElection { shard } => self.log_election(shard),
            Ev::TnStarted(e) => self.tn_started(e),
            Ev::TnHakeeperDeadline(e) => self.tn_hakeeper_deadline(e),
            Ev::TnWalDeadline { epoch, generation } => self.tn_wal_deadline(epoch, generation),
            Ev::CnStarted(p, e) => self.cn_started(p, e),
            Ev::CnStartDeadline(p, e) => self.cn_start_deadline(p, e),
            Ev::CnLockClose(p, e) => self.cn_lock_close(p, e),
            Ev::CnKeepalive(p, e) => self.cn_keepalive(p, e),
            Ev::BindInvalidate(p, e) => self.bind_invalidate(p, e),
            Ev::OrphanCheck(p, e) => self.orphan_check(p, e),
            Ev::ProxyStarted(p, e) => self.proxy_started(p, e),
            Ev::ImagePulled(node, version) => {
                let version = self.versions[version].clone();
                self.pulls.remove(&(node, version.clone()));
                let name = self.nodes[node].name.clone();
                self.log("kubelet", || format!("{name}: image {version} pulled"));
                self.node_images[node].insert(version);
            }
            Ev::LeaderTransfer { shard, to, term } => self.log_leader_transferred(shard, to, term),

            Ev::ClientNext(c) => self.client_next(c),
            Ev::StmtDone(c, x) => self.stmt_done(c, x),
            Ev::CommitAtTn(c, x) => self.commit_at_tn(c, x),
            Ev::WalDone(x) => self.wal_done(x),
            Ev::CommitTimeout(c, x) => self.commit_timeout(c, x),
            Ev::UnlockRetry(c, x) => self.unlock_retry(c, x),
        }
    }

    /// Safety invariants, checked after every event: voluntary disruptions never cost a
    /// transaction; the TN never dies of them; no unsafe action.
    fn check_event_invariants(&mut self) {
        let unsafe_total = self.unsafe_actions.total();
        let tn_exits = self.tn_fatal_exit_times.len();
        let (seen_unsafe, seen_voluntary, seen_exits) = self.seen;
        if unsafe_total > seen_unsafe {
            let detail = self.unsafe_log.last().cloned().unwrap_or_default();
            self.violation("no unsafe action", detail);
        }
        if self.failures_voluntary > seen_voluntary {
            let detail = format!(
                "{} transaction(s) failed or ended unknown because of a voluntary disruption: {}",
                self.failures_voluntary - seen_voluntary,
                self.last_failure
            );
            self.violation("voluntary disruptions cost no transaction", detail);
        }
        if tn_exits > seen_exits && self.tn_fatal_exit_causes.last() == Some(&Cause::Voluntary) {
            self.violation(
                "no TN fatal exit from voluntary disruptions",
                format!(
                    "TN fatal exit #{tn_exits}: no involuntary fault kept its LOG shard or \
                     HAKeeper from answering"
                ),
            );
        }
        self.seen = (unsafe_total, self.failures_voluntary, tn_exits);
    }

    fn violation(&mut self, invariant: &str, detail: String) {
        let at = self.now.as_secs_f64();
        self.log("VIOLATION", || format!("{invariant}: {detail}"));
        self.violations.push(crate::report::Violation {
            at,
            invariant: invariant.to_string(),
            detail,
        });
    }

    fn scenario_event(&mut self, index: usize) {
        let kind = self.scenario.events[index]
            .kind(index)
            .expect("validated scenario");
        match kind {
            EventKind::Evict {
                pod,
                source,
                give_up_after,
            } => {
                self.log("k8s", || format!("eviction of {pod} requested by {source}"));
                let give_up_at = give_up_after.map(|d| self.now + d.millis());
                self.request_eviction(pod, source, give_up_at);
            }
            EventKind::DrainNode { node } => {
                let Some(n) = self.nodes.iter().position(|x| x.name == node) else {
                    return;
                };
                self.nodes[n].cordoned = true;
                self.log("k8s", || format!("kubectl drain {node}: cordoned"));
                for name in self.pods_on_node(n) {
                    self.request_eviction(name, "kubectl-drain".into(), None);
                }
            }
            EventKind::ScaleIn { group, replicas } => {
                let Some(gi) = self.groups.iter().position(|g| g.name == group) else {
                    return;
                };
                // Like a StatefulSet: the highest ordinals go first.
                let mut members: Vec<PodId> = self
                    .live_pods()
                    .filter(|&p| self.pods[p].cn_group == Some(gi))
                    .collect();
                members.sort_by_key(|&p| ordinal_key(&self.pods[p].name));
                let excess = members.len().saturating_sub(replicas);
                for &p in members.iter().rev().take(excess) {
                    self.add_removal(p, mo_core::RemovalReason::ScaleIn);
                }
            }
            EventKind::ScaleOut { group, replicas } => {
                let Some(gi) = self.groups.iter().position(|g| g.name == group) else {
                    return;
                };
                // The StatefulSet wants ordinals 0..replicas again: their pending scale-in
                // removals are withdrawn (the core decides what a withdrawn drain becomes).
                let kept: Vec<String> = self
                    .live_pods()
                    .filter(|&p| self.pods[p].cn_group == Some(gi))
                    .map(|p| self.pods[p].name.clone())
                    .filter(|n| (ordinal_key(n).1 as usize) < replicas)
                    .collect();
                let before = self.removals.len();
                self.removals.retain(|r| {
                    !(matches!(r.reason, mo_core::RemovalReason::ScaleIn) && kept.contains(&r.pod))
                });
                let withdrawn = before - self.removals.len();
                self.log("spec", || {
                    format!(
                        "group {group} scaled back to {replicas} ({withdrawn} pending removals withdrawn)"
                    )
                });
            }
            EventKind::ClaimRelease { pod } => {
                if let Some(&p) = self.pod_by_name.get(&pod) {
                    // Draining until its sessions have moved, then Idle (kept for reuse).
                    self.pods[p].pool_phase = Some(PoolPhase::Draining);
                    self.log("pool", || format!("claim on {pod} released: Draining"));
                }
            }
            EventKind::ClaimBind { pod } => {
                if let Some(&p) = self.pod_by_name.get(&pod) {
                    self.pods[p].pool_phase = Some(PoolPhase::Bound);
                    let before = self.removals.len();
                    self.removals.retain(|r| {
                        !(r.pod == pod
                            && matches!(r.reason, mo_core::RemovalReason::PoolReclaim { .. }))
                    });
                    let withdrawn = before != self.removals.len();
                    self.log("pool", || {
                        format!("{pod} bound by a claim (pending reclaim withdrawn: {withdrawn})")
                    });
                }
            }
            EventKind::Upgrade { version, strategy } => {
                self.log("spec", || {
                    format!("upgrade to {version} requested, strategy {strategy}")
                });
                // A rollout that completed makes what it installed the versions a later
                // rollback may restore; one still under way leaves them as they were.
                let previous_done = self.upgrade.is_some() && self.upgrade_applied().is_ok();
                if self.tracker.requested_at.is_none() || previous_done {
                    let mut original: BTreeMap<Component, BTreeSet<String>> = BTreeMap::new();
                    for p in self.live_pods() {
                        original
                            .entry(self.pods[p].component)
                            .or_default()
                            .insert(self.pods[p].version.clone());
                    }
                    if self.tracker.requested_at.is_none() {
                        self.tracker.cluster_existed = !original.is_empty();
                    }
                    self.tracker.original_versions = original;
                }
                self.tracker.requested_at.get_or_insert(self.now);
                self.tracker.advanced.clear();
                self.tracker.functional_seen.clear();
                self.tracker.halted = false;
                self.upgrade = Some(UpgradeSpec {
                    target_version: version,
                    strategy,
                });
            }
            EventKind::NodeFailure { node } => {
                if let Some(n) = self.nodes.iter().position(|x| x.name == node) {
                    self.fail_node(n);
                }
            }
            EventKind::CnCrash { pod } => {
                if let Some(&p) = self.pod_by_name.get(&pod) {
                    self.log("fault", || format!("CN {pod} crashes"));
                    self.crash_process(p, Cause::Involuntary, true);
                }
            }
            EventKind::DeletePod { pod } => {
                if let Some(&p) = self.pod_by_name.get(&pod) {
                    self.log("k8s", || format!("kubectl delete pod {pod}"));
                    // A plain DELETE bypasses every protection the operator has: its
                    // consequences are attributed to it, not to the operator.
                    self.delete_pod(p, Cause::Involuntary, true, "plain delete");
                }
            }
            EventKind::OperatorRestart {
                drop_pending_actions,
            } => {
                self.crash_pending = Some(drop_pending_actions);
            }
            EventKind::Fault {
                cn_never_heartbeats_after_restart,
            } => {
                self.fault_cn_never_heartbeats = cn_never_heartbeats_after_restart;
                self.log("fault", || {
                    format!("restarted CNs never heartbeat: {cn_never_heartbeats_after_restart}")
                });
            }
            EventKind::HakeeperOutage { duration } => {
                let until = self.now + duration.millis();
                self.hakeeper.outage_until = Some(until);
                self.schedule(until, Ev::HakeeperOutageEnd);
                self.log("fault", || format!("HAKeeper unreachable for {duration}"));
                self.on_log_change();
            }
        }
    }

    pub(crate) fn add_removal(&mut self, pod: PodId, reason: mo_core::RemovalReason) {
        let name = self.pods[pod].name.clone();
        if self.removals.iter().any(|r| r.pod == name) {
            return;
        }
        self.removal_counter += 1;
        let request = RemovalRequest {
            id: self.removal_counter,
            pod: name.clone(),
            uid: self.pods[pod].uid.clone(),
            reason,
            requested_at: self.now,
        };
        self.log("spec", || {
            format!("removal of {name} requested: {:?}", request.reason)
        });
        self.removals.push(request);
    }

    fn consolidation_tick(&mut self) {
        let Some(spec) = self.scenario.consolidation.clone() else {
            return;
        };
        self.after(spec.interval, Ev::ConsolidationTick);
        if let Some(n) = self.consolidation_target {
            if self.pods_on_node(n).is_empty() {
                let node = self.nodes[n].name.clone();
                self.log("agent", || format!("node {node} is empty: removed"));
                self.consolidation_target = None;
            } else {
                return;
            }
        }
        // The agent's own (flawed) judgment: a node whose pods are all CNs without sessions.
        let candidate = (0..self.nodes.len()).find(|&n| {
            let node = &self.nodes[n];
            let pods = self.pods_on_node(n);
            node.alive
                && !node.cordoned
                && !pods.is_empty()
                && pods.iter().all(|name| {
                    let p = self.pod_by_name[name];
                    self.pods[p].component == Component::Cn
                        && self.cns.get(&p).is_some_and(|c| c.sessions.is_empty())
                })
        });
        let Some(n) = candidate else {
            return;
        };
        self.consolidation_target = Some(n);
        self.nodes[n].cordoned = true;
        let node = self.nodes[n].name.clone();
        self.log("agent", || {
            format!("node consolidation: moving pods off under-used {node}")
        });
        for name in self.pods_on_node(n) {
            let p = self.pod_by_name[&name];
            if spec.method == ConsolidationMethod::PoolReclaim && self.pods[p].pool_phase.is_some()
            {
                self.log("agent", || {
                    format!("{name}: Pod is not managed by CNClaim, evict it gracefully")
                });
                self.add_removal(
                    p,
                    mo_core::RemovalReason::PoolReclaim {
                        requested_by: "consolidation-agent".into(),
                    },
                );
            } else {
                self.request_eviction(name, "consolidation-agent".into(), None);
            }
        }
    }

    fn operator_tick(&mut self) {
        if self.upgrade.is_some() {
            for c in Component::ALL {
                if !self.tracker.functional_seen.contains(&c) && self.functional_gate(c).is_ok() {
                    self.tracker.functional_seen.push(c);
                }
            }
        }
        let observation = self.observe();
        let results = std::mem::take(&mut self.last_results);
        let decision = self.policy.decide(mo_core::PolicyInput {
            observation: &observation,
            results: &results,
        });
        // Recorded before acted on.
        let record = self.policy.progress_record();
        if !decision.actions.is_empty() || record != self.policy_record {
            self.wake_operator();
        }
        self.policy_record = record;
        for note in decision.notes {
            self.record_note(note);
        }
        if let Some(drop_pending_actions) = self.crash_pending.take() {
            self.restart_operator(drop_pending_actions, decision.actions.len());
            if drop_pending_actions {
                return;
            }
        }
        let mut results = Vec::with_capacity(decision.actions.len());
        for action in decision.actions {
            let result = self.apply_action(&action);
            self.log("operator", || match &result {
                Ok(_) => format!("{action:?}"),
                Err(e) => format!("{action:?} -> {e}"),
            });
            results.push(ActionResult { action, result });
        }
        self.last_results = results;
    }

    /// The operator process dies and a new one starts from the persisted progress record.
    /// With `drop_pending_actions` it died after recording its decision but before acting.
    /// The safe policy's controller reconciles again soon after a change (its own or a pod's
    /// seen by a watch); several changes before it does wake it once.
    pub(crate) fn wake_operator(&mut self) {
        if self.wake_pending || !self.reacts_to_changes {
            return;
        }
        self.wake_pending = true;
        self.after(self.t.operator_reaction, Ev::OperatorWake);
    }

    /// A pod's readiness changes, which a watch reports to the operator.
    pub(crate) fn set_ready(&mut self, p: PodId, ready: bool) {
        self.pods[p].ready = ready;
        if ready {
            self.tracker.cns_moving.remove(&self.pods[p].name);
        }
        self.wake_operator();
    }

    fn restart_operator(&mut self, drop_pending_actions: bool, pending: usize) {
        self.operator_restarts += 1;
        let record = self.policy_record.clone();
        self.policy = make_policy(&self.scenario.policy, &self.scenario, record.as_deref())
            .expect("the policy was built from this scenario before");
        self.last_results.clear();
        let fate = if drop_pending_actions {
            "lost"
        } else {
            "applied"
        };
        self.log("operator", || {
            format!(
                "operator restarted from its progress record ({pending} pending actions {fate})"
            )
        });
    }

    fn finish(&mut self, wall_seconds: f64) -> Report {
        let applied = self.upgrade_applied();
        let upgrade = self.tracker.requested_at.map(|requested| UpgradeReport {
            started_at: Some(requested.as_secs_f64()),
            finished_at: self.tracker.finished_at.map(Millis::as_secs_f64),
            applied: applied.is_ok(),
            not_applied: applied.clone().err(),
            phases: self
                .tracker
                .phases
                .iter()
                .map(|(c, s, f)| PhaseReport {
                    component: *c,
                    started_at: s.map(Millis::as_secs_f64),
                    finished_at: f.map(Millis::as_secs_f64),
                })
                .collect(),
        });
        // Completion is judged from the pods and the kernel, not from the policy's word alone.
        let upgrade_done =
            self.upgrade.is_none() || (self.tracker.finished_at.is_some() && applied.is_ok());
        let removals_done = self.removals.is_empty();
        let mut errors = self.errors_by_kind.clone();
        errors.retain(|_, v| *v > 0);
        Report {
            scenario: self.scenario.name.clone(),
            policy: self.policy.name().to_string(),
            seed: self.scenario.seed,
            completed: upgrade_done && removals_done,
            sim_seconds: self.now.as_secs_f64(),
            wall_seconds,
            events: self.events_processed,
            txns: self.counts.clone(),
            background_txns: self.background_counts.clone(),
            kernel_mechanisms: self
                .mechanisms
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            errors_by_kind: errors,
            tn_fatal_exits: self.tn_fatal_exit_times.len() as u64,
            tn_fatal_exit_times: self
                .tn_fatal_exit_times
                .iter()
                .map(|t| t.as_secs_f64())
                .collect(),
            proxy_no_route_seconds: self.no_route.as_secs_f64(),
            longest_table_stall_seconds: self.longest_table_stall.as_secs_f64(),
            unsafe_actions: self.unsafe_actions.clone(),
            upgrade,
            unsafe_action_log: self.unsafe_log.clone(),
            txn_failures_by_cause: crate::report::FailuresByCause {
                voluntary: self.failures_voluntary,
                involuntary: self.failures_involuntary,
                tn_restart: self.failures_tn_restart,
                proxy_restart: self.failures_proxy_restart,
            },
            waiting_on: self.policy.waiting_on().into_iter().collect(),
            operator_restarts: self.operator_restarts,
            violations: self.violations.clone(),
        }
    }
}

/// Sort key that orders `name-2` before `name-10`.
fn ordinal_key(name: &str) -> (String, u64) {
    match name.rsplit_once('-') {
        Some((stem, n)) => (stem.to_string(), n.parse().unwrap_or(u64::MAX)),
        None => (name.to_string(), 0),
    }
}

pub(crate) use mo_core::component::cn_uuid;
