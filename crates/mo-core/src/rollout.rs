//! The upgrade rollout: phases from the dependency strategy; LOG and TN one pod at a time, CN
//! and proxy phases up to their `maxUnavailable` pods at once (each in its own lane), each
//! restart preceded by its pre-restart gate and followed by its functional gate held for a
//! stability window; the finished phase's gate holds again before the next phase starts. A
//! stall halts (or rolls the phase back through the same gates); it never advances, restarts or
//! deletes.

use crate::action::{Action, ActionError, ActionResult};
use crate::component::Component;
use crate::drain::{Drain, DrainEnd, DrainPurpose, DrainStage};
use crate::gates::{self, Gate};
use crate::generation;
use crate::observe::{Observation, PodObservation, PodPhase, UpgradeSpec};
use crate::time::{Millis, format_duration};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum OnStall {
    Halt,
    Rollback,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    NextPod,
    MoveLeadership {
        pod: String,
        uid: String,
        sent_at: Option<Millis>,
    },
    DrainCn {
        pod: String,
        uid: String,
    },
    /// A proxy out of its Service, waiting for its clients to leave before it stops: the
    /// kernel's proxy closes its connections at once, cutting the transactions on them.
    DrainProxy {
        pod: String,
        uid: String,
        since: Millis,
        sent_at: Millis,
    },
    Restart {
        pod: String,
        old_uid: String,
        old_epoch: Option<u64>,
        sent_at: Millis,
    },
    Verify {
        pod: String,
        old_epoch: Option<u64>,
        restarts: u32,
        healthy_since: Option<Millis>,
    },
    Settle {
        healthy_since: Option<Millis>,
    },
}

impl Step {
    /// Restarted and verified healthy: holding for its stability window. Such a pod serves
    /// again; it no longer counts as out of service, only as not yet proven.
    fn in_window(&self) -> bool {
        matches!(
            self,
            Step::Verify {
                healthy_since: Some(_),
                ..
            }
        )
    }

    /// Restarted (or restarting) and not yet through its stability window.
    fn restarted(&self) -> bool {
        matches!(self, Step::Restart { .. } | Step::Verify { .. })
    }

    /// The pod this step works on (none between pods and while the phase settles).
    pub fn pod(&self) -> Option<&str> {
        match self {
            Step::NextPod | Step::Settle { .. } => None,
            Step::MoveLeadership { pod, .. }
            | Step::DrainCn { pod, .. }
            | Step::DrainProxy { pod, .. }
            | Step::Restart { pod, .. }
            | Step::Verify { pod, .. } => Some(pod),
        }
    }
}

/// A further pod of the phase restarted at the same time as the rollout's own `step`: the
/// same step and the per-pod clocks that go with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lane {
    pub step: Step,
    #[serde(default)]
    pub absent_since: Option<Millis>,
    #[serde(default)]
    pub healthy_seen: bool,
    /// What this lane waits on (not persisted: recomputed every step).
    #[serde(skip)]
    hold: Option<String>,
}

impl Lane {
    fn idle() -> Lane {
        Lane {
            step: Step::NextPod,
            absent_since: None,
            healthy_seen: false,
            hold: None,
        }
    }
}

/// What the other lanes of the phase hold, as one lane's step sees it.
struct OtherLanes {
    /// Their pods (none is picked twice).
    claimed: Vec<String>,
    /// Their pods out of service: draining, restarting or not yet healthy (a pod held for its
    /// stability window serves again).
    unavailable: Vec<String>,
    /// Their pods restarted and not yet through the stability window: a further restart
    /// waits while these fill the phase's width.
    restarted: Vec<String>,
}

/// How many pods of a CN or proxy phase may be restarting at once: a count, or a percentage of
/// the component's pods (rounded down). Never less than one, or the phase could not move; the
/// pre-restart gates still keep a Working CN and a routing proxy whatever the number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "CountOrPercent", into = "CountOrPercent")]
pub enum MaxUnavailable {
    Pods(u32),
    Percent(u32),
}

impl Default for MaxUnavailable {
    fn default() -> Self {
        MaxUnavailable::Pods(1)
    }
}

impl MaxUnavailable {
    pub fn of(self, pods: usize) -> usize {
        match self {
            MaxUnavailable::Pods(n) => n as usize,
            MaxUnavailable::Percent(p) => pods * p.min(100) as usize / 100,
        }
        .max(1)
    }

    /// `2` or `"2"` (pods), `"50%"` (of the component's pods).
    pub fn parse(text: &str) -> Result<MaxUnavailable, String> {
        let bad = || format!("`{text}` is neither a number of pods nor a percentage like 25%");
        match text.trim().strip_suffix('%') {
            Some(p) => p
                .parse()
                .ok()
                .filter(|p| *p <= 100)
                .map(MaxUnavailable::Percent)
                .ok_or_else(bad),
            None => text
                .trim()
                .parse()
                .map(MaxUnavailable::Pods)
                .map_err(|_| bad()),
        }
    }
}

impl std::fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MaxUnavailable::Pods(n) => write!(f, "{n}"),
            MaxUnavailable::Percent(p) => write!(f, "{p}%"),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum CountOrPercent {
    Count(u32),
    Text(String),
}

impl TryFrom<CountOrPercent> for MaxUnavailable {
    type Error = String;
    fn try_from(v: CountOrPercent) -> Result<Self, String> {
        match v {
            CountOrPercent::Count(n) => Ok(MaxUnavailable::Pods(n)),
            CountOrPercent::Text(t) => MaxUnavailable::parse(&t),
        }
    }
}

impl From<MaxUnavailable> for CountOrPercent {
    fn from(m: MaxUnavailable) -> Self {
        match m {
            MaxUnavailable::Pods(n) => CountOrPercent::Count(n),
            p => CountOrPercent::Text(p.to_string()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RolloutStatus {
    Running,
    Complete,
    /// Stopped by a stall; nothing moves until the spec changes.
    Halted {
        reason: String,
    },
    /// The stalled phase went back to its previous version; stopped.
    RolledBack {
        reason: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tolerance {
    Default,
    Widened,
    Restored,
}

/// Calls the rollout makes that only a kernel with the operator's extensions offers. A stock
/// kernel answers each with "not supported" (v1.2.4 `pkg/logservice/service.go`, `handle`, the
/// default case); the rollout then does without: a LOG leader restarts with the margin intact
/// and Raft elects another (a few seconds of election), the TN keeps its own WAL retry budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Extension {
    LeaderTransfer,
    WalTolerance,
}

impl Extension {
    fn of(action: &Action) -> Option<Extension> {
        match action {
            Action::TransferLogLeader { .. } => Some(Extension::LeaderTransfer),
            Action::SetTnWalTolerance { .. } => Some(Extension::WalTolerance),
            _ => None,
        }
    }
}

/// Rollout tunables (a subset of the safe policy's configuration).
#[derive(Clone, Copy, Debug)]
pub struct RolloutTiming {
    pub stability_window: Millis,
    pub stall_timeout: Millis,
    pub on_stall: OnStall,
    pub tn_wal_tolerance: Millis,
    pub pre_pull: bool,
    pub resend_after: Millis,
    /// A proxy out of its Service is counted only after this: until the Service's endpoints
    /// and every node's forwarding have followed the label, a new connection can still land.
    pub endpoints_settle: Millis,
    /// A proxy whose clients have not all left this long after it went out of its Service
    /// halts the rollout (it is never stopped with connections on it).
    pub proxy_drain_grace: Millis,
    pub cn_max_unavailable: MaxUnavailable,
    pub proxy_max_unavailable: MaxUnavailable,
}

impl RolloutTiming {
    /// Pods of `component` (of `pods`) the phase restarts at once.
    pub fn parallelism(&self, component: Component, pods: usize) -> usize {
        match component {
            // One LOG replica at a time keeps the quorum margin; one TN is all there is.
            Component::Log | Component::Tn => 1,
            Component::Cn => self.cn_max_unavailable.of(pods),
            Component::Proxy => self.proxy_max_unavailable.of(pods),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    pub target: String,
    /// Versions before the upgrade, per component (what a rollback restores).
    pub previous: BTreeMap<Component, String>,
    pub phases: Vec<Component>,
    pub phase: usize,
    pub phase_started: bool,
    pub step: Step,
    pub status: RolloutStatus,
    pub rolling_back: bool,
    pub last_progress: Millis,
    pub tolerance: Tolerance,
    pub pre_pull_sent: BTreeMap<String, Millis>,
    /// What the rollout waits on now.
    pub hold: Option<String>,
    /// Since when the pod being restarted or verified has been missing.
    #[serde(default)]
    pub absent_since: Option<Millis>,
    /// Extensions the kernel answered "not supported" to (only that answer; an error or a
    /// timeout proves nothing and the call is retried).
    #[serde(default)]
    pub unsupported: BTreeSet<Extension>,
    /// The current step's gate has passed once. Its first pass counts as progress (the
    /// stability window starts); later passes of a gate that flaps do not, so a flapping gate
    /// halts at the stall timeout instead of holding the rollout for good.
    #[serde(default)]
    pub healthy_seen: bool,
    /// Further pods of a CN or proxy phase restarting at the same time as `step`'s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more: Vec<Lane>,
    /// A creation went past the stall timeout: it keeps waiting on its gates and raises an
    /// alarm instead of halting (cleared by the next progress).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub alarmed: bool,
    /// Whether this rollout creates the cluster, recorded when it starts (no pod ran another
    /// version than the target) and kept when the target changes on the way. None in a record written before the field
    /// existed: then told from the versions, as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation: Option<bool>,
    /// Every version the cluster's CNs have run, in the order each first ran, kept from the
    /// rollout this one replaced (finished or not): the kernel's catalog only moves forward,
    /// so a CN may go back only to a version whose catalog is as new as every later one's
    /// ([`generation::cn_may_run`]). A version enters with the first CN restart the operator
    /// sends onto it ([`Rollout::note_cn_restarts`]), recorded before the restart is acted on:
    /// the catalog may move as soon as that CN runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cn_versions: Vec<String>,
}

/// What happened this step, for the policy to report.
#[derive(Default)]
pub struct StepReport {
    pub phase_started: Option<Component>,
    pub phase_finished: Option<Component>,
    pub finished: bool,
    pub halted: Option<String>,
    /// A creation went past the stall timeout (once per stall).
    pub alarmed: Option<String>,
    /// CNs moved onto the phase's version without a drain: (pod, why).
    pub stranded: Vec<(String, String)>,
}

impl Rollout {
    /// A rollout to `spec`'s target. `replaced` is the rollout it takes over from, when the
    /// target changed before that one completed: what the cluster ran before (the versions a
    /// rollback restores) and whether this is its creation are kept from it; otherwise they
    /// are read from every pod now.
    pub fn start(spec: &UpgradeSpec, obs: &Observation, replaced: Option<&Rollout>) -> Rollout {
        let unfinished = replaced.filter(|r| r.status != RolloutStatus::Complete);
        // A creation: no pod runs another version than the target (none may exist yet).
        let (previous, creation) = match unfinished {
            Some(r) => (r.previous.clone(), r.is_creation()),
            None => (
                ran_before(obs),
                obs.pods.iter().all(|p| p.version == spec.target_version),
            ),
        };
        let mut cn_versions = replaced.map(Rollout::cn_history).unwrap_or_default();
        note_cn_versions(&mut cn_versions, obs);
        Rollout {
            target: spec.target_version.clone(),
            previous,
            phases: spec.strategy.phases(),
            phase: 0,
            phase_started: false,
            step: Step::NextPod,
            status: RolloutStatus::Running,
            rolling_back: false,
            last_progress: obs.now,
            tolerance: Tolerance::Default,
            pre_pull_sent: BTreeMap::new(),
            hold: None,
            absent_since: None,
            unsupported: BTreeSet::new(),
            healthy_seen: false,
            more: Vec::new(),
            alarmed: false,
            creation: Some(creation),
            cn_versions,
        }
    }

    /// [`Rollout::cn_versions`], or for a record written before the field existed, what it
    /// implies in order: the version before the rollout, then its target (taken as run: a
    /// set-back past it is then judged, never let through on an order read from the pods).
    fn cn_history(&self) -> Vec<String> {
        if !self.cn_versions.is_empty() {
            return self.cn_versions.clone();
        }
        let mut history = Vec::new();
        if let Some(previous) = self.previous.get(&Component::Cn) {
            note_cn_version(&mut history, previous);
        }
        note_cn_version(&mut history, &self.target);
        history
    }

    /// Notes the version of every CN restart among `actions` (the decision about to be
    /// recorded, then acted on) in [`Rollout::cn_versions`]. A restart of a pod not observed
    /// counts as a CN's: noting too much only refuses more.
    pub fn note_cn_restarts(&mut self, obs: &Observation, actions: &[Action]) {
        for action in actions {
            if let Action::RestartPod { pod, version, .. } = action
                && obs.pod(pod).is_none_or(|p| p.component == Component::Cn)
            {
                note_cn_version(&mut self.cn_versions, version);
            }
        }
    }

    /// Why no CN may start on `version` here, if none may (see [`Rollout::cn_versions`]).
    pub fn cn_refusal(&self, version: &str) -> Option<String> {
        generation::cn_may_run(version, &self.cn_versions).err()
    }

    /// The rollout creates the cluster: no pod ran another version when it started (recorded
    /// then, from every pod, and kept when the target changes: a target set back to the
    /// version most pods still run is no creation). It
    /// has nothing running to protect by stopping and no version to go back to, so a stall
    /// does not halt it (under load, LOG pods can take longer than the stall timeout to start).
    pub fn is_creation(&self) -> bool {
        self.creation
            .unwrap_or_else(|| self.previous.values().all(|v| *v == self.target))
    }

    /// Whether the rollout, as it stands, restarts CN `pod` (instance `uid`) onto `version`:
    /// running, in its CN phase, with a lane draining that instance for that version.
    pub fn wants_cn_restart(&self, pod: &str, uid: &str, version: &str) -> bool {
        self.status == RolloutStatus::Running
            && self.component() == Some(Component::Cn)
            && self.phase_version() == version
            && self
                .steps()
                .any(|s| matches!(s, Step::DrainCn { pod: p, uid: u } if p == pod && u == uid))
    }

    /// The lanes a rollback keeps: a CN whose hand-over was requested cannot serve again, so
    /// its lane stays (it is restarted onto the version the phase now goes back to, within
    /// the phase's width); every other lane is dropped (its pod is picked again if it needs
    /// to go back, a prepared CN's drain is taken back).
    fn lanes_for_rollback(&mut self, drains: &mut [Drain]) {
        let mut kept = Vec::new();
        let steps: Vec<Step> = self.steps().cloned().collect();
        for step in steps {
            let Step::DrainCn { pod, uid } = &step else {
                continue;
            };
            let drain = drains
                .iter_mut()
                .find(|d| d.is_active() && d.pod == *pod && d.pod_uid == *uid);
            match drain {
                Some(d) if d.hand_over_requested() || d.process_marked => kept.push(step),
                Some(d) => d.cancel_requested = true,
                None => {}
            }
        }
        let mut lanes = kept.into_iter();
        self.step = lanes.next().unwrap_or(Step::NextPod);
        self.more = lanes
            .map(|step| Lane {
                step,
                ..Lane::idle()
            })
            .collect();
    }

    /// Learns which extensions the kernel lacks from its answers to the rollout's calls.
    pub fn absorb(&mut self, results: &[ActionResult]) {
        for r in results {
            if let (Some(extension), Err(ActionError::Unsupported(_))) =
                (Extension::of(&r.action), &r.result)
            {
                self.unsupported.insert(extension);
            }
        }
    }

    /// Shards led by `store` whose leadership the kernel can move first (none without the
    /// extension).
    fn leadership_to_move(&self, obs: &Observation, store: &str) -> Vec<(u64, String)> {
        if self.unsupported.contains(&Extension::LeaderTransfer) {
            return Vec::new();
        }
        gates::leadership_to_move(obs, store)
    }

    pub fn component(&self) -> Option<Component> {
        self.phases.get(self.phase).copied()
    }

    /// The version the current phase moves its pods to.
    pub fn phase_version(&self) -> String {
        match (self.rolling_back, self.component()) {
            (true, Some(c)) => self.previous.get(&c).cloned().unwrap_or_default(),
            _ => self.target.clone(),
        }
    }

    /// Every step in progress: the rollout's own, then its further lanes'.
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        std::iter::once(&self.step).chain(self.more.iter().map(|l| &l.step))
    }

    /// The proxy instances the running rollout keeps out of their Service.
    pub fn proxies_out_of_service(&self) -> Vec<(&str, &str)> {
        if self.status != RolloutStatus::Running {
            return Vec::new();
        }
        self.steps()
            .filter_map(|s| match s {
                Step::DrainProxy { pod, uid, .. } => Some((pod.as_str(), uid.as_str())),
                _ => None,
            })
            .collect()
    }

    /// A LOG pod is being moved by the rollout right now (evictions of LOG wait for it).
    pub fn log_restart_in_flight(&self) -> bool {
        self.component() == Some(Component::Log)
            && matches!(
                self.step,
                Step::MoveLeadership { .. } | Step::Restart { .. } | Step::Verify { .. }
            )
    }

    /// A pod missing for a few seconds is not coming back (a recreated pod reappears at once).
    fn absent_too_long(&mut self, now: Millis, resend_after: Millis) -> bool {
        let since = *self.absent_since.get_or_insert(now);
        now - since >= resend_after
    }

    fn progress(&mut self, now: Millis, step: Step) {
        self.step = step;
        self.last_progress = now;
        self.hold = None;
        self.alarmed = false;
        self.healthy_seen = false;
    }

    fn wait(&mut self, reason: impl Into<String>) {
        self.hold = Some(reason.into());
    }

    pub fn step(
        &mut self,
        obs: &Observation,
        timing: &RolloutTiming,
        drains: &mut Vec<Drain>,
        actions: &mut Vec<Action>,
    ) -> StepReport {
        let report = self.change_of_mind(obs, timing, drains);
        if self.status != RolloutStatus::Running || report.halted.is_some() {
            return report;
        }
        let Some(component) = self.component() else {
            return report;
        };
        self.step_forward(obs, timing, component, drains, actions, report)
    }

    /// What a stall changes: a creation raises its alarm and keeps waiting, an upgrade halts or
    /// rolls back. Judged before anything else moves in a tick (the drains of the CNs the
    /// rollout prepared follow its decision), and idempotent within the tick.
    pub fn change_of_mind(
        &mut self,
        obs: &Observation,
        timing: &RolloutTiming,
        drains: &mut [Drain],
    ) -> StepReport {
        let mut report = StepReport::default();
        if matches!(self.status, RolloutStatus::Halted { .. }) && self.is_creation() {
            // Halted by an operator that still halted creations: resume, alarmed.
            self.status = RolloutStatus::Running;
        }
        if self.status != RolloutStatus::Running {
            return report;
        }
        let now = obs.now;
        let Some(component) = self.component() else {
            self.status = RolloutStatus::Complete;
            report.finished = true;
            return report;
        };
        if now - self.last_progress >= timing.stall_timeout {
            let waiting = self.hold.clone().unwrap_or_else(|| "no progress".into());
            let reason = format!(
                "stalled in the {component} phase: no progress for {}: {waiting}",
                format_duration(now - self.last_progress)
            );
            let wants_rollback =
                timing.on_stall == OnStall::Rollback && !self.rolling_back && self.phase_started;
            let refusal = wants_rollback
                .then(|| self.rollback_refusal(component))
                .flatten();
            if self.is_creation() {
                if !self.alarmed {
                    self.alarmed = true;
                    report.alarmed = Some(reason);
                }
            } else if wants_rollback && refusal.is_none() {
                self.rolling_back = true;
                self.progress(now, Step::NextPod);
                self.lanes_for_rollback(drains);
                self.hold = Some(format!("rolling the {component} phase back: {reason}"));
            } else {
                let reason = match refusal {
                    Some(refusal) => format!("{reason}; no rollback: {refusal}"),
                    None => reason,
                };
                self.status = if self.rolling_back {
                    RolloutStatus::RolledBack {
                        reason: format!("rollback stalled too: {reason}"),
                    }
                } else {
                    RolloutStatus::Halted {
                        reason: reason.clone(),
                    }
                };
                report.halted = Some(reason);
                return report;
            }
        }
        report
    }

    /// Why the `component` phase may not go back to its previous version: only CNs carry the
    /// catalog.
    fn rollback_refusal(&self, component: Component) -> Option<String> {
        let previous = self.previous.get(&component)?;
        (component == Component::Cn)
            .then(|| self.cn_refusal(previous))
            .flatten()
    }

    fn step_forward(
        &mut self,
        obs: &Observation,
        timing: &RolloutTiming,
        component: Component,
        drains: &mut Vec<Drain>,
        actions: &mut Vec<Action>,
        mut report: StepReport,
    ) -> StepReport {
        self.cn_versions = self.cn_history();
        note_cn_versions(&mut self.cn_versions, obs);
        self.keep_tolerance(obs, component, timing, actions);
        if timing.pre_pull && !self.rolling_back {
            self.pre_pull(obs, timing, actions);
        }
        self.step_lanes(obs, timing, component, drains, actions, &mut report);
        report
    }

    /// Steps every lane of the phase, then opens another while the phase may restart more
    /// pods at once and each lane has a pod. A lane with nothing to do is closed unless it is
    /// the last (which settles the phase once no pod is left).
    fn step_lanes(
        &mut self,
        obs: &Observation,
        timing: &RolloutTiming,
        component: Component,
        drains: &mut Vec<Drain>,
        actions: &mut Vec<Action>,
        report: &mut StepReport,
    ) {
        let width = timing.parallelism(component, staying(obs, component));
        let first = Lane {
            step: self.step.clone(),
            absent_since: self.absent_since,
            healthy_seen: self.healthy_seen,
            hold: None,
        };
        let mut lanes: Vec<Lane> = std::iter::once(first)
            .chain(std::mem::take(&mut self.more))
            .collect();
        // CN and proxy phases prepare the next pod (sessions moved off a CN, a proxy out of
        // its Service with its clients leaving) while restarted pods hold for their stability
        // window: those pods serve again. What cannot be taken back (a CN's hand-over, a
        // restart) still waits until fewer than `width` pods are restarted and unproven.
        let overlaps = matches!(component, Component::Cn | Component::Proxy);
        let mut i = 0;
        loop {
            if i == lanes.len() {
                let all_busy = lanes.iter().all(|l| l.step.pod().is_some());
                let room = if overlaps {
                    out_of_service(&lanes) < width && lanes.len() < 2 * width
                } else {
                    lanes.len() < width
                };
                if !room || !all_busy {
                    break;
                }
                lanes.push(Lane::idle());
            }
            let others = other_lanes(&lanes, i);
            self.step = lanes[i].step.clone();
            self.absent_since = lanes[i].absent_since;
            self.healthy_seen = lanes[i].healthy_seen;
            self.hold = None;
            let progress_before = self.last_progress;
            self.step_lane(obs, timing, component, &others, drains, actions, report);
            if i >= width {
                // A lane beyond the width only prepares (it may be taken back): its moves do
                // not reset the stall clock, or a gate that flaps in its window would never
                // halt the rollout.
                self.last_progress = progress_before;
            }
            lanes[i] = Lane {
                step: self.step.clone(),
                absent_since: self.absent_since,
                healthy_seen: self.healthy_seen,
                hold: self.hold.take(),
            };
            if self.status != RolloutStatus::Running || self.component() != Some(component) {
                // Halted (the other lanes stay as they are), or the phase finished (only a
                // lone lane settles it): nothing else moves this step.
                break;
            }
            if i + 1 == lanes.len() && i > 0 && lanes[i].step.pod().is_none() {
                // The lane just opened found nothing to start.
                lanes.pop();
                break;
            }
            i += 1;
        }
        if lanes.iter().any(|l| l.step.pod().is_some()) {
            lanes.retain(|l| l.step.pod().is_some());
        }
        if overlaps && self.status == RolloutStatus::Running {
            self.take_back_preparations(width, &mut lanes, drains, actions);
        }
        let holds: Vec<String> = lanes.iter().filter_map(|l| l.hold.clone()).collect();
        let mut lanes = lanes.into_iter();
        let first = lanes.next().expect("one lane at least");
        self.step = first.step;
        self.absent_since = first.absent_since;
        self.healthy_seen = first.healthy_seen;
        self.more = lanes.map(|l| Lane { hold: None, ..l }).collect();
        self.hold = (!holds.is_empty()).then(|| holds.join("; "));
    }

    /// One lane's step: the pod it works on, or the next pod no other lane has.
    #[allow(clippy::too_many_arguments)]
    fn step_lane(
        &mut self,
        obs: &Observation,
        timing: &RolloutTiming,
        component: Component,
        others: &OtherLanes,
        drains: &mut Vec<Drain>,
        actions: &mut Vec<Action>,
        report: &mut StepReport,
    ) {
        let now = obs.now;
        let version = self.phase_version();
        let watched = match &self.step {
            Step::Verify { pod, .. } | Step::Restart { pod, .. } => Some(pod.clone()),
            _ => None,
        };
        if watched.is_none_or(|p| obs.pod(&p).is_some()) {
            self.absent_since = None;
        }
        match self.step.clone() {
            Step::Verify { pod, .. } | Step::Restart { pod, .. }
                if obs.pod(&pod).is_none() && self.absent_too_long(now, timing.resend_after) =>
            {
                // Removed meanwhile (scale-in): nothing left to verify for it.
                self.progress(now, Step::NextPod);
            }
            Step::NextPod => {
                self.next_pod(obs, component, &version, others, drains, actions, report)
            }
            Step::MoveLeadership { pod, uid, sent_at } => {
                if let Err(e) = gates::log_restart_margin(obs, &pod) {
                    self.step = Step::NextPod;
                    self.wait(e);
                    return;
                }
                let moves = self.leadership_to_move(obs, &pod);
                if moves.is_empty() {
                    self.restart(obs, &pod, &uid, None, &version, actions);
                } else {
                    if sent_at.is_none_or(|t| now - t >= timing.resend_after) {
                        for (shard_id, to_store) in &moves {
                            actions.push(Action::TransferLogLeader {
                                shard_id: *shard_id,
                                to_store: to_store.clone(),
                            });
                        }
                        self.step = Step::MoveLeadership {
                            pod: pod.clone(),
                            uid,
                            sent_at: Some(now),
                        };
                    }
                    self.wait(format!("moving shard leadership away from {pod}"));
                }
            }
            Step::DrainCn { pod, uid } => {
                let stranded = obs
                    .pod(&pod)
                    .filter(|p| p.uid == uid)
                    .and_then(|p| stranded_by_the_catalog(obs, &[p], &version));
                let active = drains
                    .iter_mut()
                    .rev()
                    .find(|d| d.is_active() && d.pod == pod && d.pod_uid == uid);
                if let Some(stranded) = stranded
                    && active
                        .as_ref()
                        .is_none_or(|d| d.stage < DrainStage::Released)
                {
                    // Its process died while it was being prepared and cannot come back:
                    // the drain has nothing left to protect.
                    if let Some(d) = active {
                        d.end_with_its_process(now);
                    }
                    self.move_stranded_cn(obs, stranded, &version, actions, report);
                    return;
                }
                let drain = drains
                    .iter()
                    .rev()
                    .find(|d| d.pod == pod && d.pod_uid == uid);
                let replaced = obs.pod(&pod).is_none_or(|p| p.uid != uid);
                match drain {
                    Some(d) if d.stage == DrainStage::Released || replaced => {
                        let epoch = d.start_epoch;
                        self.progress(
                            now,
                            Step::Restart {
                                pod,
                                old_uid: uid,
                                old_epoch: epoch,
                                sent_at: now,
                            },
                        );
                    }
                    Some(d) if d.end.is_some_and(|e| e != DrainEnd::Released) => {
                        self.progress(now, Step::NextPod);
                    }
                    Some(d) => {
                        let hold = d.hold.clone().unwrap_or_else(|| "draining".into());
                        self.wait(format!("draining {pod} before its restart: {hold}"));
                    }
                    None => self.step = Step::NextPod,
                }
            }
            Step::DrainProxy {
                pod,
                uid,
                since,
                sent_at,
            } => self.drain_proxy(
                obs,
                timing,
                (&pod, &uid),
                others,
                since,
                sent_at,
                &version,
                actions,
                report,
            ),
            Step::Restart {
                pod,
                old_uid,
                old_epoch,
                sent_at,
            } => match obs.pod(&pod) {
                Some(p) if p.uid == old_uid => {
                    if !p.terminating && now - sent_at >= timing.resend_after {
                        // The restart was lost (an operator restart between record and act).
                        // Start the pod over: every pre-restart gate is checked again, and a
                        // CN goes back through its drain (whose own release re-verifies); a
                        // CN moved without one (stranded by the catalog) is picked again.
                        let drained = drains.iter().any(|d| d.pod == pod && d.pod_uid == old_uid);
                        if component != Component::Cn || !drained {
                            self.step = Step::NextPod;
                        }
                    }
                    self.wait(format!("waiting for {pod} to restart"));
                }
                Some(p) => {
                    let restarts = p.restarts;
                    self.progress(
                        now,
                        Step::Verify {
                            pod,
                            old_epoch,
                            restarts,
                            healthy_since: None,
                        },
                    );
                }
                None => self.wait(format!("waiting for {pod} to be recreated")),
            },
            Step::Verify {
                pod,
                old_epoch,
                restarts,
                healthy_since,
            } => {
                // Replaced by someone else before our restart took: it still runs the old
                // version, so it goes through the whole restart again.
                if obs.pod(&pod).is_some_and(|p| {
                    !p.terminating && p.phase == PodPhase::Running && p.version != version
                }) {
                    self.progress(now, Step::NextPod);
                    return;
                }
                let crashed = obs.pod(&pod).map(|p| p.restarts).unwrap_or(restarts) > restarts;
                let gate = if crashed {
                    Err(format!("{pod} restarted on its own since it came up"))
                } else {
                    pod_gate(obs, component, &pod, &version)
                };
                let restarts = obs.pod(&pod).map_or(restarts, |p| p.restarts);
                match gate {
                    Ok(()) => {
                        let since = healthy_since.unwrap_or(now);
                        let last = self.remaining(obs, component, &version) == 0;
                        if last || now - since >= timing.stability_window {
                            // The last pod's window is the phase's settle window.
                            self.progress(now, Step::NextPod);
                        } else {
                            if healthy_since.is_none() && !self.healthy_seen {
                                self.last_progress = now;
                                self.healthy_seen = true;
                            }
                            self.step = Step::Verify {
                                pod: pod.clone(),
                                old_epoch,
                                restarts,
                                healthy_since: Some(since),
                            };
                            self.wait(format!("{pod} healthy, holding for the stability window"));
                        }
                    }
                    Err(e) => {
                        self.step = Step::Verify {
                            pod,
                            old_epoch,
                            restarts,
                            healthy_since: None,
                        };
                        self.wait(e);
                    }
                }
            }
            Step::Settle { healthy_since } => {
                match gates::component_gate(obs, component, &version) {
                    Ok(()) => {
                        let since = healthy_since.unwrap_or(now);
                        if now - since >= timing.stability_window {
                            self.finish_phase(now, component, actions, report);
                        } else {
                            if healthy_since.is_none() && !self.healthy_seen {
                                self.last_progress = now;
                                self.healthy_seen = true;
                            }
                            self.step = Step::Settle {
                                healthy_since: Some(since),
                            };
                            self.wait(format!(
                                "{component} phase healthy, holding for the stability window"
                            ));
                        }
                    }
                    Err(e) => {
                        self.step = Step::Settle {
                            healthy_since: None,
                        };
                        self.wait(format!("{component} phase gate: {e}"));
                    }
                }
            }
        }
    }

    fn remaining(&self, obs: &Observation, component: Component, version: &str) -> usize {
        obs.pods_of(component)
            .filter(|p| p.version != version)
            .count()
    }

    #[allow(clippy::too_many_arguments)]
    fn next_pod(
        &mut self,
        obs: &Observation,
        component: Component,
        version: &str,
        others: &OtherLanes,
        drains: &mut Vec<Drain>,
        actions: &mut Vec<Action>,
        report: &mut StepReport,
    ) {
        let now = obs.now;
        let mut pods: Vec<&PodObservation> = obs
            .pods_of(component)
            .filter(|p| !others.claimed.contains(&p.name))
            .collect();
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        // Pods other lanes restart are the phase's own unavailability (within its width);
        // any other pod down waits.
        if let Some(busy) = pods
            .iter()
            .find(|p| p.terminating || p.phase != PodPhase::Running)
        {
            self.wait(format!("{} is not running", busy.name));
            return;
        }
        // LOG: followers first, the pod leading the most shards last (fewest leadership moves,
        // and on a kernel that cannot move leadership, fewest elections).
        let leads = |pod: &PodObservation| -> usize {
            if component != Component::Log {
                return 0;
            }
            obs.hakeeper.as_ref().map_or(0, |d| {
                d.log_shards
                    .iter()
                    .filter(|s| s.leader.as_deref() == Some(pod.name.as_str()))
                    .count()
            })
        };
        // CN: one already draining for a restart first (a marked CN that waits for a lane of
        // this phase serves nothing, and may be the reason no other CN can be prepared).
        let restarting = |pod: &PodObservation| -> bool {
            component == Component::Cn
                && drains.iter().any(|d| {
                    d.is_active()
                        && d.pod == pod.name
                        && d.pod_uid == pod.uid
                        && matches!(d.purpose, DrainPurpose::Restart { .. })
                })
        };
        let Some(pod) = pods
            .iter()
            .filter(|p| p.version != version)
            .min_by_key(|p| (leads(p), !restarting(p)))
            .copied()
        else {
            if !others.claimed.is_empty() {
                // Every pod left is in another lane: this one has nothing to do.
                return;
            }
            self.progress(
                now,
                Step::Settle {
                    healthy_since: None,
                },
            );
            return;
        };
        // A CN the catalog left behind is never coming back Ready: it goes first.
        let stranded = match component {
            Component::Cn => stranded_by_the_catalog(obs, &pods, version),
            _ => None,
        };
        if stranded.is_none()
            && let Some(unready) = pods.iter().find(|p| !p.ready)
        {
            self.wait(format!("{} is not Ready", unready.name));
            return;
        }
        let pod = stranded.unwrap_or(pod);
        // The replacement starts on the same node, or anywhere schedulable if that node is
        // cordoned: the image must be there already (a pull would stretch the downtime).
        let has_image = |node: &str| {
            obs.node_images
                .get(node)
                .is_some_and(|images| images.iter().any(|i| i == version))
        };
        let missing = if obs.unschedulable_nodes.contains(&pod.node) {
            obs.node_images
                .keys()
                .find(|n| !obs.unschedulable_nodes.contains(n) && !has_image(n))
                .cloned()
        } else {
            (!has_image(&pod.node)).then(|| pod.node.clone())
        };
        if let Some(node) = missing {
            self.wait(format!("waiting for {version} to be pulled onto {node}"));
            return;
        }
        // Between phases: the previous phase's gate holds again, now.
        if !self.phase_started && self.phase > 0 && !self.rolling_back {
            let previous = self.phases[self.phase - 1];
            if let Err(e) = gates::component_gate(obs, previous, &self.target) {
                self.wait(format!("{previous} phase gate no longer holds: {e}"));
                return;
            }
        }
        if let Some(stranded) = stranded {
            self.move_stranded_cn(obs, stranded, version, actions, report);
            return;
        }
        let pre: Gate = match component {
            Component::Log => gates::log_restart_margin(obs, &pod.name),
            Component::Tn => obs
                .hakeeper
                .as_ref()
                .map_err(|e| format!("cannot read HAKeeper: {e}"))
                .and_then(gates::wal_writable),
            Component::Cn => {
                // CNs draining, or in another lane: restarting (its restart may not show yet)
                // or restarted and not yet through its window. A CN is prepared only while a
                // proven one keeps serving: an unproven CN may yet crash in its window.
                let draining: Vec<String> = drains
                    .iter()
                    .filter(|d| d.is_active() && d.stage < DrainStage::Released)
                    .map(|d| d.pod.clone())
                    .chain(others.claimed.iter().cloned())
                    .collect();
                gates::other_working_cn_excluding(obs, &pod.name, &draining)
            }
            Component::Proxy => {
                if obs.pods_of(Component::Proxy).count() > 1 {
                    gates::other_proxy_routes_excluding(
                        obs,
                        &without(&others.unavailable, &pod.name),
                    )
                } else {
                    Ok(())
                }
            }
        };
        if let Err(e) = pre {
            self.wait(format!("before restarting {}: {e}", pod.name));
            return;
        }
        if !self.phase_started {
            self.phase_started = true;
            report.phase_started = Some(component);
        }
        match component {
            Component::Log => {
                let moves = self.leadership_to_move(obs, &pod.name);
                if moves.is_empty() {
                    self.restart(obs, &pod.name, &pod.uid, None, version, actions);
                } else {
                    for (shard_id, to_store) in moves {
                        actions.push(Action::TransferLogLeader { shard_id, to_store });
                    }
                    self.progress(
                        now,
                        Step::MoveLeadership {
                            pod: pod.name.clone(),
                            uid: pod.uid.clone(),
                            sent_at: Some(now),
                        },
                    );
                    self.wait(format!("moving shard leadership away from {}", pod.name));
                }
            }
            Component::Cn => {
                let uuid = pod.cn_uuid.clone().unwrap_or_default();
                if let Some(other) = drains
                    .iter_mut()
                    .find(|d| d.is_active() && d.pod == pod.name && d.pod_uid == pod.uid)
                {
                    if !matches!(other.purpose, DrainPurpose::Restart { .. }) {
                        self.wait(format!(
                            "{} is already draining for another reason",
                            pod.name
                        ));
                        return;
                    }
                    // Its restart is this rollout's from now on.
                    other.rollout = Some(self.target.clone());
                } else {
                    let mut drain = Drain::new(
                        &pod.name,
                        &pod.uid,
                        &uuid,
                        DrainPurpose::Restart {
                            version: version.to_string(),
                        },
                        now,
                    );
                    drain.rollout = Some(self.target.clone());
                    drains.push(drain);
                }
                self.progress(
                    now,
                    Step::DrainCn {
                        pod: pod.name.clone(),
                        uid: pod.uid.clone(),
                    },
                );
            }
            Component::Tn => {
                let epoch = obs
                    .hakeeper
                    .as_ref()
                    .ok()
                    .and_then(|d| d.tns.first())
                    .map(|t| t.start_epoch);
                self.restart(obs, &pod.name, &pod.uid, epoch, version, actions);
            }
            Component::Proxy if obs.pods_of(Component::Proxy).count() > 1 => {
                actions.push(Action::SetProxyServing {
                    pod: pod.name.clone(),
                    uid: pod.uid.clone(),
                    serving: false,
                });
                self.progress(
                    now,
                    Step::DrainProxy {
                        pod: pod.name.clone(),
                        uid: pod.uid.clone(),
                        since: now,
                        sent_at: now,
                    },
                );
                self.wait(format!("taking {} out of its Service", pod.name));
            }
            // The only proxy: no other place for its clients. Its restart cuts what runs on
            // its connections, which no order of steps avoids on the stock kernel.
            Component::Proxy => self.restart(obs, &pod.name, &pod.uid, None, version, actions),
        }
    }

    /// A CN the catalog left behind (see [`stranded_by_the_catalog`]) goes straight onto the
    /// phase's version: it has no process to drain, and the version it would restart on in
    /// place can never start again. It takes this lane like any restart, so its window is
    /// watched and the phase's width kept.
    fn move_stranded_cn(
        &mut self,
        obs: &Observation,
        pod: &PodObservation,
        version: &str,
        actions: &mut Vec<Action>,
        report: &mut StepReport,
    ) {
        if !self.phase_started {
            self.phase_started = true;
            report.phase_started = Some(Component::Cn);
        }
        report.stranded.push((
            pod.name.clone(),
            format!(
                "{} cannot start on {} ({}): a running CN brings {}, and the kernel stops a CN \
                 of an older catalog at start; no process of it runs, so it goes onto {version} \
                 without a drain",
                pod.name,
                pod.version,
                generation::named(generation::catalog(&pod.version)),
                generation::named(catalog_reached(obs)),
            ),
        ));
        self.restart(obs, &pod.name, &pod.uid, None, version, actions);
    }

    fn restart(
        &mut self,
        obs: &Observation,
        pod: &str,
        uid: &str,
        old_epoch: Option<u64>,
        version: &str,
        actions: &mut Vec<Action>,
    ) {
        actions.push(Action::RestartPod {
            pod: pod.to_string(),
            uid: uid.to_string(),
            version: version.to_string(),
        });
        self.progress(
            obs.now,
            Step::Restart {
                pod: pod.to_string(),
                old_uid: uid.to_string(),
                old_epoch,
                sent_at: obs.now,
            },
        );
    }

    /// Out of its Service, a proxy stops only once no client connection is left on it, read
    /// from every CN. Another proxy must route meanwhile, or it goes back into service.
    #[allow(clippy::too_many_arguments)]
    fn drain_proxy(
        &mut self,
        obs: &Observation,
        timing: &RolloutTiming,
        (pod, uid): (&str, &str),
        others: &OtherLanes,
        since: Millis,
        sent_at: Millis,
        version: &str,
        actions: &mut Vec<Action>,
        report: &mut StepReport,
    ) {
        let now = obs.now;
        let Some(p) = obs.pod(pod).filter(|p| p.uid == uid && !p.terminating) else {
            // Replaced or stopped by someone else: start that pod over.
            self.progress(now, Step::NextPod);
            return;
        };
        if let Err(e) = gates::other_proxy_routes_excluding(obs, &without(&others.unavailable, pod))
        {
            actions.push(Action::SetProxyServing {
                pod: pod.to_string(),
                uid: uid.to_string(),
                serving: true,
            });
            self.step = Step::NextPod;
            self.wait(format!("{pod} back in its Service: {e}"));
            return;
        }
        if p.serving {
            if now - sent_at >= timing.resend_after {
                actions.push(Action::SetProxyServing {
                    pod: pod.to_string(),
                    uid: uid.to_string(),
                    serving: false,
                });
                self.step = Step::DrainProxy {
                    pod: pod.to_string(),
                    uid: uid.to_string(),
                    since,
                    sent_at: now,
                };
            }
            self.wait(format!("taking {pod} out of its Service"));
            return;
        }
        if now - since < timing.endpoints_settle {
            self.wait(format!(
                "{pod} out of its Service; waiting for the endpoints to follow"
            ));
            return;
        }
        let left = match obs.proxy_connections.get(pod) {
            Some(Ok(0)) => {
                let width = timing.parallelism(Component::Proxy, staying(obs, Component::Proxy));
                if others.restarted.len() >= width {
                    // Its clients are gone (it stays out of its Service); the restart waits.
                    self.wait(format!(
                        "{pod} has no client left; its restart waits until {} held for the stability window",
                        others.restarted.join(", ")
                    ));
                    return;
                }
                self.restart(obs, pod, uid, None, version, actions);
                return;
            }
            Some(Ok(n)) => format!("{pod} still carries {n} client connections"),
            Some(Err(e)) => format!("cannot count {pod}'s client connections: {e}"),
            None => format!("no count of {pod}'s client connections"),
        };
        if now - since >= timing.proxy_drain_grace {
            let reason = format!(
                "{left} {} after it left its Service (grace {}): it is not stopped with connections on it",
                format_duration(now - since),
                format_duration(timing.proxy_drain_grace)
            );
            self.status = RolloutStatus::Halted {
                reason: reason.clone(),
            };
            report.halted = Some(reason);
            return;
        }
        self.wait(format!("{left}; waiting for its clients to leave"));
    }

    /// A pod held for its window that fails its gate again is out of service once more: the
    /// pods being prepared beyond the phase's width go back to service, newest first (a CN's
    /// drain is cancelled, a proxy returns to its Service). A requested hand-over cannot be
    /// taken back; that CN finishes its drain.
    fn take_back_preparations(
        &mut self,
        width: usize,
        lanes: &mut Vec<Lane>,
        drains: &mut [Drain],
        actions: &mut Vec<Action>,
    ) {
        while out_of_service(lanes) > width {
            let reversible = |lane: &Lane| match &lane.step {
                Step::DrainCn { pod, uid } => drains.iter().any(|d| {
                    d.is_active()
                        && d.pod == *pod
                        && d.pod_uid == *uid
                        && d.stage < DrainStage::Released
                        && !d.hand_over_requested()
                }),
                Step::DrainProxy { .. } => true,
                _ => false,
            };
            let Some(k) = lanes.iter().rposition(reversible) else {
                return;
            };
            let lane = lanes.remove(k);
            let why = format!(
                "a restarted pod of the phase failed its gate during its stability window; {} goes back to service",
                lane.step.pod().unwrap_or_default()
            );
            match lane.step {
                Step::DrainCn { pod, uid } => {
                    for d in drains
                        .iter_mut()
                        .filter(|d| d.is_active() && d.pod == pod && d.pod_uid == uid)
                    {
                        d.cancel_requested = true;
                    }
                }
                Step::DrainProxy { pod, uid, .. } => actions.push(Action::SetProxyServing {
                    pod,
                    uid,
                    serving: true,
                }),
                _ => unreachable!("only reversible lanes are taken back"),
            }
            if let Some(first) = lanes.first_mut() {
                first.hold = Some(match first.hold.take() {
                    Some(h) => format!("{h}; {why}"),
                    None => why,
                });
            }
        }
    }

    /// Whether a CN drained for this rollout may hand its lock tables over now: the hand-over
    /// cannot be taken back, so it waits while restarted pods not yet through their stability
    /// window fill the phase's width (its sessions may move off meanwhile).
    pub fn hand_over_gate(&self, obs: &Observation, timing: &RolloutTiming, pod: &str) -> Gate {
        // A hand-over cannot be taken back: none is asked while the rollout stands still or
        // does not restart CNs (a halt never moves a pod forward).
        match &self.status {
            RolloutStatus::Running => {}
            RolloutStatus::Halted { .. } | RolloutStatus::RolledBack { .. } => {
                return Err(format!(
                    "the rollout is halted: {pod} is not handed over (its drain is taken back)"
                ));
            }
            RolloutStatus::Complete => {
                return Err(format!("the rollout is complete: {pod} is not restarted"));
            }
        }
        if self.component() != Some(Component::Cn) {
            return Err(format!(
                "the rollout is not in its CN phase: {pod} is not handed over"
            ));
        }
        let width = timing.parallelism(Component::Cn, staying(obs, Component::Cn));
        let restarted: Vec<&str> = std::iter::once(&self.step)
            .chain(self.more.iter().map(|l| &l.step))
            .filter(|s| s.restarted())
            .filter_map(Step::pod)
            .filter(|p| *p != pod)
            .collect();
        if restarted.len() >= width {
            Err(format!(
                "{} restarted and not yet held for the stability window",
                restarted.join(", ")
            ))
        } else {
            Ok(())
        }
    }

    fn finish_phase(
        &mut self,
        now: Millis,
        component: Component,
        actions: &mut Vec<Action>,
        report: &mut StepReport,
    ) {
        report.phase_finished = Some(component);
        if self.rolling_back {
            let reason = format!(
                "the {component} phase was rolled back to {} after a stall",
                self.phase_version()
            );
            self.status = RolloutStatus::RolledBack {
                reason: reason.clone(),
            };
            report.halted = Some(reason);
            return;
        }
        if component == Component::Log && self.tolerance == Tolerance::Widened {
            if !self.unsupported.contains(&Extension::WalTolerance) {
                actions.push(Action::SetTnWalTolerance { total: None });
            }
            self.tolerance = Tolerance::Restored;
        }
        self.phase += 1;
        self.phase_started = false;
        self.progress(now, Step::NextPod);
        if self.phase == self.phases.len() {
            self.status = RolloutStatus::Complete;
            report.finished = true;
        }
    }

    /// The TN tolerates a longer LOG outage while LOG replicas restart; restored after.
    fn keep_tolerance(
        &mut self,
        obs: &Observation,
        component: Component,
        timing: &RolloutTiming,
        actions: &mut Vec<Action>,
    ) {
        if component == Component::Log && self.tolerance == Tolerance::Default {
            self.tolerance = Tolerance::Widened;
        }
        if self.unsupported.contains(&Extension::WalTolerance) {
            return;
        }
        match self.tolerance {
            Tolerance::Widened if obs.tn_wal_tolerance != Some(timing.tn_wal_tolerance) => {
                actions.push(Action::SetTnWalTolerance {
                    total: Some(timing.tn_wal_tolerance),
                });
            }
            Tolerance::Restored if obs.tn_wal_tolerance.is_some() => {
                actions.push(Action::SetTnWalTolerance { total: None });
            }
            _ => {}
        }
    }

    /// Every node that runs an old pod or could take a replacement pulls the new image.
    fn pre_pull(&mut self, obs: &Observation, timing: &RolloutTiming, actions: &mut Vec<Action>) {
        let mut nodes: Vec<&str> = obs
            .pods
            .iter()
            .filter(|p| p.version != self.target)
            .map(|p| p.node.as_str())
            .chain(
                obs.node_images
                    .keys()
                    .map(String::as_str)
                    .filter(|n| !obs.unschedulable_nodes.iter().any(|u| u == n)),
            )
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        for node in nodes {
            let present = obs
                .node_images
                .get(node)
                .is_some_and(|i| i.contains(&self.target));
            let due = self
                .pre_pull_sent
                .get(node)
                .is_none_or(|t| obs.now - *t >= Millis(timing.resend_after.0 * 12));
            if !present && due {
                actions.push(Action::PrePullImage {
                    node: node.to_string(),
                    version: self.target.clone(),
                });
                self.pre_pull_sent.insert(node.to_string(), obs.now);
            }
        }
    }
}

/// The pods a phase's width is a share of: those that stay (a pod deleted, or being removed by
/// a scale-in, is no share of what will serve).
fn staying(obs: &Observation, component: Component) -> usize {
    obs.pods_of(component)
        .filter(|p| !p.terminating && !obs.desired.removals.iter().any(|r| r.pod == p.name))
        .count()
}

/// What each component runs now, read from every pod (not the first listed): the version most
/// of its pods run (ties: the lowest, so the answer does not depend on listing order).
/// Every version a CN pod runs now that `ran` does not hold yet, most common first (the
/// version the cluster ran before a rollout leads its list).
fn note_cn_versions(ran: &mut Vec<String>, obs: &Observation) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for p in obs.pods_of(Component::Cn) {
        *counts.entry(p.version.as_str()).or_default() += 1;
    }
    let mut seen: Vec<(&str, usize)> = counts.into_iter().collect();
    seen.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    for (version, _) in seen {
        note_cn_version(ran, version);
    }
}

fn note_cn_version(ran: &mut Vec<String>, version: &str) {
    if !version.is_empty() && !ran.iter().any(|v| v == version) {
        ran.push(version.to_string());
    }
}

fn ran_before(obs: &Observation) -> BTreeMap<Component, String> {
    Component::ALL
        .iter()
        .filter_map(|c| {
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for p in obs.pods_of(*c) {
                *counts.entry(p.version.as_str()).or_default() += 1;
            }
            let most = counts.values().copied().max()?;
            counts
                .into_iter()
                .find(|(_, n)| *n == most)
                .map(|(v, _)| (*c, v.to_string()))
        })
        .collect()
}

/// Lanes whose pod is out of service: working on it, and not yet held healthy for the window.
fn out_of_service(lanes: &[Lane]) -> usize {
    lanes
        .iter()
        .filter(|l| l.step.pod().is_some() && !l.step.in_window())
        .count()
}

/// What the lanes other than `me` hold.
fn other_lanes(lanes: &[Lane], me: usize) -> OtherLanes {
    let others = || {
        lanes
            .iter()
            .enumerate()
            .filter(move |(j, _)| *j != me)
            .map(|(_, l)| &l.step)
    };
    let pods = |keep: fn(&Step) -> bool| {
        others()
            .filter(|s| keep(s))
            .filter_map(|s| s.pod().map(str::to_string))
            .collect()
    };
    OtherLanes {
        claimed: pods(|_| true),
        unavailable: pods(|s| !s.in_window()),
        restarted: pods(Step::restarted),
    }
}

/// `claimed` and `pod`, as the names a gate leaves out.
fn without<'a>(claimed: &'a [String], pod: &'a str) -> Vec<&'a str> {
    claimed
        .iter()
        .map(String::as_str)
        .chain(std::iter::once(pod))
        .collect()
}

/// A CN whose in-place restarts can never start again: its release's catalog is older than
/// that of a CN running now (Ready), so the cluster's catalog moved, or is moving, past it,
/// and the kernel stops a CN of an older catalog at start ("cannot startup a old version", or
/// "is in upgrading" while the upgrade runs; `pkg/bootstrap/service_upgrade.go`, every
/// generation). Only a CN whose process is gone (it crashed, nothing runs now) is taken: it
/// holds no session and serves no lock table, so nothing is lost by not draining it. Every
/// catalog involved must be known, and `version`'s must be at least the one reached.
fn stranded_by_the_catalog<'a>(
    obs: &Observation,
    pods: &[&'a PodObservation],
    version: &str,
) -> Option<&'a PodObservation> {
    let target = generation::catalog(version)?;
    let reached = catalog_reached(obs)?;
    if target < reached {
        return None;
    }
    pods.iter().copied().find(|p| {
        p.version != version
            && !p.ready
            && !p.terminating
            && p.started_at.is_none()
            && p.restarts > 0
            && generation::catalog(&p.version).is_some_and(|own| own < reached)
    })
}

/// The newest catalog a CN running now (Ready) brings: the cluster's catalog is at least
/// there, or on its way.
fn catalog_reached(obs: &Observation) -> Option<(u32, u32, u32)> {
    obs.pods_of(Component::Cn)
        .filter(|p| p.ready && p.started_at.is_some() && !p.terminating)
        .filter_map(|p| generation::catalog(&p.version))
        .max()
}

/// The functional gate of one restarted pod. Its new instance is known by Kubernetes' record
/// of its container (HAKeeper's UpTime survives a quick restart).
pub fn pod_gate(obs: &Observation, component: Component, pod: &str, version: &str) -> Gate {
    match component {
        Component::Log => gates::log_replica_healthy(obs, pod, version),
        Component::Tn => gates::tn_healthy(obs, version),
        Component::Cn => gates::cn_healthy(obs, pod, version),
        Component::Proxy => gates::proxy_healthy(obs, pod, version),
    }
}
