//! The boundary between the world and a policy: what a policy may observe, how its actions
//! take effect, and the independent observer that judges every voluntary action against the
//! ground truth (the `unsafe_actions` counters).

use super::kernel::majority;
use super::*;
use mo_core::{
    Action, ActionError, ActionOutput, AllocatorView, ClusterDetails, CnActivity, CnStoreView,
    DesiredState, HeartbeatIntervals, LogReplicaView, LogShardView, Observation, ObservationError,
    OldestTxn, PodObservation, PodPhase, PolicyNote, TnStoreView,
};

impl Simulation {
    pub(crate) fn observe(&self) -> Observation {
        let pods = self
            .live_pods()
            .map(|p| {
                let pod = &self.pods[p];
                PodObservation {
                    name: pod.name.clone(),
                    uid: pod.uid.clone(),
                    component: pod.component,
                    node: self.nodes[pod.node].name.clone(),
                    phase: if pod.status == PodStatus::Running {
                        PodPhase::Running
                    } else {
                        PodPhase::Pending
                    },
                    ready: pod.ready,
                    version: pod.version.clone(),
                    terminating: pod.deletion.is_some(),
                    restarts: pod.restarts,
                    started_at: pod.process_alive.then_some(pod.last_start),
                    cn_uuid: pod.cn_uuid.clone(),
                    pool_phase: pod.pool_phase,
                    serving: pod.serving,
                }
            })
            .collect();
        let hakeeper = if self.hakeeper.outage_until.is_some() {
            Err(ObservationError::Timeout("HAKeeper RPC".into()))
        } else if !self.hakeeper_available() {
            Err(ObservationError::Unavailable(
                "HAKeeper shard has no leader".into(),
            ))
        } else {
            Ok(self.cluster_details())
        };
        // Asked as the operator asks: for every CN HAKeeper shows Draining.
        let draining: Vec<String> = self
            .hakeeper
            .cns
            .iter()
            .filter(|(_, r)| r.work_state == WorkState::Draining)
            .map(|(u, _)| u.clone())
            .collect();
        let lock_allocator = if self.tn.phase == TnPhase::Running {
            let restarting = draining
                .iter()
                .map(|uuid| {
                    let mut answer = self.tn.allocator.restart_answer(uuid, self.now);
                    answer.can_restart &= !self.fault_handover_never_confirms;
                    (uuid.clone(), answer)
                })
                .collect();
            let drains = self
                .kernel_drains
                .iter()
                .map(|(&id, d)| (id, self.query_drain(d)))
                .collect();
            Ok(AllocatorView {
                restarting,
                drain_protocol: self.drain_protocol,
                drains,
            })
        } else {
            Err(ObservationError::Unavailable(
                "lock allocator (TN) is down".into(),
            ))
        };
        let cn_activity = self.cn_activity(&draining);
        // What the operator can know of a proxy's routes: whether it heartbeats to HAKeeper,
        // and how many Working, fresh CNs HAKeeper lists (not the proxy's own cached list).
        let intervals = self.heartbeat_intervals();
        let routable = match &hakeeper {
            Ok(d) => d
                .cns
                .iter()
                .filter(|c| {
                    c.work_state == WorkState::Working && c.heartbeat_age <= intervals.cn_fresh()
                })
                .count() as u32,
            Err(_) => 0,
        };
        let proxy_routes = self
            .proxies
            .keys()
            .filter(|p| self.pods[**p].status != PodStatus::Gone)
            .map(|&p| {
                let name = self.pods[p].name.clone();
                let answer = match (&hakeeper, self.hakeeper.proxies.get(&name)) {
                    (Err(e), _) => Err(e.clone()),
                    (Ok(_), Some(last)) if self.now - *last <= intervals.proxy_fresh() => {
                        Ok(routable)
                    }
                    (Ok(_), Some(_)) => Err(ObservationError::Unavailable(format!(
                        "proxy {name} is not heartbeating to HAKeeper"
                    ))),
                    (Ok(_), None) => Err(ObservationError::Unavailable(format!(
                        "proxy {name} is not registered with HAKeeper"
                    ))),
                };
                (name, answer)
            })
            .collect();
        // Counted on the CNs' query services, as the operator does: any running CN not answering
        // leaves every count unknown (a pod whose process has not started has no sessions).
        let unread = self
            .cns
            .iter()
            .any(|(&p, cn)| self.pods[p].process_alive && cn.phase != CnPhase::Running)
            .then(|| ObservationError::Unavailable("a CN's query service is not answering".into()));
        let proxy_connections = self
            .proxies
            .keys()
            .filter(|p| self.pods[**p].status != PodStatus::Gone)
            .map(|&p| {
                let count = match &unread {
                    Some(e) => Err(e.clone()),
                    None => Ok(self
                        .clients
                        .iter()
                        .filter(|c| c.proxy == Some(p) && c.session.is_some())
                        .count() as u32),
                };
                (self.pods[p].name.clone(), count)
            })
            .collect();
        let node_images = self
            .nodes
            .iter()
            .zip(&self.node_images)
            .map(|(n, images)| (n.name.clone(), images.iter().cloned().collect()))
            .collect();
        Observation {
            now: self.now,
            pods,
            hakeeper,
            lock_allocator,
            cn_activity,
            proxy_routes,
            proxy_connections,
            node_images,
            tn_wal_tolerance: self.tn_wal_tolerance,
            heartbeat_intervals: self.heartbeat_intervals(),
            unschedulable_nodes: self
                .nodes
                .iter()
                .filter(|n| !n.alive || n.cordoned)
                .map(|n| n.name.clone())
                .collect(),
            not_ready_nodes: self
                .nodes
                .iter()
                .filter(|n| !n.alive)
                .map(|n| n.name.clone())
                .collect(),
            desired: DesiredState {
                upgrade: self.upgrade.clone(),
                removals: self.removals.clone(),
                // The simulated workloads recreate a pod at once (as Pending): it is observed.
                replicas: BTreeMap::new(),
            },
        }
    }

    /// Each CN's query service, read as the operator reads it: sessions always; while a CN
    /// drains, GetTxnInfo of every CN and GetLockInfo of the draining ones, with the holders of
    /// its locks checked against every running CN's transactions.
    fn cn_activity(
        &self,
        draining: &[String],
    ) -> BTreeMap<String, Result<CnActivity, ObservationError>> {
        let any_draining = !draining.is_empty();
        let answering = |cn: &Cn| cn.phase == CnPhase::Running;
        // Every running CN's transactions, when each one answers (one that does not leaves
        // the holders' liveness unknown).
        let all_read = self
            .cns
            .iter()
            .all(|(&p, cn)| !self.pods[p].process_alive || answering(cn));
        let live = |x: &TxnId| {
            self.txns.get(x).is_some_and(|t| {
                self.cns
                    .get(&t.cn.pod)
                    .is_some_and(|c| c.epoch == t.cn.epoch && answering(c))
            })
        };
        self.cns
            .iter()
            .filter(|(p, _)| self.pods[**p].status != PodStatus::Gone)
            .map(|(&p, cn)| {
                let answer = if answering(cn) {
                    let me = Instance {
                        pod: p,
                        epoch: cn.epoch,
                    };
                    let oldest_txn = if any_draining {
                        self.txns
                            .values()
                            .filter(|t| t.cn == me)
                            .map(|t| t.created_at)
                            .min()
                            .map_or(OldestTxn::NoneRunning, OldestTxn::CreatedAt)
                    } else {
                        OldestTxn::NotRead
                    };
                    let lock_holders: Vec<TxnId> = cn
                        .holders
                        .iter()
                        .chain(cn.stale_holders.keys())
                        .copied()
                        .collect();
                    let lock_info = draining.contains(&cn.uuid);
                    Ok(CnActivity {
                        sessions: cn.sessions.len() as u32,
                        pipelines: 0,
                        replicas: 0,
                        locks: lock_info.then_some(lock_holders.len() as u32),
                        oldest_txn,
                        live_lock_holders: (lock_info && all_read)
                            .then(|| lock_holders.iter().filter(|x| live(x)).count() as u32),
                    })
                } else {
                    Err(ObservationError::Unavailable(
                        "query service not answering".into(),
                    ))
                };
                (self.pods[p].name.clone(), answer)
            })
            .collect()
    }

    /// The intervals the modelled kernel heartbeats at (its proxies are modelled by their
    /// routes, not their heartbeats: the kernel's default stands).
    pub(crate) fn heartbeat_intervals(&self) -> HeartbeatIntervals {
        HeartbeatIntervals {
            log: self.t.heartbeat.millis(),
            tn: self.t.heartbeat.millis(),
            cn: self.t.cn_heartbeat.millis(),
            proxy: self.t.proxy_heartbeat.millis(),
        }
    }

    fn cluster_details(&self) -> ClusterDetails {
        let cns = self
            .hakeeper
            .cns
            .iter()
            .map(|(uuid, r)| CnStoreView {
                uuid: uuid.clone(),
                start_epoch: r.epoch,
                work_state: r.work_state,
                heartbeat_age: self.now - r.last_heartbeat,
                version: r.version.clone(),
            })
            .collect();
        let tns = self
            .hakeeper
            .tn_last_heartbeat
            .iter()
            .map(|(epoch, at)| TnStoreView {
                uuid: "tn-0".into(),
                start_epoch: *epoch,
                heartbeat_age: self.now - *at,
            })
            .collect();
        let log_shards = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| self.log_shard_view(i, s))
            .collect();
        ClusterDetails {
            cns,
            tns,
            log_shards,
        }
    }

    /// A log shard as the operator sees it. From HAKeeper, fed by the stores' heartbeats: the
    /// leader and term of the newest report; a replica is up when its store's record is fresh
    /// and lists it (`LogShardInfo` has no log index). Whether it has caught up is asked of the
    /// replica itself: a read through it (`SyncRead`, a read index) answers only once it has
    /// applied the shard's log up to the leader's commit index.
    fn log_shard_view(&self, i: usize, shard: &Shard) -> LogShardView {
        let fresh = self.heartbeat_intervals().log_fresh();
        let reports: Vec<(&str, Option<&ReplicaReport>, bool)> = shard
            .replicas
            .iter()
            .map(|r| {
                let record = self.hakeeper.log_stores.get(&r.store);
                let report = record.and_then(|rec| rec.replicas.iter().find(|x| x.shard == i));
                let is_fresh = record.is_some_and(|rec| self.now - rec.last_heartbeat <= fresh);
                (r.store.as_str(), report, is_fresh)
            })
            .collect();
        let newest = reports
            .iter()
            .filter_map(|(_, report, _)| *report)
            .max_by_key(|x| x.term);
        let (leader, term) = newest.map_or((None, 0), |x| (x.leader, x.term));
        let replicas = shard
            .replicas
            .iter()
            .zip(&reports)
            .map(|(r, (store, report, is_fresh))| {
                let up = *is_fresh && report.is_some();
                let following = up
                    && leader.is_some()
                    && report.is_some_and(|x| x.term == term && x.leader == leader);
                let caught_up = following && r.state == ReplicaState::Joined { caught_up: true };
                LogReplicaView {
                    store: store.to_string(),
                    up,
                    caught_up,
                }
            })
            .collect();
        LogShardView {
            shard_id: shard.id,
            leader: leader.map(|l| shard.replicas[l].store.clone()),
            term,
            replicas,
        }
    }

    pub(crate) fn apply_action(&mut self, action: &Action) -> Result<ActionOutput, ActionError> {
        match action {
            Action::BeginDrain { uuid, start_epoch } => self
                .begin_drain(uuid, *start_epoch)
                .map(|drain_id| ActionOutput::DrainId { drain_id }),
            Action::CancelDrain { drain_id } => {
                self.cancel_drain(*drain_id).map(|()| ActionOutput::Done)
            }
            other => self.apply_simple_action(other).map(|()| ActionOutput::Done),
        }
    }

    fn apply_simple_action(&mut self, action: &Action) -> Result<(), ActionError> {
        match action {
            Action::BeginDrain { .. } | Action::CancelDrain { .. } => {
                unreachable!("answered by apply_action")
            }
            Action::SetProxyServing { pod, uid, serving } => {
                let p = self.pod_for_action(pod, uid)?;
                self.pods[p].serving = *serving;
                let name = pod.clone();
                let state = if *serving { "in" } else { "out of" };
                self.trace(&name, "serving", || format!("{state} the SQL Service"));
                Ok(())
            }
            Action::PrePullImage { node, version } => {
                let n = self
                    .nodes
                    .iter()
                    .position(|x| &x.name == node)
                    .ok_or_else(|| ActionError::DoesNotExist(format!("node {node}")))?;
                self.pull_image(n, version);
                Ok(())
            }
            Action::TransferLogLeader { shard_id, to_store } => {
                self.transfer_leader(*shard_id, to_store)
            }
            Action::SetTnWalTolerance { total } => {
                if !self.wal_tolerance {
                    return Err(ActionError::Unsupported(
                        "logservice method type SetTnWalTolerance".into(),
                    ));
                }
                self.tn_wal_tolerance = *total;
                Ok(())
            }
            Action::SetCnWorkState { uuid, state } => {
                self.hakeeper_rpc()?;
                let record = self.hakeeper.cns.get_mut(uuid).ok_or_else(|| {
                    ActionError::DoesNotExist(format!("CN [{uuid}] does not exist"))
                })?;
                record.work_state = *state;
                Ok(())
            }
            Action::SetRestartService { uuid } => self.set_restart_service(uuid),
            Action::DeleteCnStore { uuid } => {
                self.hakeeper_rpc()?;
                self.hakeeper.cns.remove(uuid);
                Ok(())
            }
            Action::DeletePod { pod, uid, reason } => {
                let p = self.pod_for_action(pod, uid)?;
                let removal = self.removals.iter().any(|r| &r.pod == pod);
                if !removal && self.template_version.get(pod) != Some(&self.pods[p].version) {
                    self.check_upgrade_advance(p);
                }
                if removal && self.pods[p].pool_phase.is_some() {
                    self.pods[p].pool_phase = Some(PoolPhase::Terminating);
                }
                self.delete_pod(p, Cause::Voluntary, !removal, reason);
                Ok(())
            }
            Action::RestartPod { pod, uid, version } => {
                let p = self.pod_for_action(pod, uid)?;
                if &self.pods[p].version != version {
                    self.check_upgrade_advance(p);
                    self.check_upgrade_move(p, version);
                }
                self.template_version.insert(pod.clone(), version.clone());
                if self.pods[p].component == Component::Cn {
                    self.cn_template = Some(version.clone());
                }
                self.delete_pod(p, Cause::Voluntary, true, &format!("restart for {version}"));
                if self.pods[p].component == Component::Tn {
                    self.tn.stop_cause = Cause::TnRestart;
                }
                self.mark_only_proxy_restart(p);
                Ok(())
            }
        }
    }

    fn hakeeper_rpc(&self) -> Result<(), ActionError> {
        if self.hakeeper.outage_until.is_some() {
            Err(ActionError::Timeout("HAKeeper RPC".into()))
        } else if !self.hakeeper_available() {
            Err(ActionError::Unavailable(
                "HAKeeper shard has no leader".into(),
            ))
        } else {
            Ok(())
        }
    }

    fn pod_for_action(&self, name: &str, uid: &str) -> Result<PodId, ActionError> {
        let &p = self
            .pod_by_name
            .get(name)
            .ok_or_else(|| ActionError::DoesNotExist(format!("pod {name} not found")))?;
        if self.pods[p].uid != uid {
            return Err(ActionError::Conflict(format!(
                "pod {name} has uid {}, not {uid}",
                self.pods[p].uid
            )));
        }
        Ok(p)
    }

    pub(crate) fn record_note(&mut self, note: PolicyNote) {
        match &note {
            PolicyNote::PhaseStarted { component } => {
                self.tracker.phases.push((*component, Some(self.now), None));
            }
            PolicyNote::PhaseFinished { component } => {
                if let Some(entry) = self
                    .tracker
                    .phases
                    .iter_mut()
                    .rev()
                    .find(|(c, _, f)| c == component && f.is_none())
                {
                    entry.2 = Some(self.now);
                }
            }
            PolicyNote::UpgradeFinished => {
                if self.tracker.finished_at.is_none()
                    && let Some(target) = self.upgrade.as_ref().map(|u| u.target_version.clone())
                {
                    let behind: Vec<String> = self
                        .live_pods()
                        .filter(|&p| self.pods[p].version != target)
                        .map(|p| format!("{} on {}", self.pods[p].name, self.pods[p].version))
                        .collect();
                    if !behind.is_empty() {
                        self.count_unsafe(
                            |u| &mut u.finished_with_pods_not_upgraded,
                            format!(
                                "upgrade to {target} declared finished with {}",
                                behind.join(", ")
                            ),
                        );
                    }
                }
                self.tracker.finished_at.get_or_insert(self.now);
            }
            PolicyNote::Holding { subject, reason } if subject == "rollout" => {
                if reason.starts_with("halted") || reason.starts_with("rolled back and halted") {
                    self.tracker.halted = true;
                }
                if reason.starts_with("ALARM (creation is slow") && self.tracker.cluster_existed {
                    let reason = reason.clone();
                    self.count_unsafe(
                        |u| &mut u.rollout_taken_for_creation,
                        format!("a running cluster's rollout took itself for a creation: {reason}"),
                    );
                }
            }
            PolicyNote::Holding { .. }
            | PolicyNote::Released { .. }
            | PolicyNote::MovedPastTheCatalog { .. } => {}
        }
        match &note {
            PolicyNote::PhaseStarted { component } => {
                self.trace("phases", "phase-start", || component.to_string())
            }
            PolicyNote::PhaseFinished { component } => {
                self.trace("phases", "phase-end", || component.to_string())
            }
            PolicyNote::UpgradeFinished => {
                self.trace("phases", "upgrade-end", || "upgrade finished".into())
            }
            PolicyNote::Holding { subject, reason } => {
                self.trace(subject, "hold", || reason.clone())
            }
            PolicyNote::Released { subject, reason } => {
                self.trace(subject, "release", || reason.clone())
            }
            PolicyNote::MovedPastTheCatalog { pod, reason } => {
                self.trace(pod, "moved-past-the-catalog", || reason.clone())
            }
        }
        self.log("policy", || format!("{note:?}"));
    }

    fn count_unsafe(&mut self, counter: fn(&mut UnsafeActions) -> &mut u64, what: String) {
        *counter(&mut self.unsafe_actions) += 1;
        let line = format!("{}: {what}", self.now);
        self.trace("unsafe", "unsafe", || what.clone());
        self.log("UNSAFE", || what.clone());
        self.unsafe_log.push(line);
    }

    /// Judges a voluntary stop of a running MatrixOne process against the ground truth.
    pub(crate) fn check_voluntary_stop(&mut self, p: PodId, why: &str) {
        let name = self.pods[p].name.clone();
        match self.pods[p].component {
            Component::Cn => {
                let Some(cn) = self.cns.get(&p) else { return };
                if cn.phase != CnPhase::Running {
                    return;
                }
                let me = Instance {
                    pod: p,
                    epoch: cn.epoch,
                };
                // What the clients lose by this stop (the kernel's own background work is
                // rolled back by a graceful stop, and counted apart): their lock tables it owns,
                // their transactions it counts that still run, their sessions on it.
                let owned = self
                    .tn
                    .allocator
                    .binds
                    .iter()
                    .filter(|(table, b)| b.owner == me && self.is_client_table(table))
                    .count();
                let active = self.active_txns(p);
                let live = active
                    .iter()
                    .filter(|x| {
                        self.txns.get(x).is_some_and(|t| {
                            self.instance_running(t.cn)
                                && self
                                    .clients
                                    .get(t.client)
                                    .is_none_or(|c| c.background_on.is_none())
                        })
                    })
                    .count();
                let sessions = cn.sessions.len();
                // Safe to stop: the allocator took its tables back (for this instance); or no
                // client transaction depends on it and it owns no client table, or owns some
                // but refuses new lockers (told to restart: a wedged hand-over, whose lockers
                // wait for the binds to move as they already do).
                let handed_over = cn.confirmed_epoch == Some(cn.epoch);
                let marked = cn.restart_mode != RestartMode::None;
                let nothing_live = live == 0 && sessions == 0;
                let idle = nothing_live && (owned == 0 || marked);
                if marked && nothing_live && !handed_over {
                    self.saw("CN stopped on a wedged hand-over (no live transaction counted)");
                }
                if !(handed_over || idle) {
                    let counted = active.len();
                    self.count_unsafe(
                        |u| &mut u.pod_deleted_without_drain_confirmation,
                        format!(
                            "{name} stopped ({why}) without a drain confirmation for its instance \
                             (owns {owned} client lock tables, counts {counted} transactions, {live} \
                             of them live clients', {sessions} sessions)"
                        ),
                    );
                }
            }
            Component::Log => {
                for s in 0..self.shards.len() {
                    let shard = &self.shards[s];
                    let Some(me) = shard.replicas.iter().position(|r| r.store == name) else {
                        continue;
                    };
                    let others = shard
                        .replicas
                        .iter()
                        .enumerate()
                        .filter(|(i, r)| {
                            *i != me && r.state == ReplicaState::Joined { caught_up: true }
                        })
                        .count();
                    let needed = majority(shard.replicas.len());
                    if shard.leader.is_none() || others < needed {
                        let id = shard.id;
                        let leader = shard.leader.is_some();
                        self.count_unsafe(
                            |u| &mut u.log_restart_without_quorum_margin,
                            format!(
                                "{name} stopped ({why}) while shard {id} has leader={leader} and \
                                 {others} other caught-up replicas ({needed} needed)"
                            ),
                        );
                        return;
                    }
                }
            }
            Component::Proxy => {
                // With more than one proxy, the workload always keeps a route: a voluntary stop
                // while no other proxy can route is an outage the operator chose. (With one
                // proxy its restart is unavoidable and not judged.)
                if !self.proxies.get(&p).is_some_and(|x| x.running) {
                    return;
                }
                let proxies = self
                    .live_pods()
                    .filter(|&q| self.pods[q].component == Component::Proxy)
                    .count();
                let another_routes = self.proxies.iter().any(|(&q, proxy)| {
                    q != p
                        && proxy.running
                        && self.pods[q].deletion.is_none()
                        && self.pods[q].status != PodStatus::Gone
                        && proxy
                            .cache
                            .iter()
                            .any(|(u, st)| self.routable_cn(u, *st).is_some())
                });
                if proxies > 1 && !another_routes {
                    self.count_unsafe(
                        |u| &mut u.proxy_stopped_without_another_route,
                        format!("{name} stopped ({why}) while no other proxy could route"),
                    );
                }
            }
            Component::Tn => {
                if why == API_DELETE {
                    // Judged when the next instance starts, from the version it runs; its
                    // losses are the restart's meanwhile.
                    self.tn_deleted_from = Some(self.pods[p].version.clone());
                    self.tn.stop_cause = Cause::TnRestart;
                    return;
                }
                // The stock kernel cannot restart its TN for free (see `Cause::TnRestart`): the
                // one restart an upgrade to a version needs is allowed, nothing else.
                let needed = why.strip_prefix("restart for ").filter(|v| {
                    *v != self.pods[p].version && !self.tn_restarts_to.iter().any(|r| r == v)
                });
                match needed {
                    Some(version) => self.tn_restarts_to.push(version.to_string()),
                    None => self.count_unsafe(
                        |u| &mut u.tn_stopped_without_need,
                        format!("{name} stopped ({why}): not the one restart an upgrade needs"),
                    ),
                }
            }
        }
    }

    /// Judges, from the pods and the kernel, the stop of `p` to run another version: the first
    /// one of its component starts that component's phase, which needs every component it waits
    /// for (transitively, in the requested strategy) to have been seen upgraded and functional
    /// since its own last upgrade restart. Whatever the policy announced or not. (A dependency
    /// that a later fault or eviction breaks does not make the order wrong.)
    fn check_upgrade_advance(&mut self, p: PodId) {
        let Some(upgrade) = &self.upgrade else { return };
        let component = self.pods[p].component;
        self.tracker.functional_seen.retain(|c| *c != component);
        if self.tracker.advanced.contains(&component) {
            return;
        }
        let mut needed: Vec<Component> = upgrade.strategy.waits_for(component).to_vec();
        let mut i = 0;
        while i < needed.len() {
            for &d in upgrade.strategy.waits_for(needed[i]) {
                if !needed.contains(&d) {
                    needed.push(d);
                }
            }
            i += 1;
        }
        self.tracker.advanced.push(component);
        let name = self.pods[p].name.clone();
        for d in needed {
            if self.tracker.functional_seen.contains(&d) {
                continue;
            }
            if let Err(why) = self.functional_gate(d) {
                self.count_unsafe(
                    |u| &mut u.phase_advanced_on_failed_gate,
                    format!(
                        "{component} phase started (stop of {name}) while the {d} gate fails: {why}"
                    ),
                );
                return;
            }
        }
    }

    /// Judges a restart of `p` onto `version` (another than it runs) from what was asked of
    /// the cluster: never after the policy said it halted, never onto a version the cluster is
    /// not going to (only the requested target, or what it ran before its upgrades for a
    /// rollback), no more CNs moving at once than the upgrade's width, and no CN onto a release
    /// of an older catalog than its CNs reached.
    fn check_upgrade_move(&mut self, p: PodId, version: &str) {
        let name = self.pods[p].name.clone();
        let component = self.pods[p].component;
        let catalog = mo_core::generation::catalog(version);
        if component == Component::Cn
            && let (Some(own), Some(reached)) = (catalog, self.catalog_reached)
            && own < reached
        {
            self.count_unsafe(
                |u| &mut u.cn_sent_back_past_its_catalog,
                format!("{name} restarted onto {version} (catalog {own:?}) after CNs moved the catalog to {reached:?}"),
            );
        }
        if self.tracker.halted {
            self.count_unsafe(
                |u| &mut u.restarted_while_halted,
                format!("{name} restarted onto {version} after the rollout halted"),
            );
        }
        // Judged against what was asked: a restart driven by hand in a test, with no upgrade
        // requested, is not.
        let Some(target) = self.upgrade.as_ref().map(|u| u.target_version.as_str()) else {
            return;
        };
        let original = self
            .tracker
            .original_versions
            .get(&component)
            .is_some_and(|v| v.contains(version));
        if target != version && !original {
            self.count_unsafe(
                |u| &mut u.moved_to_abandoned_version,
                format!("{name} restarted onto {version}, while the cluster goes to {target}"),
            );
        }
        if component == Component::Cn && self.policy.name() == "safe" {
            self.tracker.cns_moving.insert(name.clone());
            // A pod removed for good (a scale-in or pool reclaim during its restart) is no
            // longer moving.
            let live: BTreeSet<String> = self
                .live_pods()
                .map(|q| self.pods[q].name.clone())
                .collect();
            self.tracker.cns_moving.retain(|n| live.contains(n));
            let cns = self
                .live_pods()
                .filter(|&q| self.pods[q].component == Component::Cn)
                .count();
            let width = self.scenario.safe.cn_max_unavailable.of(cns);
            if self.tracker.cns_moving.len() > width {
                let moving = self
                    .tracker
                    .cns_moving
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ");
                self.count_unsafe(
                    |u| &mut u.cns_restarted_beyond_width,
                    format!("{moving} restarting onto another version at once (width {width})"),
                );
            }
        }
    }

    /// The upgrade, judged from the ground truth: every pod runs the target, and every
    /// component was seen working on it since its last upgrade restart (a later eviction or
    /// fault is the business of that drain or fault, not of the upgrade).
    pub(crate) fn upgrade_applied(&self) -> Result<(), String> {
        let Some(upgrade) = &self.upgrade else {
            return Ok(());
        };
        // Pods are recreated the instant they go: the live pods are every pod there is to be.
        if let Some(p) = self
            .live_pods()
            .find(|&p| self.pods[p].version != upgrade.target_version)
        {
            return Err(format!(
                "{} runs {}",
                self.pods[p].name, self.pods[p].version
            ));
        }
        for c in Component::ALL {
            if !self.tracker.functional_seen.contains(&c) {
                self.functional_gate(c)
                    .map_err(|why| format!("{c}: {why}"))?;
            }
        }
        Ok(())
    }

    /// A TN deleted through a real API server starts again: the deletion was the one restart
    /// an upgrade needs only if the new instance runs a version the TN was not restarted to yet.
    pub(crate) fn judge_api_tn_restart(&mut self, p: PodId) {
        let Some(from) = self.tn_deleted_from.take() else {
            return;
        };
        let to = self.pods[p].version.clone();
        if to != from && !self.tn_restarts_to.contains(&to) {
            self.tn_restarts_to.push(to);
        } else {
            let name = self.pods[p].name.clone();
            self.count_unsafe(
                |u| &mut u.tn_stopped_without_need,
                format!("{name} was deleted on {from} and came back on {to}: no upgrade needed it"),
            );
        }
    }

    /// The true functional gate of a finished phase (what the reports ask to wait for).
    pub(crate) fn functional_gate(&self, component: Component) -> Result<(), String> {
        let target = self.upgrade.as_ref().map(|u| u.target_version.clone());
        let pods: Vec<PodId> = self
            .live_pods()
            .filter(|&p| self.pods[p].component == component)
            .collect();
        for &p in &pods {
            let pod = &self.pods[p];
            if !pod.ready {
                return Err(format!("{} not Ready", pod.name));
            }
            if target.as_ref().is_some_and(|t| &pod.version != t) {
                return Err(format!("{} still on {}", pod.name, pod.version));
            }
        }
        match component {
            Component::Log => {
                for s in &self.shards {
                    if s.leader.is_none() {
                        return Err(format!("shard {} has no leader", s.id));
                    }
                    if let Some(r) = s
                        .replicas
                        .iter()
                        .find(|r| r.state != ReplicaState::Joined { caught_up: true })
                    {
                        return Err(format!("shard {}: {} not caught up", s.id, r.store));
                    }
                }
                Ok(())
            }
            Component::Tn => {
                if self.tn.phase != TnPhase::Running {
                    return Err("TN not running".into());
                }
                if !self.wal_available() {
                    return Err("TN cannot commit its WAL".into());
                }
                Ok(())
            }
            Component::Cn => {
                for &p in &pods {
                    let Some(cn) = self.cns.get(&p) else {
                        return Err(format!("{} has no CN process", self.pods[p].name));
                    };
                    let registered = self.hakeeper.cns.get(&cn.uuid).is_some_and(|r| {
                        r.heard_from == cn.epoch
                            && r.work_state == WorkState::Working
                            && self.now - r.last_heartbeat <= self.heartbeat_intervals().cn_fresh()
                    });
                    if !registered {
                        return Err(format!(
                            "{} is not registered with HAKeeper as its new instance (Working, heartbeating)",
                            self.pods[p].name
                        ));
                    }
                }
                Ok(())
            }
            Component::Proxy => {
                if self.any_proxy_can_route() {
                    Ok(())
                } else {
                    Err("no proxy can route to a Working CN".into())
                }
            }
        }
    }
}
