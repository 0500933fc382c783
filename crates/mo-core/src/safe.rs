//! The `safe` policy: the rollout and the drain arbiter driven from one persisted progress
//! record. A restarted operator rebuilds this policy from the record and re-verifies every
//! step against fresh observations before acting again (all actions are idempotent).

use crate::action::{Action, Decision, PolicyNote};
use crate::component::Component;
use crate::drain::{Drain, DrainPurpose, DrainStage, DrainTiming};
use crate::gates;
use crate::observe::{EvictionRequest, Observation, PodPhase, RemovalReason, WorkState};
use crate::policy::{EvictionVerdict, Policy, PolicyInput};
use crate::rollout::{MaxUnavailable, OnStall, Rollout, RolloutStatus, RolloutTiming, StepReport};
use crate::time::{Millis, human};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Tunables of the safe policy (the `safe:` section of a scenario, later the CRD's spec).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafeConfig {
    /// A restarted pod's gate, and a finished phase's gate, must hold this long.
    #[serde(with = "human")]
    pub stability_window: Millis,
    /// No progress for this long halts the rollout (or rolls the phase back).
    #[serde(with = "human")]
    pub stall_timeout: Millis,
    pub on_stall: OnStall,
    /// TN WAL tolerance while LOG replicas restart.
    #[serde(with = "human")]
    pub tn_wal_tolerance: Millis,
    /// Pull the new image onto every node before restarting anything.
    pub pre_pull: bool,
    /// A webhook-started drain whose evictor stopped retrying this long is cancelled.
    #[serde(with = "human")]
    pub eviction_abandon: Millis,
    /// A drain waiting longer raises an alarm (it keeps waiting).
    #[serde(with = "human")]
    pub drain_alarm: Millis,
    /// The kernel's bind keepalive interval.
    #[serde(with = "human")]
    pub keepalive: Millis,
    /// An action not visibly applied after this is sent again.
    #[serde(with = "human")]
    pub resend_after: Millis,
    /// A restart handshake the allocator has not confirmed this long after accepting it may
    /// be confirmed by the CN's own lock service (nothing held or awaited in its lock tables).
    #[serde(with = "human")]
    pub handover_wedge_after: Millis,
    /// The proxies' CN-list refresh interval (kernel `cluster.refresh-interval`).
    #[serde(with = "human")]
    pub route_refresh: Millis,
    /// How long the lock allocator may keep the entry of a CN's previous process (same UUID):
    /// a restart handshake is sent only to a container running at least this long.
    #[serde(with = "human")]
    pub previous_instance_expiry: Millis,
    /// How long a proxy out of its Service may wait for its clients to leave before the
    /// rollout halts (it is never stopped with connections on it).
    #[serde(with = "human")]
    pub proxy_drain_grace: Millis,
    /// How long the Service's endpoints take to follow a proxy's label (its connections are
    /// counted only after that).
    #[serde(with = "human")]
    pub endpoints_settle: Millis,
    /// CN pods an upgrade restarts at once (a count or a percentage of the CNs).
    pub cn_max_unavailable: MaxUnavailable,
    /// Proxy pods an upgrade restarts at once.
    pub proxy_max_unavailable: MaxUnavailable,
}

impl Default for SafeConfig {
    fn default() -> Self {
        SafeConfig {
            stability_window: Millis::from_secs(20),
            stall_timeout: Millis::from_mins(10),
            on_stall: OnStall::Halt,
            tn_wal_tolerance: Millis::from_mins(15),
            pre_pull: true,
            eviction_abandon: Millis::from_mins(2),
            drain_alarm: Millis::from_mins(10),
            keepalive: Millis::from_secs(1),
            resend_after: Millis::from_secs(5),
            handover_wedge_after: Millis::from_secs(10),
            route_refresh: Millis::from_secs(5),
            // Two `keepBindTimeout` rounds (10 s each) and a validation RPC (up to 10 s).
            previous_instance_expiry: Millis::from_secs(30),
            proxy_drain_grace: Millis::from_mins(5),
            endpoints_settle: Millis::from_secs(5),
            cn_max_unavailable: MaxUnavailable::default(),
            proxy_max_unavailable: MaxUnavailable::default(),
        }
    }
}

impl SafeConfig {
    fn drain_timing(&self) -> DrainTiming {
        DrainTiming {
            keepalive: self.keepalive,
            resend_after: self.resend_after,
            eviction_abandon: self.eviction_abandon,
            alarm_after: self.drain_alarm,
            handover_wedge_after: self.handover_wedge_after,
            route_refresh: self.route_refresh,
            previous_instance_expiry: self.previous_instance_expiry,
        }
    }

    pub fn rollout_timing(&self) -> RolloutTiming {
        RolloutTiming {
            stability_window: self.stability_window,
            stall_timeout: self.stall_timeout,
            on_stall: self.on_stall,
            tn_wal_tolerance: self.tn_wal_tolerance,
            pre_pull: self.pre_pull,
            resend_after: self.resend_after,
            proxy_drain_grace: self.proxy_drain_grace,
            endpoints_settle: self.endpoints_settle,
            cn_max_unavailable: self.cn_max_unavailable,
            proxy_max_unavailable: self.proxy_max_unavailable,
        }
    }
}

/// Everything the policy must not forget across an operator restart.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressRecord {
    pub format: u32,
    pub rollout: Option<Rollout>,
    pub drains: Vec<Drain>,
    /// Proxies an evictor asked for: out of their Service while it keeps asking, so their
    /// clients leave before the eviction is allowed.
    #[serde(default)]
    pub proxy_evictions: Vec<ProxyEviction>,
    /// Set when a persisted record could not be read: the policy then acts on nothing it
    /// would have needed the record for, and says so.
    pub unreadable: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyEviction {
    pub pod: String,
    pub uid: String,
    pub last_request_at: Millis,
    /// When it was first seen out of its Service.
    #[serde(default)]
    pub out_since: Option<Millis>,
}

pub const RECORD_FORMAT: u32 = 1;
/// Finished drains kept in the record for reporting.
const FINISHED_DRAINS_KEPT: usize = 32;

pub struct SafePolicy {
    config: SafeConfig,
    record: ProgressRecord,
    /// The last serialized record: serialized again only when the record changed.
    persisted: std::cell::RefCell<Option<(ProgressRecord, String)>>,
    /// Last hold reported per subject, to report changes only (not persisted).
    reported: BTreeMap<String, String>,
    /// When a proxy's Service membership was last asked to change (not persisted: resent
    /// after a restart, the change is idempotent).
    serving_sent: BTreeMap<String, Millis>,
    /// When the deletion of each terminal pod instance (by UID) was last sent.
    terminal_sent: BTreeMap<String, Millis>,
    /// When each CN instance (by pod UID) was last asked into service.
    working_sent: BTreeMap<String, Millis>,
}

impl SafePolicy {
    pub fn new(config: SafeConfig) -> Self {
        SafePolicy {
            config,
            record: ProgressRecord {
                format: RECORD_FORMAT,
                ..ProgressRecord::default()
            },
            reported: BTreeMap::new(),
            serving_sent: BTreeMap::new(),
            terminal_sent: BTreeMap::new(),
            working_sent: BTreeMap::new(),
            persisted: std::cell::RefCell::new(None),
        }
    }

    /// Resumes from a persisted record. An unreadable record is never treated as empty
    /// progress: the rollout stays halted and says why (drains restart from observations).
    pub fn resume(config: SafeConfig, record: &str) -> Self {
        let mut policy = SafePolicy::new(config);
        match serde_json::from_str::<ProgressRecord>(record) {
            Ok(r) if r.format == RECORD_FORMAT => policy.record = r,
            Ok(r) => {
                policy.record.unreadable = Some(format!(
                    "progress record format {} is not {RECORD_FORMAT}",
                    r.format
                ))
            }
            Err(e) => policy.record.unreadable = Some(format!("progress record unreadable: {e}")),
        }
        policy
    }

    pub fn record(&self) -> &ProgressRecord {
        &self.record
    }

    fn active_drain(&mut self, pod: &str, uid: &str) -> Option<&mut Drain> {
        self.record
            .drains
            .iter_mut()
            .find(|d| d.is_active() && d.pod == pod && d.pod_uid == uid)
    }

    fn sync_removals(&mut self, obs: &Observation) {
        for removal in &obs.desired.removals {
            let Some(pod) = obs
                .pod(&removal.pod)
                .filter(|p| p.uid == removal.uid && !p.terminating)
            else {
                continue;
            };
            let Some(uuid) = pod.cn_uuid.clone() else {
                continue;
            };
            if let Some(d) = self.active_drain(&removal.pod, &removal.uid) {
                // A removal takes over a drain started for an eviction of the same instance.
                if matches!(d.purpose, DrainPurpose::Evict { .. }) && !d.confirmed() {
                    d.purpose = DrainPurpose::Remove {
                        why: why(&removal.reason),
                    };
                }
                continue;
            }
            self.record.drains.push(Drain::new(
                &removal.pod,
                &removal.uid,
                &uuid,
                DrainPurpose::Remove {
                    why: why(&removal.reason),
                },
                obs.now,
            ));
        }
        // A withdrawn removal (claim bound again, scale-in reverted) cancels its drain.
        for d in self.record.drains.iter_mut().filter(|d| d.is_active()) {
            if matches!(d.purpose, DrainPurpose::Remove { .. })
                && d.stage < DrainStage::Released
                && !obs
                    .desired
                    .removals
                    .iter()
                    .any(|r| r.pod == d.pod && r.uid == d.pod_uid)
            {
                d.cancel_requested = true;
            }
        }
    }

    /// A CN whose node failed leaves too (involuntarily): it gets a record, like every exit.
    fn sync_node_failures(&mut self, obs: &Observation) {
        for pod in obs.pods_of(Component::Cn) {
            if pod.ready || !obs.not_ready_nodes.contains(&pod.node) {
                continue;
            }
            if self.active_drain(&pod.name, &pod.uid).is_some() {
                continue;
            }
            let Some(uuid) = pod.cn_uuid.clone() else {
                continue;
            };
            self.record.drains.push(Drain::new(
                &pod.name,
                &pod.uid,
                &uuid,
                DrainPurpose::NodeFailure {
                    node: pod.node.clone(),
                },
                obs.now,
            ));
        }
    }

    /// Only a proxy the rollout drains, or one an evictor keeps asking for (while another
    /// routes), is out of its Service; every other goes back in (a halted rollout, an evictor
    /// that gave up, an operator restart between the two).
    fn keep_proxies_in_service(&mut self, obs: &Observation, actions: &mut Vec<Action>) {
        let abandon = self.config.eviction_abandon;
        self.record.proxy_evictions.retain(|e| {
            obs.now - e.last_request_at < abandon && obs.pod(&e.pod).is_some_and(|p| p.uid == e.uid)
        });
        for e in &mut self.record.proxy_evictions {
            let out = obs.pod(&e.pod).is_some_and(|p| !p.serving);
            e.out_since = match (out, e.out_since) {
                (true, None) => Some(obs.now),
                (true, since) => since,
                (false, _) => None,
            };
        }
        let drained = self
            .record
            .rollout
            .as_ref()
            .map(|r| r.proxies_out_of_service())
            .unwrap_or_default();
        // Proxies decided out this tick: two evicted in the same instant never both go out.
        let mut out: Vec<&str> = drained.iter().map(|(pod, _)| *pod).collect();
        for pod in obs.pods_of(Component::Proxy).filter(|p| !p.terminating) {
            if drained.contains(&(pod.name.as_str(), pod.uid.as_str())) {
                continue;
            }
            let evicted = self
                .record
                .proxy_evictions
                .iter()
                .any(|e| e.pod == pod.name && e.uid == pod.uid);
            let mut without_me = out.clone();
            without_me.push(&pod.name);
            let serving =
                !(evicted && gates::other_proxy_routes_excluding(obs, &without_me).is_ok());
            if !serving {
                out.push(&pod.name);
            }
            if pod.serving == serving {
                self.serving_sent.remove(&pod.name);
                continue;
            }
            let due = self
                .serving_sent
                .get(&pod.name)
                .is_none_or(|t| obs.now - *t >= self.config.resend_after);
            if due {
                self.serving_sent.insert(pod.name.clone(), obs.now);
                actions.push(Action::SetProxyServing {
                    pod: pod.name.clone(),
                    uid: pod.uid.clone(),
                    serving,
                });
            }
        }
    }

    /// Every CN drain made for a restart follows the rollout as it stands now (running, halted,
    /// rolled back, retargeted or gone), whatever changed its mind: one the rollout no longer
    /// asks for is taken back while that can be (the CN returns to Working); one whose hand-over
    /// was requested cannot serve again, so it is restarted only onto the version the cluster
    /// goes to now (the CN phase's if the phase still holds it, else the version it runs), and
    /// not at all while the rollout is halted.
    fn follow_the_rollout(&mut self, obs: &Observation) {
        let rollout = self.record.rollout.as_ref();
        for d in self
            .record
            .drains
            .iter_mut()
            .filter(|d| d.is_active() && d.stage < DrainStage::Released)
        {
            let DrainPurpose::Restart { version } = &d.purpose else {
                continue;
            };
            if d.rollout.is_none() {
                // Not a rollout's (a withdrawn removal restarting its CN in place).
                continue;
            }
            let version = version.clone();
            if rollout.is_some_and(|r| r.wants_cn_restart(&d.pod, &d.pod_uid, &version)) {
                d.release_held = None;
                continue;
            }
            if !(d.hand_over_requested() || d.process_marked) {
                d.cancel_requested = true;
                continue;
            }
            let halted = rollout.is_some_and(|r| {
                matches!(
                    r.status,
                    RolloutStatus::Halted { .. } | RolloutStatus::RolledBack { .. }
                )
            });
            if halted {
                d.release_held = Some(format!(
                    "the rollout is halted; {} (its hand-over requested, it refuses new writes) \
                     is restarted when the rollout resumes or rolls back, or when someone deletes it",
                    d.pod
                ));
                continue;
            }
            d.release_held = None;
            let in_phase = rollout.filter(|r| {
                r.status == RolloutStatus::Running
                    && r.component() == Some(Component::Cn)
                    && r.steps().any(|s| s.pod() == Some(d.pod.as_str()))
            });
            let to = match in_phase {
                Some(r) => r.phase_version(),
                None => obs
                    .pod(&d.pod)
                    .map_or(version.clone(), |p| p.version.clone()),
            };
            if to != version {
                d.purpose = DrainPurpose::Restart { version: to };
            }
        }
    }

    /// CNs register Draining (the operator renders `[cn] init-work-state = "draining"`): a CN
    /// whose HAKeeper record was lost and re-created (it expired while the CN could not reach
    /// HAKeeper) is then never routed to by the proxies on its own, which matters for a CN told
    /// to restart (it refuses every new write for good). The operator puts into service, as
    /// Working, a CN that is Ready, heard from by HAKeeper from its current container, with no
    /// drain of its pod under way and not a process a hand-over was requested of.
    fn put_cns_into_service(&mut self, obs: &Observation, actions: &mut Vec<Action>) {
        let Ok(details) = obs.hakeeper.as_ref() else {
            return;
        };
        self.working_sent
            .retain(|uid, _| obs.pods.iter().any(|p| p.uid == *uid));
        for pod in obs.pods_of(Component::Cn) {
            if pod.phase != PodPhase::Running || !pod.ready || pod.terminating {
                continue;
            }
            let Some(uuid) = pod.cn_uuid.as_deref() else {
                continue;
            };
            let Some(record) = gates::cn_record(details, uuid) else {
                continue;
            };
            if record.work_state == WorkState::Working
                || record.heartbeat_age > obs.heartbeat_intervals.cn_fresh()
                || gates::heard_since_start(obs, pod, record.heartbeat_age).is_err()
            {
                continue;
            }
            let instance = crate::drain::Instance::of(pod);
            let held = self.record.drains.iter().any(|d| {
                d.pod == pod.name
                    && (d.is_active()
                        || (d.pod_uid == pod.uid
                            && d.end != Some(crate::drain::DrainEnd::Cancelled)
                            && (d.hand_over_requested() || d.process_marked)
                            && d.instance.is_none_or(|i| i == instance)))
            });
            if held {
                continue;
            }
            let due = self
                .working_sent
                .get(&pod.uid)
                .is_none_or(|t| obs.now - *t >= self.config.resend_after);
            if due {
                self.working_sent.insert(pod.uid.clone(), obs.now);
                actions.push(Action::SetCnWorkState {
                    uuid: uuid.to_string(),
                    state: WorkState::Working,
                });
            }
        }
    }

    /// A CN restart onto a version whose catalog the CNs have moved past would never start
    /// (the kernel stops it). A drain headed there (a withdrawn removal restarting its CN in
    /// place, a prepared CN whose rollout changed its mind) holds its release, saying why,
    /// until a lane of the rollout's CN phase takes it over and sets its version to the
    /// phase's (`follow_the_rollout`): a CN on the target before then would run ahead of the
    /// TN or beyond the phase's width, and one onto an intermediate version the cluster leaves
    /// would restart twice. Judged before the drains step.
    fn keep_cn_restarts_on_the_catalog(&mut self) {
        let Some(rollout) = self.record.rollout.as_ref() else {
            return;
        };
        for d in self
            .record
            .drains
            .iter_mut()
            .filter(|d| d.is_active() && d.stage < DrainStage::Released)
        {
            let DrainPurpose::Restart { version } = &mut d.purpose else {
                continue;
            };
            if let Some(refusal) = rollout.cn_refusal(version) {
                d.release_held = Some(format!(
                    "{} cannot restart on {version} ({refusal}); it waits for the rollout's CN \
                     phase to take it to {}",
                    d.pod, rollout.target
                ));
            }
        }
    }

    /// A pod whose containers stopped for good (`Failed`: evicted by its kubelet, its node shut
    /// down) holds nothing: its process is gone, so there is nothing to drain or wait for. Its
    /// object is deleted, bound to that instance, so that it is replaced (a StatefulSet
    /// recreates LOG, TN and proxy pods; the operator creates CN pods).
    fn replace_terminal_pods(&mut self, obs: &Observation, actions: &mut Vec<Action>) {
        self.terminal_sent
            .retain(|uid, _| obs.pods.iter().any(|p| p.uid == *uid && !p.terminating));
        for pod in obs
            .pods
            .iter()
            .filter(|p| p.phase == PodPhase::Failed && !p.terminating)
        {
            let due = self
                .terminal_sent
                .get(&pod.uid)
                .is_none_or(|t| obs.now - *t >= self.config.resend_after);
            if due {
                self.terminal_sent.insert(pod.uid.clone(), obs.now);
                actions.push(Action::DeletePod {
                    pod: pod.name.clone(),
                    uid: pod.uid.clone(),
                    reason: format!(
                        "{} is terminal (Failed): its containers stopped for good; the pod is replaced",
                        pod.name
                    ),
                });
            }
        }
    }

    /// The rollout the spec asks for, and what it makes of its stalls, decided before anything
    /// else moves in a tick: a drain of a CN the rollout prepared follows the rollout as it now
    /// stands (a new target, a halt, a rollback), never as it stood.
    fn change_of_mind(&mut self, obs: &Observation) -> StepReport {
        if self.record.unreadable.is_some() {
            return StepReport::default();
        }
        let Some(spec) = &obs.desired.upgrade else {
            return StepReport::default();
        };
        let fresh = self
            .record
            .rollout
            .as_ref()
            .is_none_or(|r| r.target != spec.target_version);
        if fresh {
            let replaced = self.record.rollout.take();
            let mut rollout = Rollout::start(spec, obs, replaced.as_ref());
            // A version no CN may go to halts its rollout before anything moves; the next
            // version the spec asks for starts over from there.
            if let Some(refusal) = rollout.cn_refusal(&rollout.target) {
                let reason = format!("version {} refused: {refusal}", rollout.target);
                rollout.status = RolloutStatus::Halted {
                    reason: reason.clone(),
                };
                self.record.rollout = Some(rollout);
                return StepReport {
                    halted: Some(reason),
                    ..StepReport::default()
                };
            }
            self.record.rollout = Some(rollout);
        }
        let timing = self.config.rollout_timing();
        let rollout = self.record.rollout.as_mut().expect("set above");
        rollout.change_of_mind(obs, &timing, &mut self.record.drains)
    }

    fn upgrade(
        &mut self,
        obs: &Observation,
        early: StepReport,
        actions: &mut Vec<Action>,
        notes: &mut Vec<PolicyNote>,
    ) {
        if let Some(reason) = &self.record.unreadable {
            let reason = reason.clone();
            self.note_hold(notes, "rollout", format!("halted: {reason}"));
            return;
        }
        if obs.desired.upgrade.is_none() {
            return;
        }
        let timing = self.config.rollout_timing();
        let Some(rollout) = self.record.rollout.as_mut() else {
            return;
        };
        let mut report = rollout.step(obs, &timing, &mut self.record.drains, actions);
        // What the rollout decided earlier in this tick (see `change_of_mind`).
        report.alarmed = report.alarmed.or(early.alarmed);
        report.halted = report.halted.or(early.halted);
        report.finished |= early.finished;
        if let Some(component) = report.phase_started {
            notes.push(PolicyNote::PhaseStarted { component });
        }
        if let Some(component) = report.phase_finished {
            notes.push(PolicyNote::PhaseFinished { component });
        }
        for (pod, reason) in report.stranded.drain(..) {
            notes.push(PolicyNote::MovedPastTheCatalog { pod, reason });
        }
        if report.finished {
            notes.push(PolicyNote::UpgradeFinished);
        }
        let status = rollout.status.clone();
        let hold = rollout.hold.clone();
        let alarmed = rollout.alarmed;
        match status {
            RolloutStatus::Halted { reason } => {
                self.note_hold(notes, "rollout", format!("halted: {reason}"))
            }
            RolloutStatus::RolledBack { reason } => self.note_hold(
                notes,
                "rollout",
                format!("rolled back and halted: {reason}"),
            ),
            RolloutStatus::Complete => {
                self.reported.remove("rollout");
            }
            RolloutStatus::Running => match (report.alarmed, hold) {
                (Some(stall), _) => self.note_hold(
                    notes,
                    "rollout",
                    format!("ALARM (creation is slow, it keeps waiting): {stall}"),
                ),
                (None, Some(hold)) if alarmed => self.note_hold(
                    notes,
                    "rollout",
                    format!("ALARM (creation is slow, it keeps waiting): {hold}"),
                ),
                (None, Some(hold)) => self.note_hold(notes, "rollout", hold),
                (None, None) => {}
            },
        }
    }

    fn note_hold(&mut self, notes: &mut Vec<PolicyNote>, subject: &str, reason: String) {
        if self.reported.get(subject) != Some(&reason) {
            self.reported.insert(subject.to_string(), reason.clone());
            notes.push(PolicyNote::Holding {
                subject: subject.to_string(),
                reason,
            });
        }
    }

    /// What the policy waits on now, per subject (for conditions and liveness checks).
    pub fn holds(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .record
            .drains
            .iter()
            .filter(|d| d.is_active())
            .filter_map(|d| d.hold.clone().map(|h| (d.pod.clone(), h)))
            .collect();
        if let Some(r) = &self.record.rollout {
            match &r.status {
                RolloutStatus::Running => {
                    if let Some(h) = &r.hold {
                        out.push(("rollout".into(), h.clone()));
                    }
                }
                RolloutStatus::Halted { reason } | RolloutStatus::RolledBack { reason } => {
                    out.push(("rollout".into(), reason.clone()))
                }
                RolloutStatus::Complete => {}
            }
        }
        out
    }
}

fn purpose_name(purpose: &DrainPurpose) -> &'static str {
    match purpose {
        DrainPurpose::Remove { .. } => "removal",
        DrainPurpose::Restart { .. } => "restart",
        DrainPurpose::Evict { .. } => "eviction",
        DrainPurpose::NodeFailure { .. } => "node failure",
    }
}

fn why(reason: &RemovalReason) -> String {
    match reason {
        RemovalReason::ScaleIn => "scale-in".into(),
        RemovalReason::PoolReclaim { requested_by } => format!("pool reclaim by {requested_by}"),
    }
}

impl Policy for SafePolicy {
    fn name(&self) -> &str {
        "safe"
    }

    fn decide(&mut self, input: PolicyInput<'_>) -> Decision {
        let obs = input.observation;
        let mut actions = Vec::new();
        let mut notes = Vec::new();
        for d in self.record.drains.iter_mut().filter(|d| d.is_active()) {
            d.absorb(input.results, obs.now);
        }
        if let Some(rollout) = self.record.rollout.as_mut() {
            rollout.absorb(input.results);
        }
        self.sync_removals(obs);
        self.sync_node_failures(obs);
        let early = self.change_of_mind(obs);
        self.follow_the_rollout(obs);
        self.keep_cn_restarts_on_the_catalog();
        // One drain per instance: a released drain whose pod came back under a newer drain
        // leaves the new instance to that drain.
        let owned: Vec<(String, String)> = self
            .record
            .drains
            .iter()
            .filter(|d| d.is_active() && d.stage < DrainStage::Released)
            .map(|d| (d.pod.clone(), d.pod_uid.clone()))
            .collect();
        for d in self.record.drains.iter_mut().filter(|d| d.is_active()) {
            let newer = owned
                .iter()
                .any(|(pod, uid)| *pod == d.pod && *uid != d.pod_uid);
            // Its pod replaced, and the new pod's own drain has it: two drains never act on
            // one instance (one returning it to Working while the other drains it).
            let replaced = obs.pod(&d.pod).is_some_and(|p| {
                p.uid != d.pod_uid
                    && owned
                        .iter()
                        .any(|(pod, uid)| *pod == d.pod && *uid == p.uid)
            });
            if newer {
                d.hand_off(replaced, obs.now);
            }
        }
        let timing = self.config.drain_timing();
        let rollout_timing = self.config.rollout_timing();
        let mut released = Vec::new();
        // CNs already draining (marked, or about to be this tick) do not count as a place for
        // sessions to go: two drains never strand the workload together.
        let mut draining: Vec<String> = self
            .record
            .drains
            .iter()
            .filter(|d| {
                d.is_active()
                    && d.stage > DrainStage::MarkDraining
                    && d.stage < DrainStage::Released
            })
            .map(|d| d.pod.clone())
            .collect();
        // One hand-over at a time: two owners handing over at once can each wait for a
        // transaction that waits on the other's tables (a marked owner makes new lockers
        // retry, with no deadline, until its own transactions end).
        let mut handing_over: Vec<String> = self
            .record
            .drains
            .iter()
            .filter(|d| d.handing_over())
            .map(|d| d.pod.clone())
            .collect();
        for d in self.record.drains.iter_mut().filter(|d| d.is_active()) {
            let before = d.stage;
            let serves = obs.pod(&d.pod).is_some_and(gates::serves_workload);
            let may_hand_over = match handing_over.iter().find(|p| **p != d.pod) {
                Some(other) => Err(format!(
                    "{other} is handing its lock tables over first (two hand-overs at once can wait on each other's tables for good)"
                )),
                None => Ok(()),
            }
            .and_then(|()| match (&d.purpose, self.record.rollout.as_ref()) {
                // A CN drained for the rollout may be drained while restarted CNs hold for
                // their window; its hand-over (no way back) waits for the rollout's room, and
                // for a rollout that still restarts CNs.
                (DrainPurpose::Restart { .. }, Some(rollout)) if d.rollout.is_some() => {
                    rollout.hand_over_gate(obs, &rollout_timing, &d.pod)
                }
                _ => Ok(()),
            });
            let may_start = if serves && before == DrainStage::MarkDraining {
                gates::other_working_cn_excluding(obs, &d.pod, &draining)
            } else {
                Ok(())
            };
            let allowed = may_start.is_ok();
            d.step_with(obs, &timing, may_start, may_hand_over, &mut actions);
            if d.handing_over() && !handing_over.contains(&d.pod) {
                handing_over.push(d.pod.clone());
            }
            // A drain allowed to start counts from this tick on, marked or not yet: two drains
            // that start in the same instant must not each count the other as Working.
            if before == DrainStage::MarkDraining && serves && (d.stage != before || allowed) {
                draining.push(d.pod.clone());
            }
            if d.stage == DrainStage::Released && before != DrainStage::Released {
                released.push(d.pod.clone());
            }
        }
        for pod in released {
            notes.push(PolicyNote::Released {
                subject: pod.clone(),
                reason: "drain confirmed for this exact instance".into(),
            });
        }
        self.upgrade(obs, early, &mut actions, &mut notes);
        self.keep_proxies_in_service(obs, &mut actions);
        self.put_cns_into_service(obs, &mut actions);
        self.replace_terminal_pods(obs, &mut actions);
        if let Some(rollout) = self.record.rollout.as_mut() {
            rollout.note_cn_restarts(obs, &actions);
        }
        let holds: Vec<(String, String, bool)> = self
            .record
            .drains
            .iter()
            .filter(|d| d.is_active())
            .filter_map(|d| {
                let subject = format!("{} ({})", d.pod, purpose_name(&d.purpose));
                d.hold.clone().map(|h| (subject, h, d.alarmed))
            })
            .collect();
        for (pod, hold, alarmed) in holds {
            let reason = if alarmed {
                format!("ALARM (drain is long): {hold}")
            } else {
                hold
            };
            self.note_hold(&mut notes, &pod, reason);
        }
        // Keep the record bounded: only the newest finished drains stay.
        let finished = self.record.drains.iter().filter(|d| !d.is_active()).count();
        if finished > FINISHED_DRAINS_KEPT {
            let mut drop = finished - FINISHED_DRAINS_KEPT;
            self.record.drains.retain(|d| {
                if !d.is_active() && drop > 0 {
                    drop -= 1;
                    false
                } else {
                    true
                }
            });
        }
        Decision { actions, notes }
    }

    fn review_eviction(&mut self, obs: &Observation, request: &EvictionRequest) -> EvictionVerdict {
        let Some(pod) = obs.pod(&request.pod).filter(|p| p.uid == request.uid) else {
            return EvictionVerdict::Deny {
                reason: format!(
                    "cannot verify pod {} ({}): retry later",
                    request.pod, request.uid
                ),
            };
        };
        if pod.phase == PodPhase::Failed {
            // Its containers stopped for good: nothing runs there to protect, and whoever
            // removes it (the workload controller, the pod GC) lets it be replaced.
            return EvictionVerdict::Allow;
        }
        match pod.component {
            Component::Cn => {
                let now = obs.now;
                let (name, uid) = (pod.name.clone(), pod.uid.clone());
                if let Some(d) = self.active_drain(&name, &uid) {
                    d.last_eviction_at = Some(now);
                    // Confirmed (or already released) earlier: it must still hold on this very
                    // observation — same instance, fresh, idle, handed over — or back to work.
                    if d.confirmed()
                        && let Err(why) = d.still_confirmed(obs)
                    {
                        d.stage = DrainStage::MarkDraining;
                        return EvictionVerdict::Deny {
                            reason: format!("{name}: its drain must be confirmed again: {why}"),
                        };
                    }
                    if d.confirmed() {
                        // The evictor deletes it; the arbiter follows the pod to its end.
                        d.stage = DrainStage::Released;
                        d.release_sent_at = Some(now);
                        return EvictionVerdict::Allow;
                    }
                    let hold = d.hold.clone().unwrap_or_else(|| "starting".into());
                    return EvictionVerdict::Deny {
                        reason: format!("{name} is draining before it may leave: {hold}"),
                    };
                }
                let Some(uuid) = pod.cn_uuid.clone() else {
                    return EvictionVerdict::Deny {
                        reason: format!("{name}: no CN UUID"),
                    };
                };
                self.record.drains.push(Drain::new(
                    &name,
                    &uid,
                    &uuid,
                    DrainPurpose::Evict {
                        source: request.source.clone(),
                    },
                    now,
                ));
                EvictionVerdict::Deny {
                    reason: format!(
                        "{name} may own lock tables other CNs use: draining it first (sessions move, \
                         lock tables hand over, this instance confirms); retry"
                    ),
                }
            }
            Component::Log => {
                if self
                    .record
                    .rollout
                    .as_ref()
                    .is_some_and(|r| r.log_restart_in_flight())
                {
                    return EvictionVerdict::Deny {
                        reason: "a LOG replica is being restarted by the rollout: retry".into(),
                    };
                }
                match gates::log_restart_margin(obs, &pod.name) {
                    Ok(()) => EvictionVerdict::Allow,
                    Err(e) => EvictionVerdict::Deny {
                        reason: format!("evicting {} would risk LOG quorum: {e}", pod.name),
                    },
                }
            }
            Component::Tn => EvictionVerdict::Deny {
                reason: format!(
                    "{} is the only TN (no standby): evicting it stops every commit; the operator \
                     restarts it only in a rollout",
                    pod.name
                ),
            },
            Component::Proxy => {
                // A stopping proxy closes every connection at once, so it leaves only out of
                // its Service, with no client left on it, while commits flow (a COMMIT stuck
                // behind a LOG outage would be cut) and another proxy routes.
                let name = pod.name.clone();
                let uid = pod.uid.clone();
                let commits_flow = obs
                    .hakeeper
                    .as_ref()
                    .map_err(|e| format!("cannot read HAKeeper: {e}"))
                    .and_then(gates::wal_writable);
                if let Err(e) =
                    commits_flow.and_then(|()| gates::other_proxy_routes(obs, Some(&name)))
                {
                    return EvictionVerdict::Deny {
                        reason: format!("evicting {name} now could cut connections: {e}"),
                    };
                }
                match self
                    .record
                    .proxy_evictions
                    .iter_mut()
                    .find(|e| e.pod == name && e.uid == uid)
                {
                    Some(e) => e.last_request_at = obs.now,
                    None => self.record.proxy_evictions.push(ProxyEviction {
                        pod: name.clone(),
                        uid: uid.clone(),
                        last_request_at: obs.now,
                        out_since: None,
                    }),
                }
                let settled = self
                    .record
                    .proxy_evictions
                    .iter()
                    .find(|e| e.pod == name && e.uid == uid)
                    .and_then(|e| e.out_since)
                    .is_some_and(|t| obs.now - t >= self.config.endpoints_settle);
                if pod.serving || !settled {
                    return EvictionVerdict::Deny {
                        reason: format!(
                            "{name} is being taken out of its Service so its clients leave first; retry"
                        ),
                    };
                }
                match obs.proxy_connections.get(&name) {
                    Some(Ok(0)) => EvictionVerdict::Allow,
                    Some(Ok(n)) => EvictionVerdict::Deny {
                        reason: format!(
                            "{name} still carries {n} client connections (its stop would close them at once); retry"
                        ),
                    },
                    Some(Err(e)) => EvictionVerdict::Deny {
                        reason: format!("cannot count {name}'s client connections: {e}"),
                    },
                    None => EvictionVerdict::Deny {
                        reason: format!("no count of {name}'s client connections"),
                    },
                }
            }
        }
    }

    fn progress_record(&self) -> Option<String> {
        let mut cache = self.persisted.borrow_mut();
        match cache.as_ref() {
            Some((record, text)) if *record == self.record => Some(text.clone()),
            _ => {
                let text = serde_json::to_string(&self.record).expect("the record serializes");
                *cache = Some((self.record.clone(), text.clone()));
                Some(text)
            }
        }
    }

    fn waiting_on(&self) -> Vec<(String, String)> {
        self.holds()
    }
}
