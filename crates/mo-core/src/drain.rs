//! The drain arbiter: every way a CN leaves goes through this one state machine.
//!
//! Draining (routing stops, sessions migrate) → hand its lock tables over → confirmation bound
//! to the exact instance (pod UID + CN UUID + start epoch) → release. Every uncertain input —
//! an RPC error, a timeout, "does not exist", a stale reading, an instance mismatch — keeps the
//! CN protected and says why. Nothing here releases on a timeout.

use crate::action::{Action, ActionError, ActionOutput, ActionResult};
use crate::component::Component;
use crate::gates::{Gate, cn_record};
use crate::generation;
use crate::observe::{CnActivity, DrainAnswer, Observation, OldestTxn, PodPhase, WorkState};
use crate::time::Millis;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DrainPurpose {
    /// Scale-in or pool reclaim: delete the pod once confirmed.
    Remove { why: String },
    /// Upgrade: restart the pod on `version` once confirmed.
    Restart { version: String },
    /// An eviction (node drain, consolidation, autoscaler): the evictor's retry is allowed
    /// once confirmed.
    Evict { source: String },
    /// Its node failed: the instance cannot be reached, drained or confirmed. Recorded and
    /// reported; the operator does nothing to it (involuntary, Kubernetes replaces it).
    NodeFailure { node: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainStage {
    MarkDraining,
    MigrateSessions,
    HandOver,
    Confirmed,
    Released,
    Cancelling,
    Finished,
}

/// How a drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainEnd {
    /// The pod went away after the release.
    Released,
    /// The removal was withdrawn; the CN is Working again.
    Cancelled,
    /// The pod went away or was replaced without our release (someone else, or a failure).
    InstanceGone,
}

/// A pod's running container as Kubernetes reports it: with the pod's UID, the instance a
/// drain is bound to (HAKeeper keeps a quickly restarted CN's record, UpTime included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub restarts: u32,
    pub started_at: Option<Millis>,
}

impl Instance {
    pub fn of(pod: &crate::observe::PodObservation) -> Instance {
        Instance {
            restarts: pod.restarts,
            started_at: pod.started_at,
        }
    }
}

/// The TN process whose lock allocator accepted a `SetRestartService`: the allocator keeps its
/// marks in memory only, and a new one answers "can restart, 0 transactions" for a CN it does
/// not know (v1.2.4 `lockservice/lock_table_allocator.go`, `canRestartService` and
/// `remainTxnInService`), which reads exactly like a finished hand-over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorSeen {
    /// The running TN container (pod UID, its instance); None when none was seen running.
    pub tn: Option<(String, Instance)>,
}

impl AllocatorSeen {
    pub fn of(obs: &Observation) -> AllocatorSeen {
        let mut running = obs
            .pods_of(Component::Tn)
            .filter(|p| p.phase == PodPhase::Running && p.started_at.is_some());
        let tn = match (running.next(), running.next()) {
            (Some(p), None) => Some((p.uid.clone(), Instance::of(p))),
            // None running, or two (a replacement beside a stopping one): not one allocator.
            _ => None,
        };
        AllocatorSeen { tn }
    }
}

/// One drain, bound to one instance. Serialized in the progress record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    pub pod: String,
    pub pod_uid: String,
    pub cn_uuid: String,
    /// Start epoch of the instance being drained as the kernel reports it (what the
    /// instance-bound drain extension names); learned from HAKeeper at the first look.
    pub start_epoch: Option<u64>,
    /// The container being drained (Kubernetes' record, the instance that counts).
    #[serde(default)]
    pub instance: Option<Instance>,
    pub purpose: DrainPurpose,
    pub stage: DrainStage,
    pub started_at: Millis,
    pub stage_since: Millis,
    pub kernel_drain_id: Option<u64>,
    pub begin_drain_sent_at: Option<Millis>,
    /// When the extension's `BeginDrain` answered with the drain's id.
    #[serde(default)]
    pub begin_drain_acked_at: Option<Millis>,
    pub handshake_sent_at: Option<Millis>,
    /// When the allocator was seen to accept our `SetRestartService`: answers count only
    /// after it (a lost call must not let an older instance's answer through).
    #[serde(default)]
    pub handshake_acked_at: Option<Millis>,
    /// The allocator the handshake was sent to: an answer from another one (the TN restarted)
    /// is no answer to it. None in a record written before this field existed.
    #[serde(default)]
    pub handshake_allocator: Option<AllocatorSeen>,
    pub release_sent_at: Option<Millis>,
    pub last_eviction_at: Option<Millis>,
    pub cancel_requested: bool,
    /// A restart handshake was sent to this container's process: it may refuse new writes for
    /// good, so it is restarted, never returned to Working. Kept when HAKeeper re-registers the
    /// CN under a new epoch (its record expired: same process), dropped only with the
    /// container.
    #[serde(default)]
    pub process_marked: bool,
    /// When the extension's `CancelDrain` was last sent (it counts only once the allocator
    /// reports the drain cancelled).
    #[serde(default)]
    pub cancel_sent_at: Option<Millis>,
    pub end: Option<DrainEnd>,
    /// What the drain waits on now (the condition shown to people).
    pub hold: Option<String>,
    pub alarmed: bool,
    /// Since when the evidence that lets a wedged hand-over be confirmed without the
    /// allocator has held (`wedge_evidence`).
    #[serde(default)]
    pub no_old_txns_since: Option<Millis>,
    /// Confirmed by every CN's own transaction list (and the marked CN's lock holders), the
    /// allocator's handshake having wedged.
    #[serde(default)]
    pub confirmed_by_txns: bool,
    /// Why a confirmed drain is not released now (its rollout is halted): the CN stays out of
    /// service, Draining, until that changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_held: Option<String>,
    /// The target of the rollout this restart drain was made for (None: not a rollout's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
}

/// Tunables of the arbiter.
#[derive(Clone, Copy, Debug)]
pub struct DrainTiming {
    /// The kernel's bind keepalive: a handshake answer is trusted only once it is this old.
    pub keepalive: Millis,
    /// An action not visibly applied after this is sent again (all are idempotent).
    pub resend_after: Millis,
    /// A webhook-started drain whose evictor stopped retrying this long is cancelled.
    pub eviction_abandon: Millis,
    /// A drain waiting longer than this raises an alarm (and keeps waiting).
    pub alarm_after: Millis,
    /// A hand-over the allocator has not confirmed this long after accepting it may be
    /// confirmed by every CN's transaction list instead (see [`Drain::hand_over`]).
    pub handover_wedge_after: Millis,
    /// How often a proxy reloads the CN list from HAKeeper (kernel `cluster.refresh-interval`,
    /// 5 s): until each has, new connections may still be routed to a CN just marked Draining.
    pub route_refresh: Millis,
    /// How long the lock allocator may keep the entry of a CN's previous process under the same
    /// UUID (v1.2.4 `lock_table_allocator.go` `checkInvalidBinds`: a silent service goes at the
    /// first `keepBindTimeout` round that finds it silent that long and its validation fails).
    /// Until then the allocator's answers for the UUID may come from either entry, at random
    /// (`getServiceBindsWithoutPrefix`), so the handshake waits for the container to be older.
    pub previous_instance_expiry: Millis,
}

impl Drain {
    pub fn new(pod: &str, uid: &str, uuid: &str, purpose: DrainPurpose, now: Millis) -> Drain {
        Drain {
            pod: pod.to_string(),
            pod_uid: uid.to_string(),
            cn_uuid: uuid.to_string(),
            start_epoch: None,
            instance: None,
            purpose,
            stage: DrainStage::MarkDraining,
            started_at: now,
            stage_since: now,
            kernel_drain_id: None,
            begin_drain_sent_at: None,
            begin_drain_acked_at: None,
            handshake_sent_at: None,
            handshake_acked_at: None,
            handshake_allocator: None,
            release_sent_at: None,
            last_eviction_at: Some(now),
            cancel_requested: false,
            process_marked: false,
            cancel_sent_at: None,
            end: None,
            hold: None,
            alarmed: false,
            no_old_txns_since: None,
            confirmed_by_txns: false,
            release_held: None,
            rollout: None,
        }
    }

    pub fn is_active(&self) -> bool {
        self.stage != DrainStage::Finished
    }

    /// The exact instance has confirmed it holds nothing: the pod may go.
    pub fn confirmed(&self) -> bool {
        matches!(self.stage, DrainStage::Confirmed | DrainStage::Released)
    }

    /// Forgets what was learned of an instance that is gone: the new one starts over.
    fn restart_on_new_instance(&mut self, now: Millis, why: String) {
        self.kernel_drain_id = None;
        self.begin_drain_sent_at = None;
        self.begin_drain_acked_at = None;
        self.handshake_sent_at = None;
        self.handshake_acked_at = None;
        self.handshake_allocator = None;
        self.no_old_txns_since = None;
        self.confirmed_by_txns = false;
        self.set_stage(DrainStage::MarkDraining, now);
        self.hold(why);
    }

    /// A withdrawal that cannot be honoured: the CN may refuse new writes, so instead of going
    /// back to work it finishes a drain and is restarted on its own version.
    fn restart_instead_of_cancel(&mut self, version: &str, now: Millis, why: String) {
        self.cancel_requested = false;
        self.purpose = DrainPurpose::Restart {
            version: version.to_string(),
        };
        if self.stage == DrainStage::Cancelling {
            self.set_stage(DrainStage::HandOver, now);
        }
        self.hold(why);
    }

    fn set_stage(&mut self, stage: DrainStage, now: Millis) {
        if self.stage != stage {
            self.stage = stage;
            self.stage_since = now;
        }
    }

    /// A newer drain owns the pod's current instance: this one (released, or its pod replaced
    /// by someone else) stops here rather than setting that instance back to Working under
    /// the newer drain.
    pub fn hand_off(&mut self, replaced: bool, now: Millis) {
        if self.stage == DrainStage::Released {
            self.finish(DrainEnd::Released, now);
        } else if replaced {
            self.finish(DrainEnd::InstanceGone, now);
        }
    }

    /// The CN's process is gone for good: its release can never start again in place (see
    /// `rollout::stranded_by_the_catalog`), so nothing is left to drain. Not after the
    /// release: that restart is already on its way.
    pub fn end_with_its_process(&mut self, now: Millis) {
        if self.stage < DrainStage::Released {
            self.finish(DrainEnd::InstanceGone, now);
        }
    }

    fn finish(&mut self, end: DrainEnd, now: Millis) {
        self.end = Some(end);
        self.hold = None;
        self.set_stage(DrainStage::Finished, now);
    }

    fn hold(&mut self, reason: impl Into<String>) {
        self.hold = Some(reason.into());
    }

    /// Takes the answers to actions this drain sent on the previous tick, seen at `now`.
    pub fn absorb(&mut self, results: &[ActionResult], now: Millis) {
        for r in results {
            match (&r.action, &r.result) {
                (Action::SetRestartService { uuid }, Ok(_))
                    if *uuid == self.cn_uuid && self.handshake_sent_at.is_some() =>
                {
                    self.handshake_acked_at = Some(now);
                }
                (Action::BeginDrain { uuid, start_epoch }, result)
                    if *uuid == self.cn_uuid && Some(*start_epoch) == self.start_epoch =>
                {
                    match result {
                        Ok(ActionOutput::DrainId { drain_id }) => {
                            if self.kernel_drain_id != Some(*drain_id) {
                                self.begin_drain_acked_at = Some(now);
                            }
                            self.kernel_drain_id = Some(*drain_id)
                        }
                        Ok(ActionOutput::Done) => {}
                        Err(e) => self.hold(format!("BeginDrain failed: {e}")),
                    }
                }
                (Action::SetRestartService { uuid }, Err(e)) if *uuid == self.cn_uuid => {
                    // A timeout may have been applied: the allocator's answers tell. Any other
                    // error was not: ask again on the next step.
                    if !matches!(e, ActionError::Timeout(_)) {
                        // Resent only while the allocator showed no mark: none reached it.
                        self.handshake_sent_at = None;
                        self.process_marked = false;
                    }
                    self.handshake_acked_at = None;
                    self.hold(format!("SetRestartService failed: {e}"));
                }
                (Action::SetCnWorkState { uuid, .. }, Err(e)) if *uuid == self.cn_uuid => {
                    self.hold(format!("marking Draining failed: {e}"));
                }
                (
                    Action::DeletePod { pod, uid, .. } | Action::RestartPod { pod, uid, .. },
                    Err(ActionError::Conflict(e)),
                ) if *pod == self.pod && *uid == self.pod_uid => {
                    self.hold(format!("release refused: {e}"));
                }
                _ => {}
            }
        }
    }

    /// One step from a fresh observation. Actions are appended; nothing is released unless
    /// this instance's confirmation is observed in this very observation.
    /// `may_start`: marking this CN Draining leaves another Working CN for the workload (the
    /// policy decides, seeing every drain); until then the drain waits before its first step.
    pub fn step(
        &mut self,
        obs: &Observation,
        timing: &DrainTiming,
        may_start: Gate,
        actions: &mut Vec<Action>,
    ) {
        self.step_with(obs, timing, may_start, Ok(()), actions);
    }

    /// Whether this drain has asked the kernel to hand its lock tables over (the request
    /// cannot be taken back).
    pub fn hand_over_requested(&self) -> bool {
        self.handshake_sent_at.is_some()
            || self.begin_drain_sent_at.is_some()
            || self.kernel_drain_id.is_some()
    }

    /// Requested and not yet confirmed: this CN's tables may still make lockers wait.
    pub fn handing_over(&self) -> bool {
        self.hand_over_requested()
            && self.stage > DrainStage::MarkDraining
            && self.stage < DrainStage::Confirmed
    }

    /// As [`Drain::step`], with `may_hand_over`: no other hand-over is under way whose
    /// transactions could wait on this CN's tables while this CN's wait on its tables (both
    /// owners refuse new lockers until their own transactions end: neither ever does).
    pub fn step_with(
        &mut self,
        obs: &Observation,
        timing: &DrainTiming,
        may_start: Gate,
        may_hand_over: Gate,
        actions: &mut Vec<Action>,
    ) {
        let now = obs.now;
        if self.stage == DrainStage::Finished {
            return;
        }
        // The pod: gone or replaced ends the drain of this instance.
        let Some(pod) = obs.pod(&self.pod).filter(|p| p.uid == self.pod_uid) else {
            let end = if self.stage == DrainStage::Released {
                DrainEnd::Released
            } else {
                DrainEnd::InstanceGone
            };
            // A CN this drain marked Draining comes back under its UUID with the mark kept
            // (HAKeeper keeps a quickly restarted CN's record): its new instance is returned
            // to Working. A removed CN does not come back.
            let marked = self.stage > DrainStage::MarkDraining;
            if marked && !matches!(self.purpose, DrainPurpose::Remove { .. }) {
                self.reopen(obs, actions, end);
            } else {
                self.finish(end, now);
            }
            return;
        };
        if self.stage == DrainStage::Released {
            self.hold(format!("waiting for {} to terminate", self.pod));
            if !pod.terminating && self.resend_due(self.release_sent_at, now, timing) {
                // The release was lost: send it again only if the confirmation still holds
                // on this observation; otherwise the drain goes back to work.
                match self.still_confirmed(obs) {
                    Ok(()) => self.release(now, actions),
                    Err(why) => {
                        self.set_stage(DrainStage::MarkDraining, now);
                        self.hold(format!(
                            "release not applied and no longer confirmed: {why}"
                        ));
                    }
                }
            }
            return;
        }
        if pod.phase == PodPhase::Failed {
            self.hold(format!(
                "{} is terminal (Failed): its process is gone, nothing is left to drain; the \
                 pod is deleted so that it is replaced, which ends this drain",
                self.pod
            ));
            return;
        }
        if let DrainPurpose::NodeFailure { node } = &self.purpose {
            let node = node.clone();
            self.hold(format!(
                "node {node} failed: {} is unreachable and cannot be drained or confirmed; \
                 nothing is done to it until Kubernetes replaces it",
                self.pod
            ));
            return;
        }
        // A terminating pod is drained all the same: its preStop hook keeps the process
        // running until this instance's drain is confirmed, and only the drain ends the wait.
        let deleted_elsewhere = pod.terminating;
        if !self.alarmed && now - self.started_at >= timing.alarm_after {
            self.alarmed = true;
        }
        let details = match obs.hakeeper.as_ref() {
            Ok(d) => d,
            Err(e) => {
                // The proxies cannot reload their CN lists either (a failed refresh keeps the
                // old one): the wait for every proxy to see the Draining mark starts over.
                if self.stage == DrainStage::MigrateSessions {
                    self.stage_since = now;
                }
                self.hold(format!(
                    "cannot read HAKeeper ({e}): {} stays protected",
                    self.pod
                ));
                return;
            }
        };
        let Some(record) = cn_record(details, &self.cn_uuid) else {
            self.hold(format!(
                "CN [{}] is not registered with HAKeeper: cannot bind the drain to an instance",
                self.cn_uuid
            ));
            return;
        };
        if record.heartbeat_age > obs.heartbeat_intervals.cn_fresh() {
            self.hold(format!(
                "HAKeeper's reading of {} is stale (last heartbeat {} ago)",
                self.pod, record.heartbeat_age
            ));
            return;
        }
        // The instance is Kubernetes' container; HAKeeper's record must have been heard from
        // that container (a quickly restarted CN keeps the old record and its UpTime).
        let instance = Instance::of(pod);
        let same_container = self.instance == Some(instance);
        match self.instance {
            None => self.instance = Some(instance),
            Some(old) if old != instance => {
                self.instance = Some(instance);
                self.start_epoch = Some(record.start_epoch);
                // A new container is a new process: no handshake reached it.
                self.process_marked = false;
                self.restart_on_new_instance(
                    now,
                    format!(
                        "instance mismatch: {}'s container restarted (restarts {} -> {}); draining the new instance",
                        self.pod, old.restarts, instance.restarts
                    ),
                );
            }
            Some(_) => {}
        }
        match self.start_epoch {
            None => self.start_epoch = Some(record.start_epoch),
            Some(epoch) if epoch != record.start_epoch => {
                // Same pod, new process: an old confirmation must not count for it.
                self.start_epoch = Some(record.start_epoch);
                // Unless the container did not restart: then HAKeeper re-created the record
                // (it expired while the CN could not reach HAKeeper; a new record has a new
                // UpTime), most likely for the process asked to hand over, which refuses new
                // writes for good. Such a process is never returned to service: drained again
                // and restarted.
                if same_container && self.hand_over_requested() {
                    self.process_marked = true;
                }
                self.restart_on_new_instance(
                    now,
                    format!(
                        "instance mismatch: {} restarted (epoch {epoch} -> {}); draining the new instance",
                        self.pod, record.start_epoch
                    ),
                );
            }
            Some(_) => {}
        }
        // A webhook-started drain whose evictor went away is withdrawn.
        if matches!(self.purpose, DrainPurpose::Evict { .. })
            && !deleted_elsewhere
            && self
                .last_eviction_at
                .is_none_or(|t| now - t >= timing.eviction_abandon)
        {
            self.cancel_requested = true;
        }
        // A requested hand-over cannot be taken back: the kernel has no cancel, and a CN once
        // marked refuses every new write transaction for good (measured on v1.2.4: 20635 "new
        // txn in CN rolling restart"). Such a CN finishes its drain and is restarted, never
        // returned to service.
        let irrevocable = (self.handshake_sent_at.is_some() && self.kernel_drain_id.is_none())
            || self.process_marked;
        if self.cancel_requested && irrevocable {
            let why = format!(
                "withdrawn after its hand-over was requested: {} refuses new writes for good, so it finishes the drain and is restarted",
                self.pod
            );
            self.restart_instead_of_cancel(&pod.version, now, why);
        }
        // A pod on its way out is never handed back to the workload.
        if self.cancel_requested && self.stage < DrainStage::Released && !deleted_elsewhere {
            self.set_stage(DrainStage::Cancelling, now);
        }
        if self.stage == DrainStage::Cancelling {
            if let Some(id) = self.kernel_drain_id {
                // The extension's drain is taken back only when the allocator says so. One it
                // no longer knows (the TN restarted) cannot be: the CN may still refuse new
                // writes, so it finishes a drain and is restarted, as on the stock kernel.
                match obs.lock_allocator.as_ref().map(|a| a.drains.get(&id)) {
                    Ok(Some(DrainAnswer::Cancelled)) => self.kernel_drain_id = None,
                    Ok(None) => {
                        self.kernel_drain_id = None;
                        self.begin_drain_sent_at = None;
                        let why = format!(
                            "withdrawn, but drain {id} is unknown to the lock allocator (the TN restarted): {} may refuse new writes, so it finishes a drain and is restarted",
                            self.pod
                        );
                        self.restart_instead_of_cancel(&pod.version, now, why);
                        return;
                    }
                    Ok(Some(_)) => {
                        if self.resend_due(self.cancel_sent_at, now, timing) {
                            actions.push(Action::CancelDrain { drain_id: id });
                            self.cancel_sent_at = Some(now);
                        }
                        self.hold(format!(
                            "withdrawn: waiting for the lock allocator to cancel drain {id}"
                        ));
                        return;
                    }
                    Err(e) => {
                        self.hold(format!(
                            "withdrawn: cannot ask the lock allocator ({e}); {} stays Draining",
                            self.pod
                        ));
                        return;
                    }
                }
            }
            if record.work_state == WorkState::Working {
                self.finish(DrainEnd::Cancelled, now);
            } else {
                actions.push(Action::SetCnWorkState {
                    uuid: self.cn_uuid.clone(),
                    state: WorkState::Working,
                });
                self.hold("cancelled: returning the CN to Working");
            }
            return;
        }
        // A Draining mark can be lost (HAKeeper expiry): go back and mark again.
        if self.stage > DrainStage::MarkDraining && record.work_state != WorkState::Draining {
            self.set_stage(DrainStage::MarkDraining, now);
        }
        if self.stage == DrainStage::MarkDraining {
            if record.work_state == WorkState::Draining {
                self.set_stage(DrainStage::MigrateSessions, now);
            } else if let Err(why) = may_start {
                self.hold(format!("not draining {} yet: {why}", self.pod));
                return;
            } else {
                actions.push(Action::SetCnWorkState {
                    uuid: self.cn_uuid.clone(),
                    state: WorkState::Draining,
                });
                self.hold(format!("marking {} Draining in HAKeeper", self.pod));
                return;
            }
        }
        // Sessions must stay gone until the release: new ones send it back to migrating.
        if matches!(self.stage, DrainStage::HandOver | DrainStage::Confirmed)
            && !matches!(obs.cn_activity.get(&self.pod), Some(Ok(a)) if a.sessions + a.pipelines + a.replicas == 0)
        {
            self.set_stage(DrainStage::MigrateSessions, now);
        }
        if self.stage == DrainStage::MigrateSessions {
            match obs.cn_activity.get(&self.pod) {
                // A proxy routes new connections from its cached CN list, reloaded every
                // `route_refresh`: a CN that looks empty before every proxy has seen it Draining
                // can still get a session, whose transactions the marked CN would refuse (20635).
                Some(Ok(a))
                    if a.sessions + a.pipelines + a.replicas == 0
                        && now - self.stage_since < timing.route_refresh =>
                {
                    self.hold(format!(
                        "{} is empty; waiting until every proxy has reloaded its CN list ({} of {})",
                        self.pod,
                        now - self.stage_since,
                        timing.route_refresh
                    ));
                    return;
                }
                Some(Ok(a)) if a.sessions + a.pipelines + a.replicas == 0 => {
                    self.set_stage(DrainStage::HandOver, now);
                }
                Some(Ok(a)) => {
                    self.hold(format!(
                        "{} sessions, {} pipelines, {} replicas still on {}",
                        a.sessions, a.pipelines, a.replicas, self.pod
                    ));
                    return;
                }
                Some(Err(e)) => {
                    self.hold(format!("cannot ask {}'s query service: {e}", self.pod));
                    return;
                }
                None => {
                    self.hold(format!("no query-service reading for {}", self.pod));
                    return;
                }
            }
        }
        if self.stage == DrainStage::HandOver {
            // The kernel's answers count only once they are this container's: HAKeeper's
            // record must have been heard from it (a quickly restarted CN keeps the old one).
            if let Err(why) = crate::gates::heard_since_start(obs, pod, record.heartbeat_age) {
                self.hold(format!(
                    "HAKeeper's record is not yet this instance's: {why}"
                ));
                return;
            }
            if !self.hand_over_requested()
                && let Err(why) = may_hand_over
            {
                self.hold(format!("{} waits to hand over: {why}", self.pod));
                return;
            }
            if !self.hand_over(obs, timing, actions) {
                return;
            }
        }
        if self.stage == DrainStage::Confirmed {
            // A confirmation may have been reached ticks ago: it must hold on this very
            // observation (the allocator may since have come to know a CN it did not know).
            if let Err(why) = self.still_confirmed(obs) {
                self.set_stage(DrainStage::MarkDraining, now);
                self.hold(format!(
                    "{}'s confirmation no longer holds: {why}; draining it again",
                    self.pod
                ));
                return;
            }
            match &self.purpose {
                DrainPurpose::Evict { source } => {
                    let source = source.clone();
                    self.hold(format!(
                        "confirmed: the eviction by {source} is allowed on its next try"
                    ));
                }
                _ if self.release_held.is_some() => {
                    let why = self.release_held.clone().unwrap_or_default();
                    self.hold(format!("confirmed, not restarted: {why}"));
                }
                _ => self.release(now, actions),
            }
        }
    }

    /// Returns true once this exact instance's confirmation is observed.
    fn hand_over(
        &mut self,
        obs: &Observation,
        timing: &DrainTiming,
        actions: &mut Vec<Action>,
    ) -> bool {
        let now = obs.now;
        let epoch = self.start_epoch.expect("bound before handing over");
        let allocator = match obs.lock_allocator.as_ref() {
            Ok(a) => a,
            Err(e) => {
                self.hold(format!("cannot ask the lock allocator: {e}"));
                return false;
            }
        };
        if allocator.drain_protocol {
            let Some(id) = self.kernel_drain_id else {
                if self.resend_due(self.begin_drain_sent_at, now, timing) {
                    actions.push(Action::BeginDrain {
                        uuid: self.cn_uuid.clone(),
                        start_epoch: epoch,
                    });
                    self.begin_drain_sent_at = Some(now);
                }
                if self
                    .hold
                    .as_deref()
                    .is_none_or(|h| !h.starts_with("BeginDrain failed"))
                {
                    self.hold(format!(
                        "waiting for BeginDrain({}, epoch {epoch})",
                        self.pod
                    ));
                }
                return false;
            };
            return match allocator.drains.get(&id) {
                Some(DrainAnswer::Done) => {
                    self.set_stage(DrainStage::Confirmed, now);
                    true
                }
                Some(DrainAnswer::Pending { remaining_txns }) => {
                    // The lock service behind the extension counts what the kernel counts,
                    // leaks included: the same evidence confirms a wedged hand-over.
                    let accepted = self.begin_drain_acked_at.unwrap_or(now);
                    let wedged = *remaining_txns > 0
                        && now - accepted >= timing.handover_wedge_after
                        && wedge_evidence(obs, &self.pod, accepted);
                    if self.wedge_confirmed(wedged, now, timing) {
                        return true;
                    }
                    let note = if wedged {
                        "; the hand-over looks wedged, and no live transaction holds its locks (confirming)"
                    } else {
                        ""
                    };
                    self.hold(format!(
                        "lock tables of {} handing over: {remaining_txns} transactions still hold locks{note}",
                        self.pod
                    ));
                    false
                }
                Some(DrainAnswer::InstanceGone) => {
                    self.hold(format!("drain {id}: the instance is gone; verifying"));
                    false
                }
                Some(DrainAnswer::Cancelled) | None => {
                    // Unknown id (the TN restarted) is not "done": begin again.
                    self.kernel_drain_id = None;
                    self.begin_drain_sent_at = None;
                    self.hold(format!(
                        "drain {id} unknown to the allocator: beginning again"
                    ));
                    false
                }
            };
        }
        // Today's handshake, plus operator-side instance checks. The allocator's answer names
        // no instance: only an answer given after our own request took effect counts.
        let Some(answer) = allocator.restarting.get(&self.cn_uuid).copied() else {
            self.hold(format!(
                "the lock allocator gave no answer for {} ({})",
                self.pod, self.cn_uuid
            ));
            return false;
        };
        let serving = AllocatorSeen::of(obs);
        if self.handshake_sent_at.is_some() && self.handshake_allocator.is_none() {
            // A record from before the allocator was recorded: the one serving now is taken
            // as the one asked.
            self.handshake_allocator = Some(serving.clone());
        }
        let other_allocator =
            self.handshake_sent_at.is_some() && self.handshake_allocator.as_ref() != Some(&serving);
        let first = self.handshake_sent_at.is_none() || other_allocator;
        if self.handshake_sent_at.is_none() {
            // With one UUID the allocator may hold the entry of the CN's previous process beside
            // this one's, and answer from either (v1.2.4 `getServiceBindsWithoutPrefix`): the
            // request waits until that entry must be gone. The configured wait is for v1.2's
            // allocator; one that keeps silent entries longer adds the difference.
            let expiry = timing.previous_instance_expiry + allocator_linger_beyond_v1_2(obs);
            let running_for = obs
                .pod(&self.pod)
                .and_then(|p| p.started_at)
                .map(|started| now - started);
            if running_for.is_none_or(|r| r < expiry) {
                self.hold(format!(
                    "{}'s container is younger than {expiry}: the lock allocator may still answer \
                     for its previous process; waiting before the restart handshake",
                    self.pod
                ));
                return false;
            }
        }
        // (false, −1) is an entry no request reached (or none that was answered yet). Any
        // other answer shows a request took effect, or that the allocator does not know the
        // CN (where a request is only logged). A request to an entry that can already restart
        // would wedge it for good (v1.2.4: `setRestartService` sets a disabled entry back to
        // waiting, and its keepalives are refused from then on), so none is sent then.
        let unmarked = !answer.can_restart && answer.remaining_txns < 0;
        let resend = !first && unmarked && self.resend_due(self.handshake_sent_at, now, timing);
        if (first || resend) && unmarked {
            actions.push(Action::SetRestartService {
                uuid: self.cn_uuid.clone(),
            });
            self.process_marked = true;
            self.handshake_sent_at = Some(now);
            self.handshake_acked_at = None;
            self.handshake_allocator = Some(serving);
            self.no_old_txns_since = None;
            self.hold(if other_allocator {
                format!(
                    "the TN restarted since the handshake for {}: its new lock allocator does not \
                     know it; handshake requested again",
                    self.pod
                )
            } else {
                format!("restart handshake requested for {}", self.pod)
            });
            return false;
        }
        if first {
            // Nothing to send: the answers count from now.
            self.handshake_sent_at = Some(now);
            self.handshake_acked_at = Some(now);
            self.handshake_allocator = Some(serving);
            self.no_old_txns_since = None;
        } else if self.handshake_acked_at.is_none() && !unmarked {
            // Our request's answer was lost, but the allocator shows it took effect.
            self.handshake_acked_at = Some(now);
        }
        let Some(acked) = self.handshake_acked_at else {
            self.hold(format!(
                "waiting for the allocator to accept the handshake for {}",
                self.pod
            ));
            return false;
        };
        if now - acked < timing.keepalive + timing.keepalive {
            self.hold(format!(
                "waiting for {}'s keepalive to see the handshake",
                self.pod
            ));
            return false;
        }
        if !answer.can_restart || answer.remaining_txns != 0 {
            // The kernel's handshake could wedge (v1.2.4, read from `handleRemoteUnlock`):
            // the CN forgets a transaction only when its unlock arrives with the current
            // bind, so the allocator may count one that ended, and every new transaction that
            // needs a table it referenced retries ("retry for CN rolling restart") for as
            // long as the CN runs. Once the hand-over has had its time, every CN's own
            // transaction list decides instead: after the mark, only a transaction created
            // before it can take a lock on this CN's tables (its snapshot is older than the
            // restart), so when no CN runs one any more, stopping this CN fails none.
            //
            // Or, the kernel having leaked the transactions it waits for (v1.2.4, measured on
            // a running kernel: background transactions that crossed a TN restart hold locks
            // in the marked CN's tables that no CN runs any more; their unlocks, sent with the
            // old binds, are refused, and nothing removes them): when every lock in this CN's
            // lock tables is held by a transaction no running CN runs, and this CN runs none
            // from before the mark, its stop takes no lock from a live transaction. A newer
            // transaction elsewhere that needs its tables is refused and retries, and goes on
            // once the binds move, as a lost owner's lockers do.
            let wedged = answer.remaining_txns > 0 && now - acked >= timing.handover_wedge_after;
            let old = old_transactions(obs, mark_settled(acked));
            if self.wedge_confirmed(wedged && wedge_evidence(obs, &self.pod, acked), now, timing) {
                return true;
            }
            let locks = match obs.cn_activity.get(&self.pod) {
                Some(Ok(a)) => a.locks,
                _ => None,
            };
            let wedge_note = match (wedged, old) {
                (false, _) => String::new(),
                (true, Ok(0)) => "; the hand-over looks wedged, and no CN runs a transaction \
                     from before it (confirming)"
                    .into(),
                (true, Ok(_)) if wedge_evidence(obs, &self.pod, acked) => format!(
                    "; the hand-over looks wedged, and every lock in {}'s lock tables is held \
                     by a transaction no CN runs (confirming)",
                    self.pod
                ),
                (true, Ok(n)) => format!(
                    "; the hand-over looks wedged, and {n} CNs run transactions from before it"
                ),
                (true, Err(pod)) => {
                    format!("; the hand-over looks wedged, and {pod}'s transactions cannot be read")
                }
            };
            let lock_note = match (wedged, locks) {
                (true, Some(n)) => format!(" ({n} locks in its lock tables held or awaited)"),
                _ => String::new(),
            };
            self.hold(format!(
                "{} is handing its lock tables over: {} transactions remain{wedge_note}{lock_note}",
                self.pod, answer.remaining_txns
            ));
            return false;
        }
        // The allocator's answer may come from an older process's entry of the same UUID (it
        // keeps one until a validation of that process fails, and answers from either): the
        // CN's own lock service must agree that nothing live depends on it.
        if let Err(why) = own_evidence(obs, &self.pod, acked) {
            self.no_old_txns_since = None;
            self.hold(format!(
                "the lock allocator confirms {}'s hand-over; waiting for its own lock service to agree: {why}",
                self.pod
            ));
            return false;
        }
        self.no_old_txns_since = None;
        self.set_stage(DrainStage::Confirmed, now);
        true
    }

    /// A wedged hand-over is confirmed once its evidence has held for two keepalives in a row.
    fn wedge_confirmed(&mut self, evidence: bool, now: Millis, timing: &DrainTiming) -> bool {
        if evidence {
            self.no_old_txns_since.get_or_insert(now);
        } else {
            self.no_old_txns_since = None;
        }
        if self
            .no_old_txns_since
            .is_some_and(|t| now - t >= timing.keepalive + timing.keepalive)
        {
            self.confirmed_by_txns = true;
            self.set_stage(DrainStage::Confirmed, now);
            return true;
        }
        false
    }

    /// The pod came back (restart, or recreated after an eviction) with the same UUID: its
    /// HAKeeper record still says Draining. Only a new, fresh instance is set Working. The new
    /// instance is Kubernetes' (a new pod whose container HAKeeper has heard from): HAKeeper
    /// keeps a quickly restarted CN's record, UpTime and Draining mark included.
    fn reopen(&mut self, obs: &Observation, actions: &mut Vec<Action>, end: DrainEnd) {
        let now = obs.now;
        let new_pod = obs
            .pod(&self.pod)
            .filter(|p| p.uid != self.pod_uid && !p.terminating && p.ready);
        let record = obs
            .hakeeper
            .as_ref()
            .ok()
            .and_then(|d| cn_record(d, &self.cn_uuid))
            .filter(|r| r.heartbeat_age <= obs.heartbeat_intervals.cn_fresh())
            .filter(|r| {
                new_pod.is_some_and(|p| {
                    crate::gates::heard_since_start(obs, p, r.heartbeat_age).is_ok()
                })
            });
        match (new_pod, record) {
            (Some(_), Some(r)) if r.work_state == WorkState::Draining => {
                actions.push(Action::SetCnWorkState {
                    uuid: self.cn_uuid.clone(),
                    state: WorkState::Working,
                });
                self.hold(format!(
                    "returning the new instance of {} to Working",
                    self.pod
                ));
            }
            (Some(_), Some(_)) => self.finish(end, now),
            _ => self.hold(format!(
                "waiting for the new instance of {} to register",
                self.pod
            )),
        }
    }

    /// Re-checks, on one fresh observation, everything a release relies on: the same
    /// instance, fresh, Draining, idle, and its hand-over confirmed.
    pub fn still_confirmed(&self, obs: &Observation) -> Gate {
        let pod = obs
            .pod(&self.pod)
            .filter(|p| p.uid == self.pod_uid)
            .ok_or_else(|| format!("{} was replaced", self.pod))?;
        if self.instance.is_some_and(|i| i != Instance::of(pod)) {
            return Err(format!("{}'s container restarted", self.pod));
        }
        // Terminating is no reason to doubt: the preStop hook holds the process (same UID,
        // same epoch) until the release.
        let details = obs
            .hakeeper
            .as_ref()
            .map_err(|e| format!("cannot read HAKeeper: {e}"))?;
        let record = cn_record(details, &self.cn_uuid)
            .ok_or_else(|| format!("CN [{}] is not registered", self.cn_uuid))?;
        if Some(record.start_epoch) != self.start_epoch {
            return Err("instance mismatch".into());
        }
        if record.heartbeat_age > obs.heartbeat_intervals.cn_fresh() {
            return Err("stale HAKeeper reading".into());
        }
        crate::gates::heard_since_start(obs, pod, record.heartbeat_age)?;
        if record.work_state != WorkState::Draining {
            return Err(format!("work state {:?}", record.work_state));
        }
        match obs.cn_activity.get(&self.pod) {
            Some(Ok(a)) if a.sessions + a.pipelines + a.replicas == 0 => {}
            _ => return Err(format!("{} is not idle", self.pod)),
        }
        let allocator = obs
            .lock_allocator
            .as_ref()
            .map_err(|e| format!("cannot ask the lock allocator: {e}"))?;
        if self.kernel_drain_id.is_none()
            && self
                .handshake_allocator
                .as_ref()
                .is_some_and(|a| *a != AllocatorSeen::of(obs))
        {
            return Err("the TN restarted since the handshake".into());
        }
        let done = allocator
            .drains
            .get(&self.kernel_drain_id.unwrap_or(u64::MAX));
        let allocator_confirms = allocator
            .restarting
            .get(&self.cn_uuid)
            .is_some_and(|a| a.can_restart && a.remaining_txns == 0);
        let handed_over = match (self.kernel_drain_id, self.handshake_acked_at) {
            // A wedge confirmed from the transaction lists, or the drain done since.
            (Some(_), _) if self.confirmed_by_txns => {
                done == Some(&DrainAnswer::Done)
                    || matches!(done, Some(DrainAnswer::Pending { .. }))
                        && self
                            .begin_drain_acked_at
                            .is_some_and(|acked| wedge_evidence(obs, &self.pod, acked))
            }
            (Some(_), _) => done == Some(&DrainAnswer::Done),
            (None, Some(acked)) if self.confirmed_by_txns => {
                wedge_evidence(obs, &self.pod, acked)
                    || allocator_confirms && own_evidence(obs, &self.pod, acked).is_ok()
            }
            (None, Some(acked)) => {
                allocator_confirms && own_evidence(obs, &self.pod, acked).is_ok()
            }
            (None, None) => false,
        };
        if handed_over {
            Ok(())
        } else {
            Err("the allocator no longer confirms the hand-over".into())
        }
    }

    fn resend_due(&self, sent: Option<Millis>, now: Millis, timing: &DrainTiming) -> bool {
        sent.is_none_or(|t| now - t >= timing.resend_after)
    }

    fn release(&mut self, now: Millis, actions: &mut Vec<Action>) {
        let action = match &self.purpose {
            DrainPurpose::Remove { why } => Action::DeletePod {
                pod: self.pod.clone(),
                uid: self.pod_uid.clone(),
                reason: format!("{why}: drain confirmed for this instance"),
            },
            DrainPurpose::Restart { version } => Action::RestartPod {
                pod: self.pod.clone(),
                uid: self.pod_uid.clone(),
                version: version.clone(),
            },
            DrainPurpose::Evict { .. } | DrainPurpose::NodeFailure { .. } => return,
        };
        actions.push(action);
        self.release_sent_at = Some(now);
        self.set_stage(DrainStage::Released, now);
        self.hold = None;
    }
}

/// How much longer than v1.2's the cluster's lock allocator keeps a silent CN entry: the
/// allocator runs in the TN, so its release decides (the most of every TN pod's, in the
/// middle of a rollout; the most any generation adds when no TN pod is seen).
fn allocator_linger_beyond_v1_2(obs: &Observation) -> Millis {
    obs.pods_of(Component::Tn)
        .map(|p| generation::allocator_linger_beyond_v1_2(&p.version))
        .max()
        .unwrap_or_else(|| generation::allocator_linger_beyond_v1_2(""))
}

/// When every CN has surely learnt of a restart mark the allocator accepted at `acked`: the
/// marked CN sets its restart time at its next bind keepalive (1 s in the kernel's default
/// configuration), and the CNs' wall clocks may differ from ours by up to a second more.
fn mark_settled(acked: Millis) -> Millis {
    acked + Millis::from_secs(3)
}

/// Whether a wedged hand-over may be confirmed without the allocator: either no running CN
/// runs a transaction from before the mark, or every lock in `pod`'s own lock tables is held
/// by a transaction no running CN runs and `pod` runs none from before it. Every running CN's
/// transaction list must have been read (not read is never "none").
fn wedge_evidence(obs: &Observation, pod: &str, acked: Millis) -> bool {
    match old_transactions(obs, mark_settled(acked)) {
        Ok(0) => true,
        Err(_) => false,
        Ok(_) => own_evidence(obs, pod, acked).is_ok(),
    }
}

/// What the marked CN itself shows (its GetLockInfo against every running CN's GetTxnInfo,
/// and its own GetTxnInfo): no live transaction holds a lock in its lock tables, and it runs
/// no transaction from before the mark settled. Not read is never "nothing".
fn own_evidence(obs: &Observation, pod: &str, acked: Millis) -> Gate {
    let boundary = mark_settled(acked);
    let activity = match obs.cn_activity.get(pod) {
        Some(Ok(a)) => a,
        Some(Err(e)) => return Err(format!("its query service: {e}")),
        None => return Err("its query service was not read".into()),
    };
    match activity.live_lock_holders {
        Some(0) => {}
        Some(n) => {
            return Err(format!(
                "{n} live transactions hold locks in its lock tables"
            ));
        }
        None => return Err("its locks, or a running CN's transactions, were not read".into()),
    }
    match activity.oldest_txn {
        OldestTxn::NoneRunning => Ok(()),
        OldestTxn::CreatedAt(created) if created >= boundary => Ok(()),
        OldestTxn::CreatedAt(_) => Err("it runs a transaction from before the mark".into()),
        OldestTxn::NotRead => Err("its transactions were not read".into()),
    }
}

/// How many running CNs run a transaction created before `boundary`; the first CN whose
/// transaction list was not read is the error (not read is never "none").
fn old_transactions(obs: &Observation, boundary: Millis) -> Result<u32, String> {
    let mut old = 0;
    for pod in obs
        .pods
        .iter()
        .filter(|p| p.component == Component::Cn && p.phase == PodPhase::Running)
    {
        match obs.cn_activity.get(&pod.name) {
            Some(Ok(CnActivity {
                oldest_txn: OldestTxn::NoneRunning,
                ..
            })) => {}
            Some(Ok(CnActivity {
                oldest_txn: OldestTxn::CreatedAt(created),
                ..
            })) => {
                if *created < boundary {
                    old += 1;
                }
            }
            _ => return Err(pod.name.clone()),
        }
    }
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::Component;
    use crate::observe::*;
    use std::collections::BTreeMap;

    const TIMING: DrainTiming = DrainTiming {
        keepalive: Millis(1_000),
        resend_after: Millis(5_000),
        eviction_abandon: Millis(120_000),
        alarm_after: Millis(600_000),
        handover_wedge_after: Millis(10_000),
        // Most tests are about the hand-over; the wait for the proxies has its own test.
        route_refresh: Millis(0),
        previous_instance_expiry: Millis(0),
    };

    fn obs(now: u64) -> Observation {
        let pod = PodObservation {
            name: "cn-1".into(),
            uid: "uid-1".into(),
            component: Component::Cn,
            node: "node-1".into(),
            phase: PodPhase::Running,
            ready: true,
            version: "v1".into(),
            terminating: false,
            restarts: 0,
            started_at: Some(Millis(0)),
            cn_uuid: Some("u1".into()),
            pool_phase: None,
            serving: true,
        };
        // The TN, whose lock allocator keeps a silent entry as long as v1.2's does.
        let tn = PodObservation {
            name: "tn-0".into(),
            uid: "uid-tn".into(),
            component: Component::Tn,
            version: "v1.2.4".into(),
            cn_uuid: None,
            ..pod.clone()
        };
        Observation {
            now: Millis(now),
            pods: vec![pod, tn],
            hakeeper: Ok(ClusterDetails {
                cns: vec![CnStoreView {
                    uuid: "u1".into(),
                    start_epoch: 7,
                    work_state: WorkState::Working,
                    heartbeat_age: Millis(200),
                    version: "v1".into(),
                }],
                tns: vec![],
                log_shards: vec![],
            }),
            lock_allocator: Ok(AllocatorView::default()),
            cn_activity: BTreeMap::from([("cn-1".to_string(), Ok(CnActivity::default()))]),
            proxy_routes: BTreeMap::new(),
            proxy_connections: BTreeMap::new(),
            node_images: BTreeMap::new(),
            unschedulable_nodes: vec![],
            not_ready_nodes: vec![],
            tn_wal_tolerance: None,
            heartbeat_intervals: HeartbeatIntervals::default(),
            desired: DesiredState::default(),
        }
    }

    fn remove() -> Drain {
        Drain::new(
            "cn-1",
            "uid-1",
            "u1",
            DrainPurpose::Remove {
                why: "scale-in".into(),
            },
            Millis(0),
        )
    }

    /// HAKeeper shows the CN Draining; the allocator, asked for it as for every draining CN,
    /// has an entry no request reached: (false, −1).
    fn draining(o: &mut Observation) {
        o.hakeeper.as_mut().unwrap().cns[0].work_state = WorkState::Draining;
        unmarked(o);
    }

    fn unmarked(o: &mut Observation) {
        o.lock_allocator.as_mut().unwrap().restarting.insert(
            "u1".into(),
            RestartAnswer {
                can_restart: false,
                remaining_txns: -1,
            },
        );
    }

    /// The allocator answers "can restart, 0", and the CN's own lock service agrees (no live
    /// holder of its locks, no transaction of its own running).
    fn confirm(o: &mut Observation) {
        o.lock_allocator.as_mut().unwrap().restarting.insert(
            "u1".into(),
            RestartAnswer {
                can_restart: true,
                remaining_txns: 0,
            },
        );
        if let Some(Ok(a)) = o.cn_activity.get_mut("cn-1") {
            a.locks = Some(0);
            a.live_lock_holders = Some(0);
            a.oldest_txn = OldestTxn::NoneRunning;
        }
    }

    /// Drives a drain to the point where it has sent the handshake.
    fn to_handover(d: &mut Drain) -> Vec<Action> {
        let mut a = vec![];
        let mut o = obs(1_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(
            a[0],
            Action::SetCnWorkState {
                state: WorkState::Draining,
                ..
            }
        ));
        draining(&mut o);
        o.now = Millis(2_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert_eq!(a, vec![Action::SetRestartService { uuid: "u1".into() }]);
        d.absorb(
            &[ActionResult {
                action: a[0].clone(),
                result: Ok(ActionOutput::Done),
            }],
            Millis(3_000),
        );
        a
    }

    fn tn(o: &mut Observation, uid: &str, restarts: u32) {
        o.pods.retain(|p| p.component != Component::Tn);
        o.pods.push(PodObservation {
            name: "tn-0".into(),
            uid: uid.into(),
            component: Component::Tn,
            node: "node-2".into(),
            phase: PodPhase::Running,
            ready: true,
            version: "v1.2.4".into(),
            terminating: false,
            restarts,
            started_at: Some(Millis(100 + u64::from(restarts))),
            cn_uuid: None,
            pool_phase: None,
            serving: true,
        });
    }

    /// A new lock allocator (the TN restarted) knows nothing of the handshake the old one
    /// accepted: it is asked again while it shows no mark, and its answers count only from
    /// then. One that does not know the CN answers (true, 0), where a request would only be
    /// logged: that answer counts from when it was first seen, after the keepalives.
    #[test]
    fn a_new_lock_allocator_is_asked_again_before_its_answer_counts() {
        let mut d = remove();
        let mut a = vec![];
        let mut o = obs(1_000);
        tn(&mut o, "tn-uid-1", 0);
        d.step(&o, &TIMING, Ok(()), &mut a);
        draining(&mut o);
        o.now = Millis(2_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert_eq!(a, vec![Action::SetRestartService { uuid: "u1".into() }]);
        d.absorb(
            &[ActionResult {
                action: a[0].clone(),
                result: Ok(ActionOutput::Done),
            }],
            Millis(3_000),
        );
        // Pod replaced and container restarted in place: each is a new allocator, where the
        // CN registered again (an entry no request reached).
        for (uid, restarts) in [("tn-uid-2", 0), ("tn-uid-2", 1)] {
            tn(&mut o, uid, restarts);
            unmarked(&mut o);
            o.now += Millis(5_000);
            a.clear();
            d.step(&o, &TIMING, Ok(()), &mut a);
            assert_eq!(
                a,
                vec![Action::SetRestartService { uuid: "u1".into() }],
                "asked again after the TN became {uid}/{restarts}"
            );
            assert!(!d.confirmed());
            assert!(d.hold.as_deref().unwrap().contains("TN restarted"));
            d.absorb(
                &[ActionResult {
                    action: a[0].clone(),
                    result: Ok(ActionOutput::Done),
                }],
                o.now,
            );
        }
        // The allocator that accepted the request confirms, after its keepalives.
        confirm(&mut o);
        o.now += Millis(2_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(&a[..], [Action::DeletePod { uid, .. }] if uid == "uid-1"));

        // Another drain, and a TN restart whose new allocator never heard of the CN.
        let mut d = remove();
        let mut o = obs(1_000);
        tn(&mut o, "tn-uid-1", 0);
        d.step(&o, &TIMING, Ok(()), &mut vec![]);
        draining(&mut o);
        o.now = Millis(2_000);
        d.step(&o, &TIMING, Ok(()), &mut vec![]);
        tn(&mut o, "tn-uid-2", 0);
        confirm(&mut o);
        o.now = Millis(5_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(a.is_empty(), "a request would only be logged: {a:?}");
        assert!(!d.confirmed(), "not before the keepalives");
        o.now = Millis(7_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(&a[..], [Action::DeletePod { uid, .. }] if uid == "uid-1"));
    }

    /// A confirmation held for a lost release does not survive a TN restart either.
    #[test]
    fn a_release_is_not_sent_again_on_a_new_allocators_answer() {
        let mut d = remove();
        let mut o = obs(1_000);
        tn(&mut o, "tn-uid-1", 0);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        draining(&mut o);
        o.now = Millis(2_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        d.absorb(
            &[ActionResult {
                action: a[0].clone(),
                result: Ok(ActionOutput::Done),
            }],
            Millis(3_000),
        );
        confirm(&mut o);
        o.now = Millis(5_000);
        assert_eq!(d.still_confirmed(&o), Ok(()));
        tn(&mut o, "tn-uid-2", 0);
        assert!(d.still_confirmed(&o).unwrap_err().contains("TN restarted"));
    }

    /// A drain recorded before the allocator was recorded adopts the serving one and does not
    /// ask it again (a second request wedges a finished entry on the kernel).
    #[test]
    fn a_record_without_the_allocator_is_not_asked_again() {
        let mut d = remove();
        to_handover(&mut d);
        d.handshake_allocator = None;
        let mut o = obs(5_000);
        tn(&mut o, "tn-uid-1", 0);
        draining(&mut o);
        confirm(&mut o);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(&a[..], [Action::DeletePod { .. }]), "{a:?}");
    }

    #[test]
    fn happy_path_releases_only_after_this_instance_confirms() {
        let mut d = remove();
        to_handover(&mut d);
        let mut o = obs(5_000);
        draining(&mut o);
        confirm(&mut o);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(&a[..], [Action::DeletePod { uid, .. }] if uid == "uid-1"));
        assert_eq!(d.stage, DrainStage::Released);
        // The pod goes away: the drain ends as released.
        o.pods.clear();
        d.step(&o, &TIMING, Ok(()), &mut vec![]);
        assert_eq!(d.end, Some(DrainEnd::Released));
    }

    /// An empty CN is not asked to hand over until every proxy has reloaded its CN list since
    /// the CN was marked Draining: a connection routed from a stale list would land on it.
    #[test]
    fn the_handshake_waits_until_every_proxy_has_seen_the_draining_mark() {
        let timing = DrainTiming {
            route_refresh: Millis(5_000),
            previous_instance_expiry: Millis(0),
            ..TIMING
        };
        let mut d = remove();
        let mut o = obs(1_000);
        d.step(&o, &timing, Ok(()), &mut vec![]);
        draining(&mut o);
        for now in [2_000, 4_000, 6_999] {
            o.now = Millis(now);
            let mut a = vec![];
            d.step(&o, &timing, Ok(()), &mut a);
            assert!(a.is_empty(), "at {now} ms: {a:?}");
            assert_eq!(d.stage, DrainStage::MigrateSessions);
        }
        o.now = Millis(7_000);
        let mut a = vec![];
        d.step(&o, &timing, Ok(()), &mut a);
        assert_eq!(a, vec![Action::SetRestartService { uuid: "u1".into() }]);
    }

    /// While HAKeeper cannot be read the proxies cannot reload their CN lists either (a failed
    /// refresh keeps the old list): the wait for them starts over once it is back. Found by
    /// `campaign --seeds 10000` (seed 6851): an outage inside the wait let new sessions,
    /// reconnecting through a proxy that had not seen the mark, fail with 20635.
    #[test]
    fn the_wait_for_the_proxies_starts_over_after_hakeeper_was_unreadable() {
        let timing = DrainTiming {
            route_refresh: Millis(5_000),
            previous_instance_expiry: Millis(0),
            ..TIMING
        };
        let mut d = remove();
        let mut o = obs(1_000);
        d.step(&o, &timing, Ok(()), &mut vec![]);
        draining(&mut o);
        o.now = Millis(2_000);
        d.step(&o, &timing, Ok(()), &mut vec![]);
        assert_eq!(d.stage, DrainStage::MigrateSessions);
        let mut down = o.clone();
        down.now = Millis(4_000);
        down.hakeeper = Err(ObservationError::Unavailable("no leader".into()));
        d.step(&down, &timing, Ok(()), &mut vec![]);
        for now in [7_000, 8_999] {
            o.now = Millis(now);
            let mut a = vec![];
            d.step(&o, &timing, Ok(()), &mut a);
            assert!(a.is_empty(), "at {now} ms: {a:?}");
        }
        o.now = Millis(9_000);
        let mut a = vec![];
        d.step(&o, &timing, Ok(()), &mut a);
        assert_eq!(a, vec![Action::SetRestartService { uuid: "u1".into() }]);
    }

    /// Every uncertain reading holds; none releases.
    #[test]
    fn uncertainty_never_releases() {
        type Spoil = Box<dyn Fn(&mut Observation, u64)>;
        let uncertain: Vec<(&str, Spoil)> = vec![
            (
                "hakeeper unavailable",
                Box::new(|o, _| o.hakeeper = Err(ObservationError::Unavailable("x".into()))),
            ),
            (
                "hakeeper timeout",
                Box::new(|o, _| o.hakeeper = Err(ObservationError::Timeout("x".into()))),
            ),
            (
                "cn does not exist",
                Box::new(|o, _| o.hakeeper.as_mut().unwrap().cns.clear()),
            ),
            (
                "stale heartbeat",
                Box::new(|o, _| o.hakeeper.as_mut().unwrap().cns[0].heartbeat_age = Millis(60_000)),
            ),
            // The instance keeps changing under the drain: no confirmation is ever its own.
            (
                "instance mismatch",
                Box::new(|o, t| o.hakeeper.as_mut().unwrap().cns[0].start_epoch = 8 + t),
            ),
            (
                "allocator down",
                Box::new(|o, _| o.lock_allocator = Err(ObservationError::Unavailable("tn".into()))),
            ),
            (
                "handshake not done",
                Box::new(|o, _| {
                    o.lock_allocator
                        .as_mut()
                        .unwrap()
                        .restarting
                        .get_mut("u1")
                        .unwrap()
                        .can_restart = false;
                }),
            ),
            (
                "txns remain",
                Box::new(|o, _| {
                    o.lock_allocator
                        .as_mut()
                        .unwrap()
                        .restarting
                        .get_mut("u1")
                        .unwrap()
                        .remaining_txns = 2;
                    // ... and the CN's own lock service shows them live.
                    if let Some(Ok(a)) = o.cn_activity.get_mut("cn-1") {
                        a.live_lock_holders = Some(2);
                        a.oldest_txn = OldestTxn::CreatedAt(Millis(0));
                    }
                }),
            ),
            (
                "inconsistent allocator",
                Box::new(|o, _| {
                    o.lock_allocator
                        .as_mut()
                        .unwrap()
                        .restarting
                        .get_mut("u1")
                        .unwrap()
                        .remaining_txns = -1;
                }),
            ),
            (
                "handshake forgotten",
                Box::new(|o, _| {
                    o.lock_allocator.as_mut().unwrap().restarting.clear();
                }),
            ),
            (
                "sessions back",
                Box::new(|o, _| {
                    o.cn_activity.insert(
                        "cn-1".into(),
                        Ok(CnActivity {
                            sessions: 1,
                            pipelines: 0,
                            replicas: 0,
                            locks: None,
                            oldest_txn: OldestTxn::NotRead,
                            live_lock_holders: None,
                        }),
                    );
                }),
            ),
            (
                "query service error",
                Box::new(|o, _| {
                    o.cn_activity.insert(
                        "cn-1".into(),
                        Err(ObservationError::DoesNotExist("cn".into())),
                    );
                }),
            ),
            (
                "draining mark lost",
                Box::new(|o, _| {
                    o.hakeeper.as_mut().unwrap().cns[0].work_state = WorkState::Working
                }),
            ),
        ];
        for (name, spoil) in uncertain {
            let mut d = remove();
            to_handover(&mut d);
            let mut o = obs(5_000);
            draining(&mut o);
            confirm(&mut o);
            // However long it lasts: hours of ticks, nothing is deleted.
            for t in 0..100u64 {
                spoil(&mut o, t);
                o.now = Millis(5_000 + t * 60_000);
                let mut a = vec![];
                d.step(&o, &TIMING, Ok(()), &mut a);
                assert!(
                    !a.iter()
                        .any(|x| matches!(x, Action::DeletePod { .. } | Action::RestartPod { .. })),
                    "{name}: released on {a:?}"
                );
                assert!(!d.confirmed(), "{name}: confirmed");
            }
            assert!(d.hold.is_some(), "{name}: holds without saying why");
        }
    }

    #[test]
    fn the_wait_for_the_previous_entry_follows_the_allocators_generation() {
        // The allocator runs in the TN: from v4.0 it keeps a silent entry twice as long
        // (`keepBindGraceFactor`), so the handshake of a restarted CN waits 10 s more; with
        // no TN seen, as long as the longest-keeping generation. The CN restarted at 5 s.
        let timing = DrainTiming {
            previous_instance_expiry: Millis(30_000),
            ..TIMING
        };
        let cases = [
            (Some("v1.2.4"), 35_000),
            (Some("v3.0.15"), 35_000),
            (Some("v4.0.0-rc2"), 45_000),
            (Some("a1b2c3d"), 45_000),
            (None, 45_000),
        ];
        for (tn, sent_at) in cases {
            let mut d = remove();
            let mut o = obs(10_000);
            match tn {
                Some(version) => o.pods[1].version = version.into(),
                None => o.pods.truncate(1),
            }
            o.pods[0].restarts = 1;
            o.pods[0].started_at = Some(Millis(5_000));
            d.step(&o, &timing, Ok(()), &mut vec![]);
            draining(&mut o);
            for t in [sent_at - 1, sent_at] {
                o.now = Millis(t);
                let mut a = vec![];
                d.step(&o, &timing, Ok(()), &mut a);
                let sent = a
                    .iter()
                    .any(|x| matches!(x, Action::SetRestartService { .. }));
                assert_eq!(sent, t == sent_at, "TN {tn:?} at {t}: {:?}", d.hold);
            }
        }
    }

    #[test]
    fn a_restarted_instance_does_not_inherit_the_old_confirmation() {
        let timing = DrainTiming {
            previous_instance_expiry: Millis(30_000),
            ..TIMING
        };
        let mut d = remove();
        to_handover(&mut d);
        let mut o = obs(5_000);
        draining(&mut o);
        confirm(&mut o);
        // The CN restarted (same pod UID, same UUID, new start epoch and container) and the
        // allocator still answers "can restart" for the UUID, from the old process's entry.
        o.hakeeper.as_mut().unwrap().cns[0].start_epoch = 8;
        o.pods[0].restarts = 1;
        o.pods[0].started_at = Some(Millis(4_500));
        o.hakeeper.as_mut().unwrap().cns[0].heartbeat_age = Millis(100);
        let mut a = vec![];
        for t in [5_000, 10_000, 30_000] {
            o.now = Millis(t);
            d.step(&o, &timing, Ok(()), &mut a);
            assert!(
                !a.iter().any(|x| matches!(
                    x,
                    Action::DeletePod { .. } | Action::SetRestartService { .. }
                )),
                "at {t}: {a:?}"
            );
        }
        assert_eq!(d.start_epoch, Some(8));
        // The old entry is gone: the handshake starts again for the new instance.
        unmarked(&mut o);
        o.now = Millis(35_000);
        d.step(&o, &timing, Ok(()), &mut a);
        assert_eq!(a, vec![Action::SetRestartService { uuid: "u1".into() }]);
        let ack = ActionResult {
            action: Action::SetRestartService { uuid: "u1".into() },
            result: Ok(ActionOutput::Done),
        };
        d.absorb(std::slice::from_ref(&ack), Millis(36_000));
        for t in 36..40 {
            o.now = Millis(t * 1_000);
            a.clear();
            d.step(&o, &timing, Ok(()), &mut a);
            assert!(!a.iter().any(|x| matches!(x, Action::DeletePod { .. })));
        }
        // Only the new instance's own confirmation releases it.
        confirm(&mut o);
        o.now = Millis(40_000);
        d.step(&o, &timing, Ok(()), &mut a);
        assert!(a.iter().any(|x| matches!(x, Action::DeletePod { .. })));
    }

    #[test]
    fn kernel_protocol_confirms_by_drain_id_and_unknown_ids_begin_again() {
        let mut d = remove();
        let mut o = obs(2_000);
        o.lock_allocator.as_mut().unwrap().drain_protocol = true;
        draining(&mut o);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert_eq!(
            a,
            vec![Action::BeginDrain {
                uuid: "u1".into(),
                start_epoch: 7
            }]
        );
        d.absorb(
            &[ActionResult {
                action: a[0].clone(),
                result: Ok(ActionOutput::DrainId { drain_id: 42 }),
            }],
            Millis(1_000),
        );
        // The allocator forgot the id (TN restart): not done, begin again.
        o.now = Millis(2_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(a.is_empty() && d.kernel_drain_id.is_none());
        o.now = Millis(3_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(a[0], Action::BeginDrain { .. }));
        d.absorb(
            &[ActionResult {
                action: a[0].clone(),
                result: Ok(ActionOutput::DrainId { drain_id: 43 }),
            }],
            Millis(3_000),
        );
        o.lock_allocator
            .as_mut()
            .unwrap()
            .drains
            .insert(43, DrainAnswer::Pending { remaining_txns: 3 });
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(a.is_empty());
        o.lock_allocator
            .as_mut()
            .unwrap()
            .drains
            .insert(43, DrainAnswer::Done);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(&a[..], [Action::DeletePod { .. }]));
    }

    /// Found by the campaign (seed 7455 of 10000): an evictor gave up after the extension's
    /// drain began; the TN restarted (the allocator forgot the drain id, the CN still refused
    /// new writes), and the CN was set Working after a `CancelDrain` that failed.
    #[test]
    fn a_withdrawn_extension_drain_returns_to_work_only_once_the_allocator_cancelled_it() {
        let evict = || {
            Drain::new(
                "cn-1",
                "uid-1",
                "u1",
                DrainPurpose::Evict {
                    source: "cluster-autoscaler".into(),
                },
                Millis(0),
            )
        };
        let working = |a: &[Action]| {
            a.iter().any(|x| {
                matches!(
                    x,
                    Action::SetCnWorkState {
                        state: WorkState::Working,
                        ..
                    }
                )
            })
        };
        for allocator_forgot in [false, true] {
            let mut d = evict();
            let mut o = obs(2_000);
            o.lock_allocator.as_mut().unwrap().drain_protocol = true;
            draining(&mut o);
            let mut a = vec![];
            d.step(&o, &TIMING, Ok(()), &mut a);
            d.absorb(
                &[ActionResult {
                    action: a[0].clone(),
                    result: Ok(ActionOutput::DrainId { drain_id: 42 }),
                }],
                Millis(2_000),
            );
            let drains = &mut o.lock_allocator.as_mut().unwrap().drains;
            drains.insert(42, DrainAnswer::Pending { remaining_txns: 2 });
            // The evictor went away long ago.
            o.now = Millis(200_000);
            a.clear();
            d.step(&o, &TIMING, Ok(()), &mut a);
            assert!(a.contains(&Action::CancelDrain { drain_id: 42 }), "{a:?}");
            assert!(!working(&a), "not Working before the cancel is seen: {a:?}");
            // The allocator cannot be asked (the TN is down): still Draining.
            o.lock_allocator = Err(ObservationError::Unavailable("TN down".into()));
            o.now = Millis(201_000);
            a.clear();
            d.step(&o, &TIMING, Ok(()), &mut a);
            assert!(!working(&a), "{a:?}");
            o.lock_allocator = Ok(AllocatorView {
                drain_protocol: true,
                ..AllocatorView::default()
            });
            if !allocator_forgot {
                let drains = &mut o.lock_allocator.as_mut().unwrap().drains;
                drains.insert(42, DrainAnswer::Cancelled);
            }
            o.now = Millis(202_000);
            a.clear();
            d.step(&o, &TIMING, Ok(()), &mut a);
            if allocator_forgot {
                assert!(!working(&a), "{a:?}");
                assert!(matches!(d.purpose, DrainPurpose::Restart { .. }));
                assert_ne!(d.stage, DrainStage::Cancelling);
            } else {
                assert!(working(&a), "{a:?}");
            }
        }
    }

    #[test]
    fn eviction_drain_waits_for_the_evictor_and_cancels_when_abandoned() {
        let mut d = Drain::new(
            "cn-1",
            "uid-1",
            "u1",
            DrainPurpose::Evict {
                source: "kubectl-drain".into(),
            },
            Millis(0),
        );
        to_handover(&mut d);
        let mut o = obs(5_000);
        draining(&mut o);
        confirm(&mut o);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(a.is_empty(), "the evictor deletes, not us");
        assert!(d.confirmed());
        o.now = Millis(200_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        // The evictor gave up, but the hand-over was requested: the kernel cannot take it back
        // and the CN refuses new writes for good. It is never set Working again: it is
        // restarted once its drain is confirmed.
        assert_ne!(d.stage, DrainStage::Cancelling);
        assert!(
            !a.iter().any(|x| matches!(
                x,
                Action::SetCnWorkState {
                    state: WorkState::Working,
                    ..
                }
            )),
            "{a:?}"
        );
        assert!(
            a.iter()
                .any(|x| matches!(x, Action::RestartPod { pod, uid, .. } if pod == "cn-1" && uid == "uid-1")),
            "{a:?}"
        );
        assert!(matches!(d.purpose, DrainPurpose::Restart { .. }));
    }

    /// HAKeeper lost the CN's record (an outage longer than the CN's expiry) after the hand-over
    /// was requested; the same process re-registers under a new epoch. The confirmation is
    /// void, but the process still refuses new writes: abandoned, it is restarted, never set
    /// Working (found by `campaign --seeds 10000`, seed 9164: 20635 on every new transaction).
    #[test]
    fn a_marked_cn_re_registered_under_a_new_epoch_is_restarted_not_returned_to_work() {
        let mut d = Drain::new(
            "cn-1",
            "uid-1",
            "u1",
            DrainPurpose::Evict {
                source: "cluster-autoscaler".into(),
            },
            Millis(0),
        );
        to_handover(&mut d);
        let mut o = obs(5_000);
        draining(&mut o);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        // The record expired and came back: new epoch, Working, same container.
        let record = &mut o.hakeeper.as_mut().unwrap().cns[0];
        record.start_epoch += 1;
        record.work_state = WorkState::Working;
        o.now = Millis(200_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(
            !a.iter().any(|x| matches!(
                x,
                Action::SetCnWorkState {
                    state: WorkState::Working,
                    ..
                }
            )),
            "{a:?}"
        );
        assert_ne!(d.stage, DrainStage::Cancelling);
        assert!(
            matches!(d.purpose, DrainPurpose::Restart { .. }),
            "{:?}",
            d.purpose
        );
    }

    /// The same with the drain extension: the hand-over was begun by drain id, the record
    /// expired and came back for the same container under a new epoch. The process may refuse
    /// new writes for good (the id is no longer asked about, nothing cancels it): withdrawn, it
    /// is drained again and restarted, never set Working (found by `campaign --seeds 10000`,
    /// seed 3346: 20635 on every new transaction of the CN).
    #[test]
    fn an_extension_drain_whose_record_came_back_for_the_same_container_is_restarted() {
        let mut d = Drain::new(
            "cn-1",
            "uid-1",
            "u1",
            DrainPurpose::Evict {
                source: "cluster-autoscaler".into(),
            },
            Millis(0),
        );
        let mut o = obs(2_000);
        o.lock_allocator.as_mut().unwrap().drain_protocol = true;
        draining(&mut o);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(a[..], [Action::BeginDrain { .. }]), "{a:?}");
        d.absorb(
            &[ActionResult {
                action: a[0].clone(),
                result: Ok(ActionOutput::DrainId { drain_id: 42 }),
            }],
            Millis(2_000),
        );
        o.lock_allocator
            .as_mut()
            .unwrap()
            .drains
            .insert(42, DrainAnswer::Done);
        // The record expired and came back: new epoch, Draining (init-work-state), same
        // container; the evictor gave up long ago.
        let record = &mut o.hakeeper.as_mut().unwrap().cns[0];
        record.start_epoch += 1;
        o.now = Millis(200_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(
            !a.iter().any(|x| matches!(
                x,
                Action::SetCnWorkState {
                    state: WorkState::Working,
                    ..
                }
            )),
            "{a:?}"
        );
        assert_ne!(d.stage, DrainStage::Cancelling);
        assert!(
            matches!(d.purpose, DrainPurpose::Restart { .. }),
            "{:?}",
            d.purpose
        );
    }

    /// Withdrawn before any hand-over was requested, an eviction drain goes back to work.
    #[test]
    fn an_eviction_withdrawn_before_the_hand_over_returns_the_cn_to_work() {
        let mut d = Drain::new(
            "cn-1",
            "uid-1",
            "u1",
            DrainPurpose::Evict {
                source: "kubectl-drain".into(),
            },
            Millis(0),
        );
        let mut o = obs(1_000);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        draining(&mut o);
        // Sessions still there: no hand-over yet.
        o.cn_activity.insert(
            "cn-1".into(),
            Ok(CnActivity {
                sessions: 2,
                pipelines: 0,
                replicas: 0,
                locks: None,
                oldest_txn: OldestTxn::NotRead,
                live_lock_holders: None,
            }),
        );
        o.now = Millis(200_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert_eq!(d.stage, DrainStage::Cancelling);
        assert!(a.iter().any(|x| matches!(
            x,
            Action::SetCnWorkState {
                state: WorkState::Working,
                ..
            }
        )));
        o.hakeeper.as_mut().unwrap().cns[0].work_state = WorkState::Working;
        d.step(&o, &TIMING, Ok(()), &mut vec![]);
        assert_eq!(d.end, Some(DrainEnd::Cancelled));
    }

    /// Kubernetes' instance is the one that counts: a container restarted in place keeps its
    /// HAKeeper record (epoch included), yet the drain starts over on the new container.
    #[test]
    fn a_container_restarted_in_place_is_a_new_instance_even_when_hakeeper_cannot_tell() {
        let mut d = remove();
        to_handover(&mut d);
        let mut o = obs(5_000);
        draining(&mut o);
        o.pods[0].restarts = 1;
        o.pods[0].started_at = Some(Millis(4_500));
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        // What was learned of the old container is forgotten; the record is not yet the new
        // container's (heard 200 ms ago, the container started 500 ms ago): nothing counts.
        assert!(d.handshake_sent_at.is_none() && d.handshake_acked_at.is_none());
        assert!(
            d.hold
                .as_deref()
                .unwrap_or("")
                .contains("not yet this instance"),
            "{:?}",
            d.hold
        );
        assert!(a.is_empty(), "{a:?}");
        confirm(&mut o); // an answer that may be the old process's
        o.now = Millis(6_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(a.is_empty(), "{a:?}");
        // Heard from the new container: its own hand-over is requested once its old entry
        // is gone, nothing released before.
        let timing = DrainTiming {
            previous_instance_expiry: Millis(30_000),
            ..TIMING
        };
        o.now = Millis(7_000);
        d.step(&o, &timing, Ok(()), &mut a);
        assert!(a.is_empty(), "{a:?}");
        unmarked(&mut o);
        o.now = Millis(34_500);
        d.step(&o, &timing, Ok(()), &mut a);
        assert_eq!(a, vec![Action::SetRestartService { uuid: "u1".into() }]);
        assert!(!d.confirmed());
    }

    /// A pod deleted by someone else keeps running under its preStop hook: the drain goes on
    /// to a confirmation (and is never cancelled back to Working), the hook's wait ends only then.
    #[test]
    fn a_pod_deleted_elsewhere_is_drained_to_confirmation_and_never_handed_back() {
        let mut d = Drain::new(
            "cn-1",
            "uid-1",
            "u1",
            DrainPurpose::Evict {
                source: "preStop".into(),
            },
            Millis(0),
        );
        let mut o = obs(1_000);
        o.pods[0].terminating = true;
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(
            a.iter().any(|x| matches!(
                x,
                Action::SetCnWorkState {
                    state: WorkState::Draining,
                    ..
                }
            )),
            "{a:?}"
        );
        draining(&mut o);
        o.now = Millis(2_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert_eq!(a, vec![Action::SetRestartService { uuid: "u1".into() }]);
        d.absorb(
            &[ActionResult {
                action: a[0].clone(),
                result: Ok(ActionOutput::Done),
            }],
            Millis(3_000),
        );
        // Long past the eviction abandon (nobody refreshed it): a terminating pod is not
        // handed back; its confirmation arrives and counts.
        confirm(&mut o);
        o.now = Millis(500_000);
        d.step(&o, &TIMING, Ok(()), &mut vec![]);
        assert_ne!(d.stage, DrainStage::Cancelling);
        assert!(d.confirmed(), "{:?} {:?}", d.stage, d.hold);
        assert_eq!(d.still_confirmed(&o), Ok(()));
    }

    /// A request whose answer was lost is sent again only while the allocator shows no mark
    /// (false, −1): anything else shows it took effect, and a second request to an entry that
    /// can already restart wedges it for good (v1.2.4 `setRestartService` on a disabled entry).
    #[test]
    fn a_lost_request_is_sent_again_only_while_the_allocator_shows_no_mark() {
        let mut d = remove();
        let mut a = vec![];
        let mut o = obs(2_000);
        draining(&mut o);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(a.contains(&Action::SetRestartService { uuid: "u1".into() }));
        // The request is lost (no result ever arrives); nothing shows a mark.
        for t in 3..7 {
            o.now = Millis(t * 1_000);
            a.clear();
            d.step(&o, &TIMING, Ok(()), &mut a);
            assert!(a.is_empty(), "{a:?}");
        }
        o.now = Millis(7_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert_eq!(a, vec![Action::SetRestartService { uuid: "u1".into() }]);

        // Lost again, but this time it took effect: the CN handed over, the allocator says
        // so. Nothing is sent again; the answer counts from when it was seen.
        confirm(&mut o);
        for t in 8..30 {
            o.now = Millis(t * 1_000);
            a.clear();
            d.step(&o, &TIMING, Ok(()), &mut a);
            assert!(
                !a.contains(&Action::SetRestartService { uuid: "u1".into() }),
                "a second request would wedge the entry: {a:?}"
            );
            if t < 10 {
                assert!(!d.confirmed(), "not before the keepalives, at {t} s");
            }
        }
        assert!(d.confirmed());
    }

    /// A request that timed out may have been applied: it is judged from the allocator, like
    /// a lost one; one refused outright is sent again.
    #[test]
    fn a_timed_out_request_is_judged_from_the_allocator() {
        let mut d = remove();
        to_handover(&mut d);
        d.absorb(
            &[ActionResult {
                action: Action::SetRestartService { uuid: "u1".into() },
                result: Err(ActionError::Timeout("lock allocator".into())),
            }],
            Millis(3_000),
        );
        assert!(d.hand_over_requested(), "it may have been applied");
        let mut o = obs(4_000);
        draining(&mut o);
        o.lock_allocator.as_mut().unwrap().restarting.insert(
            "u1".into(),
            RestartAnswer {
                can_restart: false,
                remaining_txns: 2,
            },
        );
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(a.is_empty(), "the allocator shows the mark: {a:?}");
        assert_eq!(d.handshake_acked_at, Some(Millis(4_000)));

        let mut d = remove();
        to_handover(&mut d);
        d.absorb(
            &[ActionResult {
                action: Action::SetRestartService { uuid: "u1".into() },
                result: Err(ActionError::Unavailable("connection refused".into())),
            }],
            Millis(3_000),
        );
        let mut o = obs(4_000);
        draining(&mut o);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert_eq!(a, vec![Action::SetRestartService { uuid: "u1".into() }]);
    }

    /// The allocator may keep the entry of the CN's previous process (same UUID) beside the
    /// new one's, and answer for either at random until it removes the old one: no handshake
    /// for a container younger than that.
    #[test]
    fn the_handshake_waits_until_the_previous_process_entry_must_be_gone() {
        let timing = DrainTiming {
            previous_instance_expiry: Millis(30_000),
            ..TIMING
        };
        let mut d = remove();
        let mut o = obs(10_000);
        o.pods[0].restarts = 1;
        o.pods[0].started_at = Some(Millis(5_000));
        d.step(&o, &timing, Ok(()), &mut vec![]);
        draining(&mut o);
        confirm(&mut o); // the old process's entry, handed over before it died
        let mut a = vec![];
        for t in [11_000, 20_000, 34_000] {
            o.now = Millis(t);
            d.step(&o, &timing, Ok(()), &mut a);
            assert!(a.is_empty(), "at {t}: {a:?}");
            assert!(!d.confirmed());
            assert!(
                d.hold.as_deref().unwrap().contains("younger"),
                "{:?}",
                d.hold
            );
        }
        // The old entry is gone; the new process's answers.
        unmarked(&mut o);
        o.now = Millis(35_000);
        d.step(&o, &timing, Ok(()), &mut a);
        assert_eq!(a, vec![Action::SetRestartService { uuid: "u1".into() }]);
    }

    /// An upgrade restart: the new pod's CN keeps HAKeeper's record, its UpTime (epoch) and
    /// its Draining mark (measured on v1.2.4). It is returned to Working once HAKeeper has
    /// heard from its container, and not before.
    #[test]
    fn a_restarted_cn_that_keeps_its_record_is_returned_to_work_once_heard_from() {
        let mut d = Drain::new(
            "cn-1",
            "uid-1",
            "u1",
            DrainPurpose::Restart {
                version: "v2".into(),
            },
            Millis(0),
        );
        to_handover(&mut d);
        let mut o = obs(5_000);
        draining(&mut o);
        confirm(&mut o);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(&a[..], [Action::RestartPod { uid, .. }] if uid == "uid-1"));
        // The new pod: a new UID and container, the same record (epoch 7, Draining).
        o.pods[0].uid = "uid-2".into();
        o.pods[0].version = "v2".into();
        o.pods[0].started_at = Some(Millis(9_800));
        o.now = Millis(10_000);
        a.clear();
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(a.is_empty(), "the record is still the old process's: {a:?}");
        assert!(d.is_active());
        o.now = Millis(12_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert_eq!(
            a,
            vec![Action::SetCnWorkState {
                uuid: "u1".into(),
                state: WorkState::Working
            }]
        );
        o.hakeeper.as_mut().unwrap().cns[0].work_state = WorkState::Working;
        o.now = Millis(13_000);
        d.step(&o, &TIMING, Ok(()), &mut vec![]);
        assert_eq!(d.end, Some(DrainEnd::Released));
    }

    /// A pod replaced before its drain's release (someone deleted it; it died): the CN it
    /// marked Draining comes back under its UUID with the mark, and its new instance is put
    /// back to work once HAKeeper has heard from it. Nothing else is done to it.
    #[test]
    fn a_replaced_cn_that_kept_its_draining_mark_is_returned_to_work() {
        let mut d = Drain::new(
            "cn-1",
            "uid-1",
            "u1",
            DrainPurpose::Evict {
                source: "preStop".into(),
            },
            Millis(0),
        );
        to_handover(&mut d);
        let mut o = obs(5_000);
        draining(&mut o);
        o.pods[0].uid = "uid-2".into();
        o.pods[0].started_at = Some(Millis(4_900));
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(a.is_empty(), "{a:?}");
        assert!(d.is_active(), "waits for the new instance");
        o.now = Millis(7_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert_eq!(
            a,
            vec![Action::SetCnWorkState {
                uuid: "u1".into(),
                state: WorkState::Working
            }]
        );
        o.hakeeper.as_mut().unwrap().cns[0].work_state = WorkState::Working;
        d.step(&o, &TIMING, Ok(()), &mut vec![]);
        assert_eq!(d.end, Some(DrainEnd::InstanceGone));
    }

    /// The allocator's answer in a wedged hand-over: transactions it still counts.
    fn wedged(o: &mut Observation, remaining: i64) {
        o.lock_allocator.as_mut().unwrap().restarting.insert(
            "u1".into(),
            RestartAnswer {
                can_restart: false,
                remaining_txns: remaining,
            },
        );
    }

    /// A confirmation on an allocator that did not know the CN ("can restart, 0") lapses if
    /// the CN registers before its release: it is checked again on the release's observation.
    #[test]
    fn a_confirmation_is_checked_again_when_the_release_is_sent() {
        let mut d = Drain::new(
            "cn-1",
            "uid-1",
            "u1",
            DrainPurpose::Evict {
                source: "autoscaler".into(),
            },
            Millis(0),
        );
        let mut o = obs(1_000);
        d.step(&o, &TIMING, Ok(()), &mut vec![]);
        draining(&mut o);
        confirm(&mut o); // the allocator has no entry for it
        for t in [2_000, 3_000, 4_000] {
            o.now = Millis(t);
            d.step(&o, &TIMING, Ok(()), &mut vec![]);
        }
        assert!(d.confirmed(), "{:?}", d.hold);
        // The evictor gives up; a hand-over counted as requested cannot be taken back, so the
        // CN is to be restarted. Meanwhile it registered (its own background work).
        d.purpose = DrainPurpose::Restart {
            version: "v1".into(),
        };
        unmarked(&mut o);
        let mut a = vec![];
        o.now = Millis(5_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(
            !a.iter().any(|x| matches!(x, Action::RestartPod { .. })),
            "{a:?}"
        );
        assert!(!d.confirmed());
        assert!(
            d.hold.as_deref().unwrap().contains("no longer holds"),
            "{:?}",
            d.hold
        );
    }

    /// The allocator's "can restart, 0" may come from an older process's entry of the same UUID
    /// (v1.2.4 keeps it until a validation of that process fails, which a retryable error
    /// postpones): the CN's own lock service must agree before it counts, and again before a
    /// lost release is sent again.
    #[test]
    fn the_allocators_word_counts_only_when_the_cns_own_lock_service_agrees() {
        let mut d = remove();
        to_handover(&mut d);
        let mut o = obs(5_000);
        draining(&mut o);
        confirm(&mut o);
        let own = |o: &mut Observation, live: Option<u32>, oldest: OldestTxn| {
            if let Some(Ok(a)) = o.cn_activity.get_mut("cn-1") {
                a.live_lock_holders = live;
                a.oldest_txn = oldest;
            }
        };
        let mut a = vec![];
        for (live, oldest, why) in [
            (
                Some(1),
                OldestTxn::NoneRunning,
                "live transactions hold locks",
            ),
            (None, OldestTxn::NoneRunning, "not read"),
            (
                Some(0),
                OldestTxn::CreatedAt(Millis(1_000)),
                "from before the mark",
            ),
            (Some(0), OldestTxn::NotRead, "not read"),
        ] {
            own(&mut o, live, oldest);
            d.step(&o, &TIMING, Ok(()), &mut a);
            assert!(a.is_empty(), "{why}: {a:?}");
            assert!(d.hold.as_deref().unwrap().contains(why), "{:?}", d.hold);
        }
        // A transaction begun after the mark settled (3 s after its acceptance) is no concern.
        o.now = Millis(7_000);
        own(&mut o, Some(0), OldestTxn::CreatedAt(Millis(6_500)));
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(&a[..], [Action::DeletePod { .. }]), "{a:?}");
        assert_eq!(d.still_confirmed(&o), Ok(()));
        own(&mut o, Some(1), OldestTxn::NoneRunning);
        assert!(d.still_confirmed(&o).is_err());
    }

    /// The extension's drain counts what the kernel's lock service counts, leaks included:
    /// the same evidence confirms a wedged hand-over there.
    #[test]
    fn a_wedged_extension_drain_is_confirmed_from_the_transaction_lists() {
        let mut d = remove();
        let mut o = obs(1_000);
        o.lock_allocator.as_mut().unwrap().drain_protocol = true;
        d.step(&o, &TIMING, Ok(()), &mut vec![]);
        draining(&mut o);
        o.now = Millis(2_000);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(&a[..], [Action::BeginDrain { .. }]), "{a:?}");
        d.absorb(
            &[ActionResult {
                action: a[0].clone(),
                result: Ok(ActionOutput::DrainId { drain_id: 4 }),
            }],
            Millis(3_000),
        );
        o.lock_allocator
            .as_mut()
            .unwrap()
            .drains
            .insert(4, DrainAnswer::Pending { remaining_txns: 2 });
        o.cn_activity.insert(
            "cn-1".into(),
            Ok(CnActivity {
                locks: Some(2),
                oldest_txn: OldestTxn::CreatedAt(Millis(1_000)),
                live_lock_holders: Some(0),
                ..CnActivity::default()
            }),
        );
        // Its own old transaction still runs: not yet.
        for t in [4_000, 13_000, 20_000] {
            o.now = Millis(t);
            d.step(&o, &TIMING, Ok(()), &mut vec![]);
            assert!(!d.confirmed(), "at {t}");
        }
        txns(&mut o, "cn-1", OldestTxn::NoneRunning);
        if let Ok(a) = o.cn_activity.get_mut("cn-1").unwrap() {
            a.locks = Some(2);
            a.live_lock_holders = Some(0);
        }
        for t in [21_000, 22_000] {
            o.now = Millis(t);
            d.step(&o, &TIMING, Ok(()), &mut vec![]);
            assert!(
                !d.confirmed(),
                "two readings a keepalive apart first, at {t}"
            );
        }
        o.now = Millis(23_000);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(&a[..], [Action::DeletePod { .. }]), "{a:?}");
    }

    /// What `pod`'s GetTxnInfo said.
    fn txns(o: &mut Observation, pod: &str, oldest_txn: OldestTxn) {
        o.cn_activity.insert(
            pod.into(),
            Ok(CnActivity {
                oldest_txn,
                ..CnActivity::default()
            }),
        );
    }

    /// Another running CN, whose transactions count as much as the drained one's.
    fn second_cn(o: &mut Observation) {
        let mut other = o.pods[0].clone();
        other.name = "cn-2".into();
        other.uid = "uid-other".into();
        other.cn_uuid = Some("u2".into());
        o.pods.push(other);
    }

    /// The allocator keeps counting transactions (one whose unlock the CN did not apply), and
    /// new ones that need its tables wait. Once the hand-over has had its time, no running
    /// CN running a transaction created before the mark had settled (accepted at 3 s, settled
    /// at 6 s), read twice a keepalive apart, confirms it.
    #[test]
    fn a_wedged_handover_is_confirmed_once_no_cn_runs_a_transaction_from_before_it() {
        let mut d = remove();
        to_handover(&mut d); // accepted at 3 s
        let mut o = obs(4_000);
        draining(&mut o);
        second_cn(&mut o);
        wedged(&mut o, 2);
        txns(&mut o, "cn-1", OldestTxn::NoneRunning);
        txns(&mut o, "cn-2", OldestTxn::CreatedAt(Millis(6_500)));
        let mut a = vec![];
        // Before the hand-over has had its time: the allocator's word counts alone.
        for t in [4_000, 8_000, 12_000] {
            o.now = Millis(t);
            d.step(&o, &TIMING, Ok(()), &mut a);
            assert_eq!(d.stage, DrainStage::HandOver, "at {t}");
        }
        // A transaction from before the mark settled (on any CN), or a CN not read, holds it.
        for (oldest, why) in [
            (
                OldestTxn::CreatedAt(Millis(5_999)),
                "1 CNs run transactions from before it",
            ),
            (OldestTxn::NotRead, "cn-2's transactions cannot be read"),
        ] {
            txns(&mut o, "cn-2", oldest);
            o.now = Millis(14_000);
            d.step(&o, &TIMING, Ok(()), &mut a);
            assert_eq!(d.stage, DrainStage::HandOver);
            assert!(
                d.hold.as_deref().unwrap_or("").contains(why),
                "{:?}",
                d.hold
            );
        }
        o.cn_activity.remove("cn-2");
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert_eq!(d.stage, DrainStage::HandOver, "a CN missing is not read");
        // Only newer transactions: read once, then again two keepalives later.
        txns(&mut o, "cn-2", OldestTxn::CreatedAt(Millis(6_000)));
        o.now = Millis(15_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert_eq!(d.stage, DrainStage::HandOver, "one reading is not enough");
        assert!(a.is_empty(), "{a:?}");
        o.now = Millis(17_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(
            matches!(&a[..], [Action::DeletePod { uid, .. }] if uid == "uid-1"),
            "{a:?}"
        );
        assert!(d.confirmed_by_txns);
    }

    /// The kernel leaked the transactions the allocator waits for (v1.2.4, seen on a running
    /// kernel after a TN restart), and transactions from before the mark wait on another CN
    /// for this one's tables for good. Every lock in its lock tables held by a transaction no
    /// CN runs, and none of its own from before the mark, read twice a keepalive apart,
    /// confirms it; a live holder, an old transaction of its own, or holders not read hold it.
    #[test]
    fn a_wedged_handover_whose_lock_holders_no_cn_runs_is_confirmed() {
        let mut d = remove();
        to_handover(&mut d); // accepted at 3 s, settled at 6 s
        let mut o = obs(14_000);
        draining(&mut o);
        second_cn(&mut o);
        wedged(&mut o, 6);
        txns(&mut o, "cn-2", OldestTxn::CreatedAt(Millis(5_000)));
        let marked = |o: &mut Observation, live: Option<u32>, oldest: OldestTxn| {
            o.cn_activity.insert(
                "cn-1".into(),
                Ok(CnActivity {
                    locks: Some(4),
                    live_lock_holders: live,
                    oldest_txn: oldest,
                    ..CnActivity::default()
                }),
            );
        };
        let mut a = vec![];
        for (live, oldest, why) in [
            (
                Some(1),
                OldestTxn::NoneRunning,
                "1 CNs run transactions from before it",
            ),
            (
                None,
                OldestTxn::NoneRunning,
                "1 CNs run transactions from before it",
            ),
            (
                Some(0),
                OldestTxn::CreatedAt(Millis(5_500)),
                "2 CNs run transactions from before it",
            ),
        ] {
            marked(&mut o, live, oldest);
            for t in [14_000, 17_000] {
                o.now = Millis(t);
                d.step(&o, &TIMING, Ok(()), &mut a);
                assert_eq!(d.stage, DrainStage::HandOver, "{live:?} {oldest:?}");
            }
            assert!(a.is_empty(), "{a:?}");
            assert!(
                d.hold.as_deref().unwrap_or("").contains(why),
                "{:?}",
                d.hold
            );
        }
        // Only dead holders, and the marked CN runs only newer transactions of its own.
        marked(&mut o, Some(0), OldestTxn::CreatedAt(Millis(6_000)));
        o.now = Millis(18_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(a.is_empty(), "one reading is not enough: {a:?}");
        assert!(
            d.hold
                .as_deref()
                .unwrap()
                .contains("held by a transaction no CN runs")
        );
        o.now = Millis(20_000);
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(
            matches!(&a[..], [Action::DeletePod { uid, .. }] if uid == "uid-1"),
            "{a:?}"
        );
        assert_eq!(d.still_confirmed(&o), Ok(()));
        // A live holder seen before a lost release is sent again undoes the confirmation.
        marked(&mut o, Some(1), OldestTxn::NoneRunning);
        assert!(d.still_confirmed(&o).is_err());
    }

    /// "Inconsistent" (-1) is not a wedge, and a CN that can no longer be read before a lost
    /// release is sent again undoes the confirmation.
    #[test]
    fn a_wedge_confirmation_needs_counted_transactions_and_every_cn_read() {
        let mut d = remove();
        to_handover(&mut d);
        let mut o = obs(20_000);
        draining(&mut o);
        wedged(&mut o, -1);
        txns(&mut o, "cn-1", OldestTxn::NoneRunning);
        let mut sent = vec![];
        for t in [20_000, 25_000, 30_000] {
            o.now = Millis(t);
            d.step(&o, &TIMING, Ok(()), &mut sent);
        }
        assert_eq!(d.stage, DrainStage::HandOver);
        // (false, −1) is no mark at all: the request goes again.
        assert!(sent.contains(&Action::SetRestartService { uuid: "u1".into() }));
        wedged(&mut o, 1);
        for t in [31_000, 41_000] {
            o.now = Millis(t);
            d.step(&o, &TIMING, Ok(()), &mut vec![]);
        }
        assert_eq!(
            d.stage,
            DrainStage::HandOver,
            "the wedge counts from the mark"
        );
        o.now = Millis(43_000);
        d.step(&o, &TIMING, Ok(()), &mut vec![]);
        assert_eq!(d.stage, DrainStage::Released);
        assert_eq!(d.still_confirmed(&o), Ok(()));
        txns(&mut o, "cn-1", OldestTxn::NotRead);
        assert!(d.still_confirmed(&o).is_err());
    }

    /// A removal drain that sent its release at 5 s (the release may yet be lost).
    fn released() -> (Drain, Observation) {
        let mut d = remove();
        to_handover(&mut d);
        let mut o = obs(5_000);
        draining(&mut o);
        confirm(&mut o);
        d.step(&o, &TIMING, Ok(()), &mut vec![]);
        assert_eq!(d.stage, DrainStage::Released);
        (d, o)
    }

    #[test]
    fn a_lost_release_is_not_sent_again_once_the_confirmation_lapsed() {
        let (mut d, mut o) = released();
        // The delete never happened, and meanwhile a session landed on the CN.
        o.cn_activity.insert(
            "cn-1".into(),
            Ok(CnActivity {
                sessions: 1,
                pipelines: 0,
                replicas: 0,
                locks: None,
                oldest_txn: OldestTxn::NotRead,
                live_lock_holders: None,
            }),
        );
        o.now = Millis(11_000);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(
            !a.iter().any(|x| matches!(x, Action::DeletePod { .. })),
            "{a:?}"
        );
        assert_eq!(d.stage, DrainStage::MarkDraining);
        assert!(d.hold.as_deref().unwrap().contains("not idle"));
    }

    #[test]
    fn replaced_pod_ends_the_drain_without_release() {
        let mut d = remove();
        to_handover(&mut d);
        let mut o = obs(5_000);
        o.pods[0].uid = "uid-2".into();
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(a.is_empty());
        assert_eq!(d.end, Some(DrainEnd::InstanceGone));
    }

    #[test]
    fn lost_release_is_sent_again() {
        let (mut d, mut o) = released();
        o.now = Millis(11_000);
        let mut a = vec![];
        d.step(&o, &TIMING, Ok(()), &mut a);
        assert!(matches!(&a[..], [Action::DeletePod { uid, .. }] if uid == "uid-1"));
    }
}
