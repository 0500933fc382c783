//! The JSON summary of a run. Key names are a contract: later tools read them.

use mo_core::Component;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TxnCounts {
    pub committed: u64,
    pub failed_definite: u64,
    pub unknown: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UnsafeActions {
    pub pod_deleted_without_drain_confirmation: u64,
    pub phase_advanced_on_failed_gate: u64,
    pub log_restart_without_quorum_margin: u64,
    /// The policy said the upgrade finished while a pod still ran (or was to run) another
    /// version: judged from the pods, not from the policy's word.
    #[serde(default)]
    pub finished_with_pods_not_upgraded: u64,
    /// A proxy stopped on purpose while no other proxy could route (more than one proxy).
    #[serde(default)]
    pub proxy_stopped_without_another_route: u64,
    /// The TN stopped on purpose other than by the one restart an upgrade to a version needs
    /// (an eviction, a second restart to the same version).
    #[serde(default)]
    pub tn_stopped_without_need: u64,
    /// A pod restarted onto another version after the policy said its rollout was halted.
    #[serde(default)]
    pub restarted_while_halted: u64,
    /// A pod restarted onto a version the cluster is not going to: neither the requested
    /// target, nor what the cluster ran before its upgrades (a rollback's), nor its own.
    #[serde(default)]
    pub moved_to_abandoned_version: u64,
    /// More CNs restarting onto another version at once than the upgrade's width allows.
    #[serde(default)]
    pub cns_restarted_beyond_width: u64,
    /// A cluster that was running taken for one being created (its rollout raised the
    /// creation's alarm instead of halting).
    #[serde(default)]
    pub rollout_taken_for_creation: u64,
    /// A CN restarted onto a release whose catalog is older than the one the cluster's CNs
    /// moved it to: the kernel stops such a CN at start ("cannot startup a old version").
    #[serde(default)]
    pub cn_sent_back_past_its_catalog: u64,
}

impl UnsafeActions {
    pub fn total(&self) -> u64 {
        self.pod_deleted_without_drain_confirmation
            + self.phase_advanced_on_failed_gate
            + self.log_restart_without_quorum_margin
            + self.finished_with_pods_not_upgraded
            + self.proxy_stopped_without_another_route
            + self.tn_stopped_without_need
            + self.restarted_while_halted
            + self.moved_to_abandoned_version
            + self.cns_restarted_beyond_width
            + self.rollout_taken_for_creation
            + self.cn_sent_back_past_its_catalog
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseReport {
    pub component: Component,
    pub started_at: Option<f64>,
    pub finished_at: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UpgradeReport {
    pub started_at: Option<f64>,
    pub finished_at: Option<f64>,
    /// At the end of the run every pod runs the target version and every component's
    /// functional gate passes (the ground truth, whatever the policy said).
    #[serde(default)]
    pub applied: bool,
    /// When not applied: the first thing found not in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_applied: Option<String>,
    pub phases: Vec<PhaseReport>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub scenario: String,
    pub policy: String,
    pub seed: u64,
    /// Every requested change (upgrade, removals) finished by the end of the run.
    pub completed: bool,
    pub sim_seconds: f64,
    pub wall_seconds: f64,
    /// Simulation events processed.
    pub events: u64,
    pub txns: TxnCounts,
    /// The kernel's own transactions (see `workload.background`), counted apart from the
    /// clients' and not judged.
    #[serde(default)]
    pub background_txns: TxnCounts,
    /// How often the run went through each kernel mechanism the safety claims depend on.
    #[serde(default)]
    pub kernel_mechanisms: BTreeMap<String, u64>,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub tn_fatal_exits: u64,
    /// Simulated seconds at which the TN exited fatally.
    pub tn_fatal_exit_times: Vec<f64>,
    pub proxy_no_route_seconds: f64,
    /// The longest time a table with DML went without a commit that locked it.
    #[serde(default)]
    pub longest_table_stall_seconds: f64,
    pub unsafe_actions: UnsafeActions,
    pub upgrade: Option<UpgradeReport>,
    /// Why each unsafe action was counted (time, what, why).
    pub unsafe_action_log: Vec<String>,
    /// Failed and unknown transactions by what caused them: voluntary disruptions (the
    /// operator's or an evictor's doing) or injected involuntary faults.
    pub txn_failures_by_cause: FailuresByCause,
    /// What the policy waits on at the end of the run, per subject.
    pub waiting_on: BTreeMap<String, String>,
    pub operator_restarts: u64,
    /// Invariant violations found while running (only when invariants were checked).
    pub violations: Vec<Violation>,
}

/// A structured timeline for reports (kept only when asked for).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    pub events: Vec<TraceEvent>,
    /// Transaction outcomes per `bucket_seconds`: committed, failed, unknown.
    pub bucket_seconds: f64,
    pub outcomes: Vec<[u64; 3]>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    pub at: f64,
    /// A pod name, or `phases`, `rollout`, `unsafe`.
    pub lane: String,
    /// `deleted`, `sigterm`, `gone`, `running`, `restart`, `fatal`, `phase-start`,
    /// `phase-end`, `hold`, `release`, `unsafe`, `registered`.
    pub kind: String,
    pub text: String,
}

/// A broken invariant, found on the event where it broke.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    pub at: f64,
    pub invariant: String,
    pub detail: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FailuresByCause {
    pub voluntary: u64,
    pub involuntary: u64,
    /// Lost to the operator's restart of the TN to upgrade it (commits in flight or sent while
    /// it was down, locks held across it): what the stock kernel costs, the operator's doing.
    #[serde(default)]
    pub tn_restart: u64,
    /// Lost to the operator's restart of the only proxy (its kernel closes every connection at
    /// once): the transactions running on its connections then.
    #[serde(default)]
    pub proxy_restart: u64,
}

impl Report {
    /// The JSON with the non-deterministic part (wall time) zeroed, for reproducibility checks.
    pub fn deterministic_json(&self) -> String {
        let mut copy = self.clone();
        copy.wall_seconds = 0.0;
        serde_json::to_string(&copy).expect("report serializes")
    }
}
