//! Scenario files (YAML). The format is documented in `docs/scenario-format.md`.
//! Parsing never panics: every problem is an error naming the field.

use crate::duration::Dur;
use crate::timings::Timings;
use mo_core::{Millis, Strategy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("cannot read scenario {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("scenario field `{field}`: {message}")]
    Field { field: String, message: String },
}

fn field_err(field: impl Into<String>, message: impl Into<String>) -> ScenarioError {
    ScenarioError::Field {
        field: field.into(),
        message: message.into(),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Simulated time to run.
    pub duration: Dur,
    /// `legacy` (more policies arrive with the safety engine).
    #[serde(default = "default_policy")]
    pub policy: String,
    #[serde(default)]
    pub legacy: LegacyOptions,
    /// Options of the `safe` policy.
    #[serde(default)]
    pub safe: mo_core::SafeConfig,
    #[serde(default)]
    pub fixed_window: FixedWindowOptions,
    /// What the simulated kernel offers beyond today's MatrixOne.
    #[serde(default)]
    pub kernel: KernelOptions,
    pub topology: Topology,
    /// Lock tables already bound when the run starts (e.g. to a pooled CN that is Idle now).
    #[serde(default)]
    pub lock_tables: Vec<LockTableSpec>,
    #[serde(default)]
    pub workload: WorkloadSpec,
    #[serde(default)]
    pub timings: Timings,
    #[serde(default)]
    pub consolidation: Option<ConsolidationSpec>,
    /// PodDisruptionBudgets present from the start.
    #[serde(default)]
    pub pdbs: Vec<PdbSpec>,
    #[serde(default)]
    pub events: Vec<EventSpec>,
}

fn default_seed() -> u64 {
    1
}
fn default_policy() -> String {
    "legacy".into()
}

/// How the existing Go operator behaves (see `shared/reference/matrixone.md`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LegacyOptions {
    /// Drain timeout after which a CN is released anyway; `null` = released at once.
    pub drain_timeout: Option<Dur>,
    /// Minimum time a drain lasts.
    pub drain_min: Dur,
}

impl Default for LegacyOptions {
    fn default() -> Self {
        LegacyOptions {
            drain_timeout: Some(Dur::mins(5)),
            drain_min: Dur::secs(15),
        }
    }
}

/// The naive fix: legacy pacing plus a fixed wait after every restarted pod.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FixedWindowOptions {
    pub window: Dur,
}

impl Default for FixedWindowOptions {
    fn default() -> Self {
        FixedWindowOptions {
            window: Dur::mins(5),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KernelOptions {
    /// The instance-bound `BeginDrain` / `QueryDrain` / `CancelDrain` the reports ask for.
    pub drain_protocol: bool,
    /// HAKeeper moves a shard's leadership on request (an operator extension; a stock kernel
    /// answers "not supported").
    pub leader_transfer: bool,
    /// The TN's WAL-append tolerance can be widened at run time (an operator extension; a
    /// stock kernel answers "not supported" and keeps its built-in retry budget).
    pub wal_tolerance: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Version (image tag) every pod runs at the start.
    pub version: String,
    /// Number of nodes; default one node per pod.
    #[serde(default)]
    pub nodes: Option<usize>,
    #[serde(default = "three")]
    pub log_replicas: usize,
    #[serde(default = "one")]
    pub tn_replicas: usize,
    pub cn_groups: Vec<CnGroupSpec>,
    #[serde(default = "one")]
    pub proxy_replicas: usize,
}

fn three() -> usize {
    3
}
fn one() -> usize {
    1
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CnGroupSpec {
    pub name: String,
    pub replicas: usize,
    /// Explicit pod names (default `<name>-<ordinal>`); the CN UUID derives from the name.
    #[serde(default)]
    pub pod_names: Vec<String>,
    /// A CN pool: pods are Idle unless bound by a claim.
    #[serde(default)]
    pub pool: bool,
    /// For a pool, how many pods start Bound (serving the workload).
    #[serde(default)]
    pub bound: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockTableSpec {
    pub table: String,
    /// CN pod whose lock service owns the table at the start.
    pub owner: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadSpec {
    pub clients: usize,
    /// Transactions per second per client (think time is exponential with this rate).
    pub txn_rate: f64,
    pub statements_min: usize,
    pub statements_max: usize,
    pub tables: Vec<String>,
    pub statement_latency: Dur,
    /// A client gives up waiting for COMMIT after this (its outcome is then unknown).
    pub commit_timeout: Dur,
    pub start: Dur,
    /// Clients close a connection this old between transactions and open a new one through
    /// the SQL Service, as connection pools do (`None`: they keep it until it breaks).
    pub connection_lifetime: Option<Dur>,
    /// The kernel's own transactions on every CN (`None`: none, for tests of other rules).
    pub background: Option<BackgroundSpec>,
}

/// The kernel runs transactions of its own on every CN, Draining or not: HAKeeper's task
/// scheduler gives tasks to any CN that has not expired (v1.2.4 `hakeeper/task/task_scheduler.go`
/// `Schedule`, no work-state filter), and each CN flushes its statement log and refills its
/// auto-increment cache (measured on a running v1.2.4 kernel: `mo_logger`'s `LOAD DATA`, updates
/// of `mo_increment_columns`). They lock tables like any transaction, so an idle CN can own lock
/// tables, hold locks in others' and be counted by a hand-over. Their outcomes are counted apart:
/// they are not the clients', and a CN told to restart refuses its own (20635) by the kernel's rule.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackgroundSpec {
    /// Mean time between two background transactions of one CN (exponential).
    pub interval: Dur,
    /// The internal tables they lock (one statement each, in a random order).
    pub tables: Vec<String>,
}

impl Default for BackgroundSpec {
    fn default() -> Self {
        BackgroundSpec {
            interval: Dur::secs(10),
            tables: vec![
                "mo_catalog.mo_increment_columns".into(),
                "system.statement_info".into(),
            ],
        }
    }
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            clients: 8,
            txn_rate: 5.0,
            statements_min: 1,
            statements_max: 3,
            tables: vec![
                "documents".into(),
                "orders".into(),
                "items".into(),
                "events".into(),
            ],
            statement_latency: Dur::ms(20),
            commit_timeout: Dur::secs(60),
            start: Dur::secs(0),
            connection_lifetime: Some(Dur::secs(30)),
            background: Some(BackgroundSpec::default()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConsolidationMethod {
    /// The Eviction API (honours PDBs and webhooks; 429 is retried).
    Eviction,
    /// Hands the pooled CN back to the pool ("evict it gracefully"), i.e. the operator's drain.
    PoolReclaim,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsolidationSpec {
    pub start: Dur,
    #[serde(default = "thirty_secs")]
    pub interval: Dur,
    /// Retry delay after a refused (429) eviction.
    #[serde(default = "ten_secs")]
    pub retry: Dur,
    #[serde(default = "eviction")]
    pub method: ConsolidationMethod,
}

fn thirty_secs() -> Dur {
    Dur::secs(30)
}
fn ten_secs() -> Dur {
    Dur::secs(10)
}
fn eviction() -> ConsolidationMethod {
    ConsolidationMethod::Eviction
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PdbSpec {
    pub component: mo_core::Component,
    pub max_unavailable: usize,
}

/// One timed event: `at` plus exactly one kind.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    pub at: Dur,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evict: Option<PodRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_node: Option<NodeRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_in: Option<ScaleIn>,
    /// The group's replicas raised again (a scale-in reverted): pending scale-in removals of
    /// the ordinals below `replicas` are withdrawn; pods already gone stay gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_out: Option<ScaleIn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_release: Option<PodRef>,
    /// A claim binds a pooled CN again (withdraws a pending pool reclaim of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_bind: Option<PodRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_failure: Option<NodeRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cn_crash: Option<PodRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_pod: Option<PodRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultToggle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hakeeper_outage: Option<Outage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_restart: Option<OperatorRestart>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorRestart {
    /// The operator dies after recording its next decision but before acting on it.
    #[serde(default)]
    pub drop_pending_actions: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodRef {
    pub pod: String,
    /// Who asks (for evictions): `kubectl-drain`, `cluster-autoscaler`, …
    #[serde(default = "default_source")]
    pub source: String,
    /// For evictions: the evictor stops retrying after this (a drain tool that times out, an
    /// autoscaler that picks another node). Without it, it retries for good.
    #[serde(default)]
    pub give_up_after: Option<Dur>,
}

fn default_source() -> String {
    "kubectl".into()
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRef {
    pub node: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleIn {
    pub group: String,
    pub replicas: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpgradeEvent {
    pub version: String,
    /// JSON text or a mapping; default LOG → TN → CN → Proxy.
    #[serde(default)]
    pub strategy: Option<Strategy>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultToggle {
    /// Kernel bug of incident 002: a CN process started after this never heartbeats to HAKeeper.
    pub cn_never_heartbeats_after_restart: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    pub duration: Dur,
}

/// A validated event.
#[derive(Clone, Debug)]
pub enum EventKind {
    Evict {
        pod: String,
        source: String,
        give_up_after: Option<Dur>,
    },
    DrainNode {
        node: String,
    },
    ScaleIn {
        group: String,
        replicas: usize,
    },
    ScaleOut {
        group: String,
        replicas: usize,
    },
    ClaimRelease {
        pod: String,
    },
    ClaimBind {
        pod: String,
    },
    Upgrade {
        version: String,
        strategy: Strategy,
    },
    NodeFailure {
        node: String,
    },
    CnCrash {
        pod: String,
    },
    DeletePod {
        pod: String,
    },
    Fault {
        cn_never_heartbeats_after_restart: bool,
    },
    HakeeperOutage {
        duration: Dur,
    },
    OperatorRestart {
        drop_pending_actions: bool,
    },
}

impl EventSpec {
    pub fn kind(&self, index: usize) -> Result<EventKind, ScenarioError> {
        let mut kinds: Vec<EventKind> = Vec::new();
        if let Some(p) = &self.evict {
            kinds.push(EventKind::Evict {
                pod: p.pod.clone(),
                source: p.source.clone(),
                give_up_after: p.give_up_after,
            });
        }
        if let Some(n) = &self.drain_node {
            kinds.push(EventKind::DrainNode {
                node: n.node.clone(),
            });
        }
        if let Some(s) = &self.scale_in {
            kinds.push(EventKind::ScaleIn {
                group: s.group.clone(),
                replicas: s.replicas,
            });
        }
        if let Some(s) = &self.scale_out {
            kinds.push(EventKind::ScaleOut {
                group: s.group.clone(),
                replicas: s.replicas,
            });
        }
        if let Some(p) = &self.claim_release {
            kinds.push(EventKind::ClaimRelease { pod: p.pod.clone() });
        }
        if let Some(p) = &self.claim_bind {
            kinds.push(EventKind::ClaimBind { pod: p.pod.clone() });
        }
        if let Some(u) = &self.upgrade {
            kinds.push(EventKind::Upgrade {
                version: u.version.clone(),
                strategy: u.strategy.clone().unwrap_or_default(),
            });
        }
        if let Some(n) = &self.node_failure {
            kinds.push(EventKind::NodeFailure {
                node: n.node.clone(),
            });
        }
        if let Some(p) = &self.cn_crash {
            kinds.push(EventKind::CnCrash { pod: p.pod.clone() });
        }
        if let Some(p) = &self.delete_pod {
            kinds.push(EventKind::DeletePod { pod: p.pod.clone() });
        }
        if let Some(f) = &self.fault {
            kinds.push(EventKind::Fault {
                cn_never_heartbeats_after_restart: f.cn_never_heartbeats_after_restart,
            });
        }
        if let Some(o) = &self.hakeeper_outage {
            kinds.push(EventKind::HakeeperOutage {
                duration: o.duration,
            });
        }
        if let Some(o) = &self.operator_restart {
            kinds.push(EventKind::OperatorRestart {
                drop_pending_actions: o.drop_pending_actions,
            });
        }
        if kinds.len() != 1 {
            return Err(field_err(
                format!("events[{index}]"),
                format!(
                    "give exactly one of evict, drain_node, scale_in, scale_out, claim_release, claim_bind, upgrade, \
                     node_failure, cn_crash, delete_pod, fault, hakeeper_outage, \
                     operator_restart (found {})",
                    kinds.len()
                ),
            ));
        }
        Ok(kinds.pop().expect("exactly one"))
    }
}

impl Scenario {
    pub fn from_file(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Scenario::from_yaml(&text)
    }

    pub fn from_yaml(text: &str) -> Result<Scenario, ScenarioError> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let scenario: Scenario = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." {
                "(top level)".to_string()
            } else {
                path
            };
            field_err(field, e.into_inner().to_string())
        })?;
        scenario.validate()?;
        Ok(scenario)
    }

    pub fn to_yaml(&self) -> String {
        serde_yaml_ng::to_string(self).expect("a scenario always serializes")
    }

    /// Pod names of the initial topology, in creation order.
    pub fn pod_names(&self) -> Vec<String> {
        let t = &self.topology;
        let mut names: Vec<String> = (0..t.log_replicas).map(|i| format!("log-{i}")).collect();
        names.extend((0..t.tn_replicas).map(|i| format!("tn-{i}")));
        for g in &t.cn_groups {
            names.extend(g.pod_name_list());
        }
        names.extend((0..t.proxy_replicas).map(|i| format!("proxy-{i}")));
        names
    }

    pub fn node_names(&self) -> Vec<String> {
        let count = self
            .topology
            .nodes
            .unwrap_or_else(|| self.pod_names().len());
        (1..=count).map(|i| format!("node-{i}")).collect()
    }

    pub fn cn_pod_names(&self) -> Vec<String> {
        self.topology
            .cn_groups
            .iter()
            .flat_map(|g| g.pod_name_list())
            .collect()
    }

    pub fn validate(&self) -> Result<(), ScenarioError> {
        if self.name.trim().is_empty() {
            return Err(field_err("name", "must not be empty"));
        }
        if self.duration.millis().0 == 0 {
            return Err(field_err("duration", "must be greater than zero"));
        }
        if !crate::policy::KNOWN_POLICIES.contains(&self.policy.as_str()) {
            return Err(field_err(
                "policy",
                format!(
                    "unknown policy `{}` (known: {})",
                    self.policy,
                    crate::policy::KNOWN_POLICIES.join(", ")
                ),
            ));
        }
        let t = &self.topology;
        if t.version.trim().is_empty() {
            return Err(field_err("topology.version", "must not be empty"));
        }
        if t.log_replicas == 0 {
            return Err(field_err("topology.log_replicas", "at least 1 LOG replica"));
        }
        if t.tn_replicas != 1 {
            return Err(field_err(
                "topology.tn_replicas",
                "exactly 1 TN is modelled",
            ));
        }
        if t.proxy_replicas == 0 {
            return Err(field_err("topology.proxy_replicas", "at least 1 proxy"));
        }
        if t.cn_groups.is_empty() {
            return Err(field_err("topology.cn_groups", "at least one CN group"));
        }
        let mut group_names = BTreeSet::new();
        for (i, g) in t.cn_groups.iter().enumerate() {
            if g.name.trim().is_empty() || !group_names.insert(g.name.as_str()) {
                return Err(field_err(
                    format!("topology.cn_groups[{i}].name"),
                    format!("empty or duplicate group name `{}`", g.name),
                ));
            }
            if g.replicas == 0 {
                return Err(field_err(
                    format!("topology.cn_groups[{i}].replicas"),
                    "at least 1",
                ));
            }
            if !g.pod_names.is_empty() && g.pod_names.len() != g.replicas {
                return Err(field_err(
                    format!("topology.cn_groups[{i}].pod_names"),
                    format!(
                        "has {} names for {} replicas",
                        g.pod_names.len(),
                        g.replicas
                    ),
                ));
            }
            if g.bound > g.replicas || (g.bound > 0 && !g.pool) {
                return Err(field_err(
                    format!("topology.cn_groups[{i}].bound"),
                    "only for pools, at most `replicas`",
                ));
            }
        }
        let pods = self.pod_names();
        let mut seen = BTreeSet::new();
        for p in &pods {
            if !seen.insert(p.as_str()) {
                return Err(field_err(
                    "topology",
                    format!("pod name `{p}` is used twice"),
                ));
            }
        }
        if let Some(n) = t.nodes
            && n == 0
        {
            return Err(field_err("topology.nodes", "at least 1 node"));
        }
        let w = &self.workload;
        if w.tables.is_empty() {
            return Err(field_err("workload.tables", "at least one table"));
        }
        if !(w.txn_rate.is_finite() && w.txn_rate > 0.0) {
            return Err(field_err("workload.txn_rate", "must be a positive number"));
        }
        if let Some(b) = &w.background {
            if b.tables.is_empty() {
                return Err(field_err(
                    "workload.background.tables",
                    "at least one table",
                ));
            }
            if b.interval.millis() == Millis::ZERO {
                return Err(field_err(
                    "workload.background.interval",
                    "must be positive",
                ));
            }
            if let Some(t) = b.tables.iter().find(|t| w.tables.contains(t)) {
                return Err(field_err(
                    "workload.background.tables",
                    format!("`{t}` is a client table too"),
                ));
            }
        }
        if w.statements_min == 0 || w.statements_min > w.statements_max {
            return Err(field_err(
                "workload.statements_min",
                "must be ≥ 1 and ≤ statements_max",
            ));
        }
        let cn_pods = self.cn_pod_names();
        for (i, lt) in self.lock_tables.iter().enumerate() {
            if !cn_pods.contains(&lt.owner) {
                return Err(field_err(
                    format!("lock_tables[{i}].owner"),
                    format!("`{}` is not a CN pod", lt.owner),
                ));
            }
            if !w.tables.contains(&lt.table) {
                return Err(field_err(
                    format!("lock_tables[{i}].table"),
                    format!("`{}` is not one of workload.tables", lt.table),
                ));
            }
        }
        let nodes = self.node_names();
        for (i, e) in self.events.iter().enumerate() {
            if e.at > self.duration {
                return Err(field_err(
                    format!("events[{i}].at"),
                    format!(
                        "{} is after the scenario's duration {}",
                        e.at, self.duration
                    ),
                ));
            }
            let kind = e.kind(i)?;
            let pod_field = |pod: &str, key: &str| -> Result<(), ScenarioError> {
                if pods.iter().any(|p| p == pod) {
                    Ok(())
                } else {
                    Err(field_err(
                        format!("events[{i}].{key}.pod"),
                        format!("no pod named `{pod}` in the topology"),
                    ))
                }
            };
            match &kind {
                EventKind::Evict { pod, .. } => pod_field(pod, "evict")?,
                EventKind::ClaimRelease { pod } | EventKind::ClaimBind { pod } => {
                    let key = if matches!(kind, EventKind::ClaimBind { .. }) {
                        "claim_bind"
                    } else {
                        "claim_release"
                    };
                    pod_field(pod, key)?;
                    if !self.pool_pod_names().contains(pod) {
                        return Err(field_err(
                            format!("events[{i}].{key}.pod"),
                            format!("`{pod}` is not in a CN pool"),
                        ));
                    }
                }
                EventKind::CnCrash { pod } => {
                    if !cn_pods.contains(pod) {
                        return Err(field_err(
                            format!("events[{i}].cn_crash.pod"),
                            format!("`{pod}` is not a CN pod"),
                        ));
                    }
                }
                EventKind::DeletePod { pod } => pod_field(pod, "delete_pod")?,
                EventKind::DrainNode { node } | EventKind::NodeFailure { node } => {
                    if !nodes.contains(node) {
                        let key = if matches!(kind, EventKind::DrainNode { .. }) {
                            "drain_node"
                        } else {
                            "node_failure"
                        };
                        return Err(field_err(
                            format!("events[{i}].{key}.node"),
                            format!(
                                "no node named `{node}` (nodes are node-1 … node-{})",
                                nodes.len()
                            ),
                        ));
                    }
                }
                EventKind::ScaleIn { group, replicas } => {
                    let Some(g) = t.cn_groups.iter().find(|g| &g.name == group) else {
                        return Err(field_err(
                            format!("events[{i}].scale_in.group"),
                            format!("no CN group named `{group}`"),
                        ));
                    };
                    if *replicas >= g.replicas {
                        return Err(field_err(
                            format!("events[{i}].scale_in.replicas"),
                            format!("{replicas} is not fewer than the group's {}", g.replicas),
                        ));
                    }
                }
                EventKind::ScaleOut { group, replicas } => {
                    let Some(g) = t.cn_groups.iter().find(|g| &g.name == group) else {
                        return Err(field_err(
                            format!("events[{i}].scale_out.group"),
                            format!("no CN group named `{group}`"),
                        ));
                    };
                    if *replicas > g.replicas {
                        return Err(field_err(
                            format!("events[{i}].scale_out.replicas"),
                            format!(
                                "{replicas} is more than the group's {} (a scale-out reverts a scale-in; it adds no pods)",
                                g.replicas
                            ),
                        ));
                    }
                }
                EventKind::Upgrade { version, .. } => {
                    if version.trim().is_empty() {
                        return Err(field_err(
                            format!("events[{i}].upgrade.version"),
                            "must not be empty",
                        ));
                    }
                }
                EventKind::Fault { .. }
                | EventKind::HakeeperOutage { .. }
                | EventKind::OperatorRestart { .. } => {}
            }
        }
        Ok(())
    }

    fn pool_pod_names(&self) -> Vec<String> {
        self.topology
            .cn_groups
            .iter()
            .filter(|g| g.pool)
            .flat_map(|g| g.pod_name_list())
            .collect()
    }
}

impl CnGroupSpec {
    pub fn pod_name_list(&self) -> Vec<String> {
        if self.pod_names.is_empty() {
            (0..self.replicas)
                .map(|i| format!("{}-{i}", self.name))
                .collect()
        } else {
            self.pod_names.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "
name: t
duration: 1m
topology:
  version: v1
  cn_groups: [{name: cn, replicas: 2}]
";

    #[test]
    fn minimal_scenario_gets_defaults() {
        let s = Scenario::from_yaml(MINIMAL).unwrap();
        assert_eq!(s.seed, 1);
        assert_eq!(s.policy, "legacy");
        assert_eq!(s.topology.log_replicas, 3);
        assert_eq!(
            s.pod_names(),
            ["log-0", "log-1", "log-2", "tn-0", "cn-0", "cn-1", "proxy-0"]
        );
        assert_eq!(s.node_names().len(), 7);
    }

    #[test]
    fn unknown_field_is_named_with_its_path() {
        let bad = MINIMAL.replace("replicas: 2}", "replicas: 2, replica: 3}");
        let err = Scenario::from_yaml(&bad).unwrap_err().to_string();
        assert!(err.contains("topology.cn_groups[0]"), "{err}");
        assert!(err.contains("replica"), "{err}");
    }

    #[test]
    fn wrong_type_is_named_with_its_path() {
        let bad = MINIMAL.replace("duration: 1m", "duration: soon");
        let err = Scenario::from_yaml(&bad).unwrap_err().to_string();
        assert!(err.contains("`duration`"), "{err}");
    }

    #[test]
    fn bad_strategy_in_an_event_is_named() {
        let bad = format!(
            "{MINIMAL}events:\n  - at: 10s\n    upgrade: {{version: v2, strategy: '{{\"log\":[\"cn\"],\"cn\":[\"log\"],\"tn\":[],\"proxy\":[]}}'}}\n"
        );
        let err = Scenario::from_yaml(&bad).unwrap_err().to_string();
        assert!(err.contains("events[0].upgrade.strategy"), "{err}");
        assert!(err.contains("cycle"), "{err}");
    }

    #[test]
    fn event_needs_exactly_one_kind_and_known_targets() {
        let two = format!(
            "{MINIMAL}events:\n  - at: 10s\n    cn_crash: {{pod: cn-0}}\n    delete_pod: {{pod: cn-1}}\n"
        );
        let err = Scenario::from_yaml(&two).unwrap_err().to_string();
        assert!(
            err.contains("events[0]") && err.contains("exactly one"),
            "{err}"
        );
        let unknown = format!("{MINIMAL}events:\n  - at: 10s\n    cn_crash: {{pod: cn-9}}\n");
        let err = Scenario::from_yaml(&unknown).unwrap_err().to_string();
        assert!(
            err.contains("events[0].cn_crash.pod") && err.contains("cn-9"),
            "{err}"
        );
        let late = format!("{MINIMAL}events:\n  - at: 2m\n    cn_crash: {{pod: cn-0}}\n");
        let err = Scenario::from_yaml(&late).unwrap_err().to_string();
        assert!(err.contains("events[0].at"), "{err}");
    }

    #[test]
    fn garbage_never_panics() {
        for text in [
            "",
            "[]",
            "name: [",
            "{{{{",
            "name: x\nduration: -5s",
            "\u{0}",
        ] {
            assert!(Scenario::from_yaml(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn yaml_round_trips() {
        let s = Scenario::from_yaml(MINIMAL).unwrap();
        let again = Scenario::from_yaml(&s.to_yaml()).unwrap();
        assert_eq!(again.pod_names(), s.pod_names());
        assert_eq!(again.timings, s.timings);
    }
}
