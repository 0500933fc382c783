//! Every timing of the model, with defaults from `shared/reference/matrixone.md` (cited per field)
//! or, where the reference is silent, from Kubernetes defaults. All are overridable per scenario.

use crate::duration::Dur;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timings {
    // --- Kubernetes ---
    /// Pulling a new image onto a node (once per node and version).
    pub image_pull: Dur,
    /// Pending → Running once the image is on the node: scheduling, container create.
    pub container_start: Dur,
    /// From the API delete to the kubelet running preStop / sending SIGTERM.
    pub kubelet_stop_delay: Dur,
    /// `terminationGracePeriodSeconds` (Kubernetes default 30 s).
    pub termination_grace: Dur,
    /// CrashLoopBackOff: first delay, doubling up to the cap (Kubernetes: 10 s, 5 min).
    pub crash_backoff_initial: Dur,
    pub crash_backoff_max: Dur,
    /// Pods on a failed node are deleted after this (taint-based eviction default, 5 min).
    pub node_failure_eviction: Dur,

    // --- LOG (reference: "Roles and what each needs") ---
    /// A restarted replica replays its local log before it can vote.
    pub log_rejoin: Dur,
    /// After rejoining, a replica needs a leader for this long to catch up.
    pub log_catch_up: Dur,
    /// Election after leader loss.
    pub log_election: Dur,
    /// A requested leadership transfer to a caught-up replica.
    pub log_leader_transfer: Dur,
    pub log_shutdown: Dur,

    // --- HAKeeper expiry (reference: "HAKeeper") ---
    pub cn_expiry: Dur,
    pub tn_expiry: Dur,
    /// A LOG store's record expires after this (`hakeeper/config.go` `LogStoreExpired`, 5 min).
    pub log_store_expiry: Dur,
    /// A proxy's record expires after this (`ProxyStoreExpired`, 30 s).
    pub proxy_expiry: Dur,
    /// How often a proxy heartbeats (`proxy/config.go` `defaultHeartbeatInterval`, 3 s).
    pub proxy_heartbeat: Dur,
    pub heartbeat: Dur,
    /// How often a CN heartbeats (`[cn.hakeeper] hakeeper-heartbeat-interval`, default 1 s),
    /// rounded to the HAKeeper tick (`heartbeat`).
    pub cn_heartbeat: Dur,

    // --- TN (reference: "WAL append with no log leader") ---
    pub wal_try_timeout: Dur,
    pub wal_total_timeout: Dur,
    pub wal_backoff_initial: Dur,
    pub wal_backoff_max: Dur,
    pub wal_append_latency: Dur,
    /// TN waits at most this long for HAKeeper at start.
    pub tn_hakeeper_wait: Dur,
    /// TN start-up (replay) once HAKeeper is found.
    pub tn_start: Dur,
    pub tn_shutdown: Dur,

    // --- CN and lock service (reference: "Lock service") ---
    pub cn_start: Dur,
    /// CN waits ≤ 5 min for HAKeeper, then ≤ 30 s for a TN, else it panics at start; a
    /// running CN also retries TN requests (commit, lock-table allocation) for `cn_tn_wait`.
    pub cn_hakeeper_wait: Dur,
    pub cn_tn_wait: Dur,
    pub bind_keepalive: Dur,
    /// `keepBindTimeout`: the allocator's invalidation check runs this often and takes owners
    /// silent for at least this long, so their binds move 1–2 times this after they went
    /// silent (`lockservice/lock_table_allocator.go` `checkInvalidBinds`).
    pub bind_invalidation: Dur,
    /// `RemoteLockTimeout`: a lock owner releases the transactions of a requester that has
    /// been silent this long and fails validation, at a check that runs this often
    /// (`lockservice/service_remote.go` `unlockTimeoutRemoteTxn`; v1.2.4 `cfg.go` 1 min).
    pub remote_lock_timeout: Dur,
    pub lock_rpc_latency: Dur,
    /// From SIGTERM to the lock service closing (frontend, pipelines, RPC, gossip close first).
    pub cn_lock_close: Dur,
    /// From SIGTERM to process exit.
    pub cn_shutdown: Dur,

    // --- Proxy (v1.2.4 `pkg/proxy`) ---
    /// The proxy's CN list refresh (`config.go` `defaultRefreshInterval`).
    pub proxy_refresh: Dur,
    /// Moving sessions off Draining CNs (`scaling.go` `defaultScalingInterval`).
    pub proxy_rebalance: Dur,
    pub proxy_start: Dur,
    pub proxy_shutdown: Dur,

    // --- Operator ---
    pub operator_tick: Dur,
    /// How soon the safe policy decides again after a decision that acted or changed its
    /// progress record, and after a pod change a watch reports (its controller reconciles on
    /// its own status change and on pod watch events, at most once per
    /// `--min-kernel-read-gap`, 100 ms). 0: the tick only. The legacy and fixed-window models
    /// keep the 1 s tick they were calibrated with.
    pub operator_reaction: Dur,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            image_pull: Dur::secs(30),
            container_start: Dur::secs(5),
            kubelet_stop_delay: Dur::ms(900),
            termination_grace: Dur::secs(30),
            crash_backoff_initial: Dur::secs(10),
            crash_backoff_max: Dur::mins(5),
            node_failure_eviction: Dur::mins(5),
            log_rejoin: Dur::secs(30),
            log_catch_up: Dur::secs(60),
            log_election: Dur::secs(5),
            log_leader_transfer: Dur::ms(500),
            log_shutdown: Dur::secs(2),
            cn_expiry: Dur::secs(30),
            tn_expiry: Dur::secs(10),
            log_store_expiry: Dur::mins(5),
            proxy_expiry: Dur::secs(30),
            proxy_heartbeat: Dur::secs(3),
            heartbeat: Dur::secs(1),
            cn_heartbeat: Dur::secs(1),
            // v1.2.4 `logservicedriver/options.go` `NewDefaultConfig`: each append 10 s
            // (`ClientAppendDuration`), then retried back to back for 3 min (`RetryTimeout`).
            wal_try_timeout: Dur::secs(10),
            wal_total_timeout: Dur::mins(3),
            wal_backoff_initial: Dur::ms(0),
            wal_backoff_max: Dur::ms(0),
            wal_append_latency: Dur::ms(2),
            tn_hakeeper_wait: Dur::mins(2),
            tn_start: Dur::secs(5),
            tn_shutdown: Dur::secs(1),
            cn_start: Dur::secs(10),
            cn_hakeeper_wait: Dur::mins(5),
            cn_tn_wait: Dur::secs(30),
            bind_keepalive: Dur::secs(1),
            bind_invalidation: Dur::secs(10),
            remote_lock_timeout: Dur::mins(1),
            lock_rpc_latency: Dur::ms(1),
            cn_lock_close: Dur::ms(50),
            cn_shutdown: Dur::secs(1),
            proxy_refresh: Dur::secs(5),
            proxy_rebalance: Dur::secs(3),
            proxy_start: Dur::secs(3),
            proxy_shutdown: Dur::ms(500),
            operator_tick: Dur::secs(1),
            operator_reaction: Dur::ms(100),
        }
    }
}
