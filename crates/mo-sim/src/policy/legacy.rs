//! The existing Go operator's behaviour, as `shared/reference/matrixone.md` describes it:
//! - CN removal: Draining in HAKeeper → wait for sessions = pipelines = replicas = 0 (at least
//!   `drain_min`) → restart handshake → delete; **released anyway** when the drain timeout
//!   passes (at once when unset) or when any error says "does not exist";
//! - evictions bypass the drain entirely (no webhook, no PodDisruptionBudget);
//! - upgrades follow the strategy's order, restart the next pod as soon as the previous one is
//!   Ready and advance phases on pod readiness alone.
//!
//! It exists to reproduce the incidents. Nothing here is a model for new code.

use crate::scenario::LegacyOptions;
use mo_core::{
    Action, ActionError, Component, Decision, EvictionRequest, EvictionVerdict, Millis,
    Observation, ObservationError, PodObservation, PodPhase, Policy, PolicyInput, PolicyNote,
    WorkState,
};
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq)]
enum Purpose {
    Remove,
    Restart { version: String },
}

#[derive(Clone, Debug)]
struct Drain {
    uid: String,
    uuid: String,
    started: Millis,
    purpose: Purpose,
    handshake_sent: bool,
    released: bool,
}

#[derive(Clone, Debug)]
struct UpgradeRun {
    target: String,
    phases: Vec<Component>,
    index: usize,
    phase_started: bool,
}

pub struct LegacyPolicy {
    options: LegacyOptions,
    drains: BTreeMap<String, Drain>,
    upgrade: Option<UpgradeRun>,
    /// `fixed-window`: wait this long after each restarted pod is Ready.
    window: Option<Millis>,
    /// When the last restarted pod was first seen Ready on the new version.
    settled_since: Option<Millis>,
}

impl LegacyPolicy {
    pub fn new(options: LegacyOptions) -> Self {
        LegacyPolicy {
            options,
            drains: BTreeMap::new(),
            upgrade: None,
            window: None,
            settled_since: None,
        }
    }

    /// The naive fix: the same pacing plus a fixed wait after every pod.
    pub fn fixed_window(options: LegacyOptions, window: Millis) -> Self {
        LegacyPolicy {
            window: Some(window),
            ..LegacyPolicy::new(options)
        }
    }

    fn start_drain(
        &mut self,
        pod: &PodObservation,
        purpose: Purpose,
        now: Millis,
        d: &mut Decision,
    ) {
        let Some(uuid) = pod.cn_uuid.clone() else {
            return;
        };
        d.actions.push(Action::SetCnWorkState {
            uuid: uuid.clone(),
            state: WorkState::Draining,
        });
        self.drains.insert(
            pod.name.clone(),
            Drain {
                uid: pod.uid.clone(),
                uuid,
                started: now,
                purpose,
                handshake_sent: false,
                released: false,
            },
        );
    }

    fn release(pod: &str, drain: &mut Drain, reason: &str, d: &mut Decision) {
        drain.released = true;
        match &drain.purpose {
            Purpose::Remove => {
                d.actions.push(Action::DeleteCnStore {
                    uuid: drain.uuid.clone(),
                });
                d.actions.push(Action::DeletePod {
                    pod: pod.to_string(),
                    uid: drain.uid.clone(),
                    reason: format!("drain released: {reason}"),
                });
            }
            Purpose::Restart { version } => d.actions.push(Action::RestartPod {
                pod: pod.to_string(),
                uid: drain.uid.clone(),
                version: version.clone(),
            }),
        }
        d.notes.push(PolicyNote::Released {
            subject: pod.to_string(),
            reason: reason.to_string(),
        });
    }

    fn progress_drains(&mut self, obs: &Observation, d: &mut Decision) {
        let drain_min = self.options.drain_min.millis();
        for (pod, drain) in self.drains.iter_mut().filter(|(_, x)| !x.released) {
            let elapsed = obs.now - drain.started;
            let idle = match obs.cn_activity.get(pod) {
                Some(Ok(a)) => a.sessions + a.pipelines + a.replicas == 0,
                Some(Err(ObservationError::DoesNotExist(_))) => {
                    Self::release(pod, drain, "query service: does not exist", d);
                    continue;
                }
                _ => false,
            };
            if !drain.handshake_sent && elapsed >= drain_min && idle {
                d.actions.push(Action::SetRestartService {
                    uuid: drain.uuid.clone(),
                });
                drain.handshake_sent = true;
            }
            let confirmed = drain.handshake_sent
                && obs
                    .lock_allocator
                    .as_ref()
                    .is_ok_and(|v| v.restarting.get(&drain.uuid).is_some_and(|a| a.can_restart));
            if confirmed {
                Self::release(pod, drain, "restart handshake says it can restart", d);
                continue;
            }
            match self.options.drain_timeout {
                None if elapsed >= drain_min => {
                    Self::release(pod, drain, "drain timeout unset: released at once", d)
                }
                Some(timeout) if elapsed >= timeout.millis() => {
                    Self::release(pod, drain, "drain timeout passed", d)
                }
                _ => {}
            }
        }
        // Forget drains whose pod is gone or was recreated.
        self.drains
            .retain(|pod, drain| obs.pod(pod).is_some_and(|p| p.uid == drain.uid));
    }

    fn progress_upgrade(&mut self, obs: &Observation, d: &mut Decision) {
        let Some(spec) = &obs.desired.upgrade else {
            return;
        };
        if self
            .upgrade
            .as_ref()
            .is_none_or(|u| u.target != spec.target_version)
        {
            self.upgrade = Some(UpgradeRun {
                target: spec.target_version.clone(),
                phases: spec.strategy.phases(),
                index: 0,
                phase_started: false,
            });
        }
        let run = self.upgrade.as_mut().expect("set above");
        let Some(&component) = run.phases.get(run.index) else {
            return;
        };
        // StatefulSet order: highest ordinal first.
        let mut pods: Vec<&PodObservation> = obs.pods_of(component).collect();
        pods.sort_by(|a, b| b.name.cmp(&a.name));
        let all_ready = pods
            .iter()
            .all(|p| p.phase == PodPhase::Running && p.ready && !p.terminating);
        // A restart drain stays on record until its pod is recreated.
        let draining = self
            .drains
            .values()
            .any(|x| matches!(x.purpose, Purpose::Restart { .. }));
        if !all_ready || draining {
            self.settled_since = None;
            return; // pacing is pod readiness, nothing else
        }
        if let Some(window) = self.window
            && run.phase_started
        {
            let since = *self.settled_since.get_or_insert(obs.now);
            if obs.now - since < window {
                return;
            }
        }
        self.settled_since = None;
        match pods.iter().find(|p| p.version != run.target) {
            Some(pod) => {
                if !run.phase_started {
                    run.phase_started = true;
                    d.notes.push(PolicyNote::PhaseStarted { component });
                }
                let version = run.target.clone();
                if component == Component::Cn {
                    let pod = (*pod).clone();
                    self.start_drain(&pod, Purpose::Restart { version }, obs.now, d);
                } else {
                    d.actions.push(Action::RestartPod {
                        pod: pod.name.clone(),
                        uid: pod.uid.clone(),
                        version,
                    });
                }
            }
            None => {
                // Every pod Ready on the new version: the phase is "done".
                if run.phase_started {
                    d.notes.push(PolicyNote::PhaseFinished { component });
                }
                run.index += 1;
                run.phase_started = false;
                if run.index == run.phases.len() {
                    d.notes.push(PolicyNote::UpgradeFinished);
                }
            }
        }
    }
}

impl Policy for LegacyPolicy {
    fn name(&self) -> &str {
        if self.window.is_some() {
            "fixed-window"
        } else {
            "legacy"
        }
    }

    fn decide(&mut self, input: PolicyInput<'_>) -> Decision {
        let obs = input.observation;
        let mut d = Decision::default();
        for result in input.results {
            let (Action::SetCnWorkState { uuid, state }, Err(error)) =
                (&result.action, &result.result)
            else {
                continue;
            };
            let Some((pod, drain)) = self
                .drains
                .iter_mut()
                .find(|(_, x)| &x.uuid == uuid && !x.released)
            else {
                continue;
            };
            if matches!(error, ActionError::DoesNotExist(_)) {
                // Any "does not exist" answer is taken as success: the CN is released.
                let pod = pod.clone();
                Self::release(&pod, drain, "HAKeeper said does not exist", &mut d);
            } else {
                // Other errors: the reconcile loop tries again.
                d.actions.push(Action::SetCnWorkState {
                    uuid: uuid.clone(),
                    state: *state,
                });
            }
        }
        for removal in &obs.desired.removals {
            if !self.drains.contains_key(&removal.pod)
                && let Some(pod) = obs.pod(&removal.pod).filter(|p| !p.terminating)
            {
                let pod = pod.clone();
                self.start_drain(&pod, Purpose::Remove, obs.now, &mut d);
            }
        }
        self.progress_drains(obs, &mut d);
        self.progress_upgrade(obs, &mut d);
        d
    }

    fn review_eviction(&mut self, _: &Observation, _: &EvictionRequest) -> EvictionVerdict {
        // No webhook, no PodDisruptionBudget: every eviction goes through.
        EvictionVerdict::Allow
    }
}
