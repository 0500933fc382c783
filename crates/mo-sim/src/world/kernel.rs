//! The MatrixOne kernel's processes: LOG shards (Raft), HAKeeper, the TN with its WAL, CN start
//! and shutdown, and the proxy. The lock service is in `lockservice.rs`. Rules and defaults
//! follow `shared/reference/matrixone.md` and `docs/fidelity.md`.

use super::*;

pub(crate) fn majority(replicas: usize) -> usize {
    replicas / 2 + 1
}

impl Shard {
    pub(crate) fn caught_up(&self) -> usize {
        self.replicas
            .iter()
            .filter(|r| r.state == ReplicaState::Joined { caught_up: true })
            .count()
    }

    /// A shard commits only with a leader and a live, caught-up majority.
    pub(crate) fn can_commit(&self) -> bool {
        self.leader.is_some() && self.caught_up() >= majority(self.replicas.len())
    }
}

impl Simulation {
    // ----------------------------------------------------------------- LOG

    pub(crate) fn hakeeper_available(&self) -> bool {
        self.shards[0].can_commit() && self.hakeeper.outage_until.is_none()
    }

    pub(crate) fn wal_available(&self) -> bool {
        self.shards[1].can_commit()
    }

    pub(crate) fn log_store_started(&mut self, p: PodId, epoch: u64) {
        // LOG has no readiness probe: Ready means "container started", long before the
        // replicas have rejoined and caught up (the gap behind incident 002).
        self.set_ready(p, true);
        let store = self.pods[p].name.clone();
        for s in 0..self.shards.len() {
            for r in 0..self.shards[s].replicas.len() {
                if self.shards[s].replicas[r].store == store {
                    self.shards[s].replicas[r].state = ReplicaState::Replaying;
                    self.shards[s].replicas[r].epoch = epoch;
                    self.after(
                        self.t.log_rejoin,
                        Ev::LogJoined {
                            shard: s,
                            replica: r,
                            epoch,
                        },
                    );
                }
            }
        }
    }

    pub(crate) fn log_store_stopped(&mut self, store: &str) {
        for s in 0..self.shards.len() {
            for r in 0..self.shards[s].replicas.len() {
                if self.shards[s].replicas[r].store == store {
                    self.shards[s].replicas[r].state = ReplicaState::Down;
                    if self.shards[s].leader == Some(r) {
                        self.shards[s].leader = None;
                        // Catching up needs a leader: every lagging replica starts over.
                        for replica in &mut self.shards[s].replicas {
                            replica.catch_up_generation += 1;
                        }
                        let id = self.shards[s].id;
                        self.log("raft", || format!("shard {id}: leader {store} lost"));
                        self.maybe_schedule_election(s);
                    }
                }
            }
        }
        self.on_log_change();
    }

    pub(crate) fn log_joined(&mut self, s: usize, r: usize, epoch: u64) {
        let replica = &self.shards[s].replicas[r];
        if replica.epoch != epoch || replica.state != ReplicaState::Replaying {
            return;
        }
        let (id, store) = (self.shards[s].id, replica.store.clone());
        // A shard that never had a leader (a new cluster) has no log to catch up on.
        let fresh_shard = self.shards[s].term == 0;
        self.shards[s].replicas[r].state = ReplicaState::Joined {
            caught_up: fresh_shard,
        };
        self.log("raft", || {
            format!("shard {id}: {store} rejoined, catching up")
        });
        if self.shards[s].leader.is_some() {
            let generation = self.shards[s].replicas[r].catch_up_generation;
            self.after(
                self.t.log_catch_up,
                Ev::LogCaughtUp {
                    shard: s,
                    replica: r,
                    epoch,
                    generation,
                },
            );
        } else {
            self.maybe_schedule_election(s);
        }
    }

    /// Catching up needs a leader for the whole catch-up time (no leaderless gap).
    pub(crate) fn log_caught_up(&mut self, s: usize, r: usize, epoch: u64, generation: u64) {
        let shard = &self.shards[s];
        let replica = &shard.replicas[r];
        if replica.epoch != epoch
            || replica.catch_up_generation != generation
            || shard.leader.is_none()
            || replica.state != (ReplicaState::Joined { caught_up: false })
        {
            return;
        }
        self.shards[s].replicas[r].state = ReplicaState::Joined { caught_up: true };
        let (id, store) = (self.shards[s].id, self.shards[s].replicas[r].store.clone());
        self.log("raft", || format!("shard {id}: {store} caught up"));
        self.on_log_change();
    }

    fn maybe_schedule_election(&mut self, s: usize) {
        if self.shards[s].leader.is_none() && !self.shards[s].election_scheduled {
            self.shards[s].election_scheduled = true;
            self.after(self.t.log_election, Ev::LogElection { shard: s });
        }
    }

    pub(crate) fn log_election(&mut self, s: usize) {
        self.shards[s].election_scheduled = false;
        if self.shards[s].leader.is_some() {
            return;
        }
        let shard = &self.shards[s];
        let joined: Vec<usize> = (0..shard.replicas.len())
            .filter(|&r| matches!(shard.replicas[r].state, ReplicaState::Joined { .. }))
            .collect();
        if joined.len() < majority(shard.replicas.len()) {
            return; // a later rejoin schedules the next election
        }
        // The most up-to-date candidate wins.
        let leader = joined
            .iter()
            .copied()
            .find(|&r| shard.replicas[r].state == ReplicaState::Joined { caught_up: true })
            .unwrap_or(joined[0]);
        let shard = &mut self.shards[s];
        shard.leader = Some(leader);
        shard.term += 1;
        shard.replicas[leader].state = ReplicaState::Joined { caught_up: true };
        let term = shard.term;
        let (id, store) = (shard.id, shard.replicas[leader].store.clone());
        let lagging: Vec<(usize, u64, u64)> = joined
            .iter()
            .copied()
            .filter(|&r| shard.replicas[r].state == ReplicaState::Joined { caught_up: false })
            .map(|r| {
                (
                    r,
                    shard.replicas[r].epoch,
                    shard.replicas[r].catch_up_generation,
                )
            })
            .collect();
        self.log("raft", || {
            format!("shard {id}: {store} elected leader (term {term})")
        });
        for (r, epoch, generation) in lagging {
            self.after(
                self.t.log_catch_up,
                Ev::LogCaughtUp {
                    shard: s,
                    replica: r,
                    epoch,
                    generation,
                },
            );
        }
        self.on_log_change();
    }

    /// Reacts to any change of LOG or HAKeeper availability.
    pub(crate) fn on_log_change(&mut self) {
        let available = self.hakeeper_available();
        if available != self.hakeeper.was_available {
            self.hakeeper.was_available = available;
            if available {
                // HAKeeper's clock is its replicated tick, which does not advance while its shard
                // cannot commit: every record is as old as it was when the shard stopped.
                if let Some(since) = self.hakeeper.ticks_paused_since.take() {
                    let paused = self.now - since;
                    for record in self.hakeeper.cns.values_mut() {
                        record.last_heartbeat += paused;
                    }
                    for record in self.hakeeper.log_stores.values_mut() {
                        record.last_heartbeat += paused;
                    }
                    for last in self.hakeeper.proxies.values_mut() {
                        *last += paused;
                    }
                    if let Some((_, at)) = self.hakeeper.tn_last_heartbeat.as_mut() {
                        *at += paused;
                    }
                }
                self.log("hakeeper", || "available".into());
            } else {
                if !self.shards[0].can_commit() {
                    self.hakeeper.ticks_paused_since = Some(self.now);
                }
                self.log("hakeeper", || "unavailable".into());
            }
        }
        if available && self.tn.phase == TnPhase::WaitingForHakeeper {
            self.tn_begin_starting();
        }
        if available {
            self.finish_cn_starts();
        }
        if self.wal_available() {
            if self.tn.wal_blocked_since.take().is_some() {
                self.tn.wal_generation += 1;
                self.log("tn", || "WAL appends resume".into());
            }
            if matches!(self.tn.phase, TnPhase::Running | TnPhase::Stopping) {
                let waiting = self.tn.wal_waiting.clone();
                for x in waiting {
                    self.after(self.t.wal_append_latency, Ev::WalDone(x));
                }
            }
        } else if self.tn.phase == TnPhase::Running && self.tn.wal_blocked_since.is_none() {
            // The TN appends continuously (commits, checkpoints, logtail): it blocks at once.
            self.tn.wal_blocked_since = Some(self.now);
            self.tn.wal_block_cause = self.shard_outage_cause(1);
            self.tn.wal_try = 0;
            self.tn.wal_generation += 1;
            let deadline = self.now + self.t.wal_try_timeout.millis();
            let (epoch, generation) = (self.tn.epoch, self.tn.wal_generation);
            self.schedule(deadline, Ev::TnWalDeadline { epoch, generation });
            self.log("tn", || {
                "WAL append blocked: log shard has no writable quorum".into()
            });
        }
    }

    // ---------------------------------------------------------- HAKeeper

    pub(crate) fn heartbeat_tick(&mut self) {
        if !self.hakeeper_available() {
            // During a reachability outage the HAKeeper leader still runs its expiry clock.
            if self.hakeeper.outage_until.is_some() && self.shards[0].can_commit() {
                self.expire_stores();
            }
            return;
        }
        if self.tn.phase == TnPhase::Running {
            self.hakeeper.tn_last_heartbeat = Some((self.tn.epoch, self.now));
        }
        self.log_store_heartbeats();
        self.proxy_heartbeats();
        // A CN beats on the tick its interval is due (half a tick early counts as due).
        let due = self.t.cn_heartbeat.millis() - Millis(self.t.heartbeat.millis().0 / 2);
        let beating: Vec<(PodId, String, u64)> =
            self.cns
                .iter()
                .filter(|(_, c)| c.phase == CnPhase::Running && c.heartbeats)
                .filter(|(_, c)| {
                    self.hakeeper.cns.get(&c.uuid).is_none_or(|r| {
                        r.heard_from != c.epoch || self.now - r.last_heartbeat >= due
                    })
                })
                .map(|(&p, c)| (p, c.uuid.clone(), c.epoch))
                .collect();
        for (p, uuid, epoch) in beating {
            self.cn_heartbeat(p, &uuid, epoch);
        }
        self.expire_stores();
        self.settle_pool();
        self.update_route_state();
    }

    /// Every running LOG store reports the replicas it runs, with the leader and term each
    /// follows (`LogStoreHeartbeat`); a replica still replaying its log is not running yet.
    fn log_store_heartbeats(&mut self) {
        let stores: Vec<String> = self
            .pods
            .iter()
            .filter(|p| p.component == Component::Log && p.process_alive && !p.sigterm_sent)
            .map(|p| p.name.clone())
            .collect();
        let mut lagging = false;
        for store in stores {
            let replicas = self
                .shards
                .iter()
                .enumerate()
                .filter_map(|(s, shard)| {
                    let r = shard.replicas.iter().find(|r| r.store == store)?;
                    if r.state == (ReplicaState::Joined { caught_up: false })
                        && shard.leader.is_some()
                    {
                        lagging = true;
                    }
                    matches!(r.state, ReplicaState::Joined { .. }).then_some(ReplicaReport {
                        shard: s,
                        leader: shard.leader,
                        term: shard.term,
                    })
                })
                .collect();
            self.hakeeper.log_stores.insert(
                store,
                LogStoreRecord {
                    last_heartbeat: self.now,
                    replicas,
                },
            );
        }
        if lagging {
            self.saw("LOG replica following its leader before it caught up");
        }
    }

    /// A running proxy heartbeats every `proxy_heartbeat` (registering at its first).
    fn proxy_heartbeats(&mut self) {
        let due = self.t.proxy_heartbeat.millis() - Millis(self.t.heartbeat.millis().0 / 2);
        let beating: Vec<String> = self
            .proxies
            .iter()
            .filter(|(p, x)| x.running && self.pods[**p].process_alive)
            .map(|(&p, _)| self.pods[p].name.clone())
            .filter(|name| {
                self.hakeeper
                    .proxies
                    .get(name)
                    .is_none_or(|last| self.now - *last >= due)
            })
            .collect();
        for name in beating {
            self.hakeeper.proxies.insert(name, self.now);
        }
    }

    /// A pooled CN whose claim was released becomes Idle once its sessions have moved.
    fn settle_pool(&mut self) {
        let settled: Vec<PodId> = self
            .cns
            .iter()
            .filter(|(p, cn)| {
                self.pods[**p].pool_phase == Some(PoolPhase::Draining) && cn.sessions.is_empty()
            })
            .map(|(&p, _)| p)
            .collect();
        for p in settled {
            self.pods[p].pool_phase = Some(PoolPhase::Idle);
            let name = self.pods[p].name.clone();
            self.log("pool", || format!("{name}: sessions moved, Idle"));
        }
    }

    fn cn_heartbeat(&mut self, p: PodId, uuid: &str, epoch: u64) {
        let version = self.pods[p].version.clone();
        match self.hakeeper.cns.get_mut(uuid) {
            Some(record) => {
                record.last_heartbeat = self.now;
                record.pod = p;
                record.heard_from = epoch;
                record.version = version;
            }
            None => {
                // A new or expired CN (re)registers with its initial work state
                // (`init-work-state`): a Draining mark set before the expiry is lost unless
                // that is Draining too.
                let work_state = self.cn_init_work_state;
                self.hakeeper.cns.insert(
                    uuid.to_string(),
                    CnRecord {
                        pod: p,
                        epoch,
                        heard_from: epoch,
                        work_state,
                        last_heartbeat: self.now,
                        version,
                    },
                );
                let name = self.pods[p].name.clone();
                self.log("hakeeper", || {
                    format!("CN {name} registered ({work_state:?})")
                });
            }
        }
    }

    fn expire_stores(&mut self) {
        let expiry = self.t.cn_expiry.millis();
        let now = self.now;
        let expired: Vec<String> = self
            .hakeeper
            .cns
            .iter()
            .filter(|(_, r)| now - r.last_heartbeat > expiry)
            .map(|(u, _)| u.clone())
            .collect();
        for uuid in expired {
            self.hakeeper.cns.remove(&uuid);
            self.log("hakeeper", || format!("CN {uuid} expired: record deleted"));
        }
        let tn_expiry = self.t.tn_expiry.millis();
        if self
            .hakeeper
            .tn_last_heartbeat
            .is_some_and(|(_, at)| now - at > tn_expiry)
        {
            self.hakeeper.tn_last_heartbeat = None;
            self.log("hakeeper", || "TN expired".into());
        }
        let log_expiry = self.t.log_store_expiry.millis();
        self.hakeeper
            .log_stores
            .retain(|_, r| now - r.last_heartbeat <= log_expiry);
        let proxy_expiry = self.t.proxy_expiry.millis();
        self.hakeeper
            .proxies
            .retain(|_, last| now - *last <= proxy_expiry);
    }

    // ---------------------------------------------------------------- TN

    pub(crate) fn wal_total_timeout(&self) -> Millis {
        self.tn_wal_tolerance
            .unwrap_or(self.t.wal_total_timeout.millis())
    }

    /// Leadership moves to a caught-up replica without a leaderless gap.
    pub(crate) fn transfer_leader(
        &mut self,
        shard_id: u64,
        to_store: &str,
    ) -> Result<(), mo_core::ActionError> {
        use mo_core::ActionError;
        if !self.leader_transfer {
            return Err(ActionError::Unsupported(
                "logservice method type TransferLeader".into(),
            ));
        }
        let s = self
            .shards
            .iter()
            .position(|x| x.id == shard_id)
            .ok_or_else(|| ActionError::DoesNotExist(format!("shard {shard_id}")))?;
        if !self.shards[0].can_commit() {
            return Err(ActionError::Unavailable(
                "HAKeeper shard has no leader".into(),
            ));
        }
        let shard = &self.shards[s];
        let to = shard
            .replicas
            .iter()
            .position(|r| r.store == to_store)
            .ok_or_else(|| ActionError::DoesNotExist(format!("{to_store} in shard {shard_id}")))?;
        if shard.leader.is_none() {
            return Err(ActionError::Unavailable(format!(
                "shard {shard_id} has no leader"
            )));
        }
        if shard.replicas[to].state != (ReplicaState::Joined { caught_up: true }) {
            return Err(ActionError::Conflict(format!(
                "{to_store} is not caught up"
            )));
        }
        let term = shard.term;
        self.after(
            self.t.log_leader_transfer,
            Ev::LeaderTransfer { shard: s, to, term },
        );
        Ok(())
    }

    pub(crate) fn log_leader_transferred(&mut self, s: usize, to: usize, term: u64) {
        let shard = &mut self.shards[s];
        if shard.term != term
            || shard.leader.is_none()
            || shard.replicas[to].state != (ReplicaState::Joined { caught_up: true })
        {
            return;
        }
        shard.leader = Some(to);
        shard.term += 1;
        let (id, store, term) = (shard.id, shard.replicas[to].store.clone(), shard.term);
        self.log("raft", || {
            format!("shard {id}: leadership transferred to {store} (term {term})")
        });
    }

    pub(crate) fn tn_process_started(&mut self, p: PodId, epoch: u64) {
        self.judge_api_tn_restart(p);
        self.tn.pod = p;
        self.tn.epoch = epoch;
        self.tn.phase = TnPhase::WaitingForHakeeper;
        // The allocator lives in memory: a restart starts a new, empty one (v1.2.4
        // `tnservice/store.go` `initLockTableAllocator`). It knows no service and no bind, so
        // every CN's keepalive is refused and the CN drops its lock tables
        // (`lock_table_keeper.go` `doKeepLockTableBind`): every lock held across the restart is
        // gone, and its transaction aborts at COMMIT. Restart marks and drain ids are lost.
        // The CNs keep their lock tables (and the transactions they count) until their first
        // keepalive to the new allocator is refused (`tn_started`).
        self.tn.allocator = Allocator::default();
        self.tn.binds_lost_up_to = self.bind_version_bump;
        self.kernel_drains.clear();
        for cn in self.cns.values_mut() {
            cn.kernel_drain = None;
        }
        self.tn.wal_waiting.clear();
        self.tn.wal_blocked_since = None;
        self.tn.wal_generation += 1;
        if self.hakeeper_available() {
            self.tn_begin_starting();
        } else {
            self.after(self.t.tn_hakeeper_wait, Ev::TnHakeeperDeadline(epoch));
        }
    }

    fn tn_begin_starting(&mut self) {
        self.tn.phase = TnPhase::Starting;
        self.after(self.t.tn_start, Ev::TnStarted(self.tn.epoch));
    }

    pub(crate) fn tn_started(&mut self, epoch: u64) {
        if self.tn.epoch != epoch || self.tn.phase != TnPhase::Starting {
            return;
        }
        self.tn.phase = TnPhase::Running;
        self.tn.allocator.checks_since = self.now;
        let p = self.tn.pod;
        self.set_ready(p, true);
        self.log("tn", || "running".into());
        // Every CN's next keepalive reaches an allocator that does not know it: refused, so
        // the CN drops the lock tables it owned (`lock_table_keeper.go` `doKeepLockTableBind`).
        let open: Vec<(PodId, u64)> = self
            .cns
            .iter()
            .filter(|(_, c)| c.lock_open)
            .map(|(&p, c)| (p, c.epoch))
            .collect();
        for (p, epoch) in open {
            self.schedule_keepalive(p, epoch);
        }
        self.on_log_change();
        self.finish_cn_starts();
    }

    /// CNs waiting at start for HAKeeper and a TN go on once both are there.
    fn finish_cn_starts(&mut self) {
        let starting: Vec<PodId> = self
            .cns
            .iter()
            .filter(|(_, c)| c.phase == CnPhase::Starting)
            .map(|(&p, _)| p)
            .collect();
        for p in starting {
            self.try_finish_cn_start(p);
        }
    }

    pub(crate) fn tn_hakeeper_deadline(&mut self, epoch: u64) {
        if self.tn.epoch == epoch && self.tn.phase == TnPhase::WaitingForHakeeper {
            let cause = if self.hakeeper.outage_until.is_some() {
                Cause::Involuntary
            } else {
                self.shard_outage_cause(0)
            };
            self.tn_fatal(
                "cannot connect to HAKeeper: context deadline exceeded",
                cause,
            );
        }
    }

    /// The first append lasts `wal_try_timeout`; then tries of that length are retried (after a
    /// doubling backoff, none in v1.2.4) until `wal_total_timeout` of retrying has passed: the
    /// TN panics at the end of the try that crosses it (v1.2.4 `driverAppender.append`,
    /// `RetryWithTimeout`: ≈ 3 min 10 s after the first blocked append).
    pub(crate) fn tn_wal_deadline(&mut self, epoch: u64, generation: u64) {
        if self.tn.epoch != epoch || self.tn.wal_generation != generation {
            return;
        }
        let Some(since) = self.tn.wal_blocked_since else {
            return;
        };
        let first_try = self.t.wal_try_timeout.millis();
        let total = first_try + self.wal_total_timeout();
        if self.now - since >= total {
            let cause = self.wal_outage_cause();
            self.tn_fatal("FATAL: Wal-Cannot-Append: context deadline exceeded", cause);
            return;
        }
        self.tn.wal_try += 1;
        let initial = self.t.wal_backoff_initial.millis().0;
        let backoff = Millis(
            initial
                .saturating_mul(1 << (self.tn.wal_try - 1).min(20))
                .min(self.t.wal_backoff_max.millis().0),
        );
        let next_try = self.now + backoff;
        let deadline = (next_try + self.t.wal_try_timeout.millis()).min(since + total);
        self.schedule(deadline, Ev::TnWalDeadline { epoch, generation });
    }

    /// What keeps shard `s` from committing: an involuntary fault when a replica it lacks
    /// stopped of one (a crash, a failed node), else the voluntary stops.
    pub(crate) fn shard_outage_cause(&self, s: usize) -> Cause {
        let faulted = self.shards[s].replicas.iter().any(|r| {
            r.state != ReplicaState::Joined { caught_up: true }
                && self.log_stop_cause.get(&r.store) == Some(&Cause::Involuntary)
        });
        if faulted {
            Cause::Involuntary
        } else {
            Cause::Voluntary
        }
    }

    /// Why the WAL has been blocked: a fault if one kept its shard from committing at the
    /// block's start or keeps it now.
    pub(crate) fn wal_outage_cause(&self) -> Cause {
        match self.tn.wal_block_cause {
            Cause::Involuntary => Cause::Involuntary,
            Cause::Voluntary | Cause::TnRestart | Cause::ProxyRestart => self.shard_outage_cause(1),
        }
    }

    /// A fatal exit is the TN's own crash; the transactions it cuts and the exit itself are
    /// attributed to what made the kernel exit (`cause`).
    fn tn_fatal(&mut self, reason: &str, cause: Cause) {
        self.tn_fatal_exit_times.push(self.now);
        self.tn_fatal_exit_causes.push(cause);
        let n = self.tn_fatal_exit_times.len();
        let pod = self.pods[self.tn.pod].name.clone();
        self.trace(&pod, "fatal", || reason.to_string());
        self.log("tn", || format!("fatal exit #{n}: {reason}"));
        let p = self.tn.pod;
        self.crash_process(p, cause, true);
    }

    /// SIGTERM: the TN admits no new commit (CNs retry) and finishes the appends it has.
    pub(crate) fn tn_begin_stop(&mut self) {
        if self.tn.phase == TnPhase::Running {
            self.tn.phase = TnPhase::Stopping;
            self.log("tn", || "stopping: no new commits".into());
        } else {
            self.tn_stop("TN shutting down: connection closed");
        }
    }

    /// The TN stops serving: commits in flight end unknown (the client cannot tell).
    pub(crate) fn tn_stop(&mut self, error: &str) {
        self.tn.phase = TnPhase::Down;
        self.tn.wal_blocked_since = None;
        self.tn.wal_generation += 1;
        let waiting = std::mem::take(&mut self.tn.wal_waiting);
        for x in waiting {
            let cause = self.tn_cause();
            self.resolve_txn_aborted(x, Some(error), cause);
        }
    }

    // ---------------------------------------------------------------- CN

    pub(crate) fn cn_process_started(&mut self, p: PodId, epoch: u64) {
        let heartbeats = !self.fault_cn_never_heartbeats;
        let uuid = cn_uuid(&self.pods[p].name);
        let cn = self
            .cns
            .entry(p)
            .or_insert_with(|| Cn::new(uuid, epoch, CnPhase::Down));
        cn.phase = CnPhase::Starting;
        cn.epoch = epoch;
        cn.lock_open = false;
        cn.heartbeats = heartbeats;
        cn.restart_mode = RestartMode::None;
        cn.restart_time = None;
        cn.kernel_drain = None;
        cn.keepalive_due = false;
        cn.holders.clear();
        cn.stale_holders.clear();
        cn.sessions.clear();
        self.after(self.t.cn_start, Ev::CnStarted(p, epoch));
        let limit = self.t.cn_hakeeper_wait.millis() + self.t.cn_tn_wait.millis();
        self.schedule(self.now + limit, Ev::CnStartDeadline(p, epoch));
    }

    pub(crate) fn cn_started(&mut self, p: PodId, epoch: u64) {
        if self.cns.get(&p).is_some_and(|c| c.epoch == epoch) {
            self.try_finish_cn_start(p);
        }
    }

    pub(crate) fn try_finish_cn_start(&mut self, p: PodId) {
        let Some(cn) = self.cns.get(&p) else {
            return;
        };
        let booted = self.now - self.pods[p].last_start >= self.t.cn_start.millis();
        if cn.phase != CnPhase::Starting
            || !booted
            || !self.hakeeper_available()
            || self.tn.phase != TnPhase::Running
        {
            return;
        }
        if !self.catalog_allows(p) {
            return;
        }
        let Some(cn) = self.cns.get(&p) else {
            return;
        };
        let epoch = cn.epoch;
        let uuid = cn.uuid.clone();
        let cn = self.cns.get_mut(&p).expect("checked above");
        cn.phase = CnPhase::Running;
        cn.lock_open = true;
        self.set_ready(p, true);
        if self
            .tn
            .allocator
            .binds
            .values()
            .any(|b| b.uuid == uuid && b.owner.pod == p && b.owner.epoch != epoch)
        {
            self.saw("CN restarted while its old instance's binds were still valid");
        }
        // Same UUID, new service id (start time + UUID, `lockservice/service.go`): the binds
        // of the old instance stay valid until the allocator invalidates them (`bind_invalidate`);
        // until then the new instance answers their lockers "bind changed".
        let name = self.pods[p].name.clone();
        self.log("cn", || format!("{name} running"));
        if self.hakeeper_available() && self.cns[&p].heartbeats {
            self.cn_heartbeat(p, &uuid, epoch);
        }
        self.update_route_state();
    }

    /// The upgrade framework at a CN's start (`pkg/bootstrap/service_upgrade.go`): a release
    /// of an older catalog than the cluster's exits ("cannot startup a old version"); a newer
    /// one moves the catalog forward (its upgrade steps are not modelled: they run in the
    /// background of a running CN).
    fn catalog_allows(&mut self, p: PodId) -> bool {
        let catalog = mo_core::generation::catalog(&self.pods[p].version);
        match (catalog, self.catalog_reached) {
            (Some(own), Some(reached)) if own < reached => {
                let name = self.pods[p].name.clone();
                let version = self.pods[p].version.clone();
                self.log("cn", || {
                    format!(
                        "{name}: fatal: cannot startup a old version {version} to join cluster \
                         (catalog {reached:?})"
                    )
                });
                self.saw("CN of an older catalog stopped at start");
                self.crash_process(p, Cause::Involuntary, true);
                false
            }
            (Some(own), reached) => {
                self.catalog_reached = Some(reached.map_or(own, |r| r.max(own)));
                true
            }
            (None, _) => true,
        }
    }

    pub(crate) fn cn_start_deadline(&mut self, p: PodId, epoch: u64) {
        if self
            .cns
            .get(&p)
            .is_some_and(|c| c.epoch == epoch && c.phase == CnPhase::Starting)
        {
            let name = self.pods[p].name.clone();
            self.log("cn", || {
                format!("{name}: panic: cannot find HAKeeper/TN at start")
            });
            self.crash_process(p, Cause::Involuntary, true);
        }
    }

    /// SIGTERM (or a crash): heartbeats stop, the frontend closes (sessions end), then the
    /// lock service closes — without telling the allocator.
    pub(crate) fn cn_begin_shutdown(&mut self, p: PodId, cause: Cause) {
        let Some(cn) = self.cns.get_mut(&p) else {
            return;
        };
        if matches!(cn.phase, CnPhase::Down | CnPhase::Stopping) && !cn.lock_open {
            return;
        }
        cn.phase = CnPhase::Stopping;
        cn.stop_cause = cause;
        let me = Instance {
            pod: p,
            epoch: cn.epoch,
        };
        let sessions: Vec<ClientId> = std::mem::take(&mut cn.sessions).into_iter().collect();
        for c in sessions {
            self.session_broken(c, "connection closed by CN", cause);
        }
        self.end_background_work_on(me, cause);
        self.update_route_state();
    }

    pub(crate) fn cn_lock_close(&mut self, p: PodId, epoch: u64) {
        let Some(cn) = self.cns.get_mut(&p) else {
            return;
        };
        if cn.epoch != epoch || !cn.lock_open {
            return;
        }
        cn.lock_open = false;
        let name = self.pods[p].name.clone();
        self.log("cn", || format!("{name}: lock service closed"));
        self.schedule_invalidation(Instance { pod: p, epoch });
    }

    pub(crate) fn cn_process_exited(&mut self, p: PodId) {
        let epoch = self.pods[p].epoch;
        let Some(cn) = self.cns.get_mut(&p) else {
            return;
        };
        cn.phase = CnPhase::Down;
        let was_open = std::mem::replace(&mut cn.lock_open, false);
        let sessions: Vec<ClientId> = std::mem::take(&mut cn.sessions).into_iter().collect();
        let cause = cn.stop_cause;
        for c in sessions {
            self.session_broken(c, "connection closed by CN", cause);
        }
        let me = Instance { pod: p, epoch };
        if was_open {
            self.schedule_invalidation(me);
        }
        // Owners that still count this instance's transactions release them at their orphan
        // check once it has been silent for `RemoteLockTimeout` and fails validation.
        let owners: Vec<(PodId, u64)> = self
            .cns
            .iter()
            .filter(|(_, o)| o.lock_open && o.stale_holders.values().any(|r| *r == me))
            .map(|(&o, c)| (o, c.epoch))
            .collect();
        for (o, o_epoch) in owners {
            let at = self.orphan_check_at(o, self.now);
            self.schedule(at, Ev::OrphanCheck(o, o_epoch));
        }
    }

    // ------------------------------------------------------------- Proxy

    pub(crate) fn proxy_process_started(&mut self, p: PodId, epoch: u64) {
        let proxy = self.proxies.entry(p).or_insert_with(|| Proxy {
            running: false,
            epoch,
            cache: Vec::new(),
            stop_cause: None,
        });
        proxy.running = false;
        proxy.stop_cause = None;
        proxy.epoch = epoch;
        self.after(self.t.proxy_start, Ev::ProxyStarted(p, epoch));
    }

    pub(crate) fn proxy_started(&mut self, p: PodId, epoch: u64) {
        if self.proxies.get(&p).is_some_and(|x| x.epoch == epoch) && self.pods[p].process_alive {
            self.proxies.get_mut(&p).expect("checked").running = true;
            self.set_ready(p, true);
            // It loads the CN list at start, then every `proxy_refresh` on its own timer.
            self.refresh_proxy(p);
            self.update_route_state();
            self.after(self.t.proxy_refresh, Ev::ProxyRefresh(p, epoch));
        }
    }

    /// Stops accepting; closes idle client connections now and the others after their
    /// transaction (a proxy cannot hand a client connection to another proxy).
    /// SIGTERM: the kernel's proxy closes every client connection at once (v1.2.4
    /// `proxy/server.go` `Server.Close` → goetty `Disconnect()` of each session), cutting the
    /// transaction running on each; then it exits.
    pub(crate) fn proxy_begin_shutdown(&mut self, p: PodId) {
        self.close_proxy_connections(p);
        self.update_route_state();
    }

    /// A stopping proxy exits once its connections are closed (at once, see above).
    pub(crate) fn maybe_proxy_exit(&mut self, p: PodId) {
        let pod = &self.pods[p];
        if !pod.sigterm_sent || !pod.process_alive || pod.component != Component::Proxy {
            return;
        }
        let busy = self
            .clients
            .iter()
            .any(|c| c.proxy == Some(p) && c.txn.is_some());
        if !busy {
            let epoch = pod.epoch;
            self.after(self.t.proxy_shutdown, Ev::ProcessExit(p, epoch));
        }
    }

    pub(crate) fn proxy_process_exited(&mut self, p: PodId) {
        self.close_proxy_connections(p);
    }

    /// The operator restarts `p` and it is the only live proxy: what it cuts is counted apart
    /// (`Cause::ProxyRestart`). Whether the others are in their Service does not matter: a
    /// policy that took them out could have left them in.
    pub(crate) fn mark_only_proxy_restart(&mut self, p: PodId) {
        let only_proxy = self.pods[p].component == Component::Proxy
            && !self
                .proxies
                .iter()
                .any(|(&q, x)| q != p && x.running && self.pods[q].deletion.is_none());
        if only_proxy && let Some(proxy) = self.proxies.get_mut(&p) {
            proxy.stop_cause = Some(Cause::ProxyRestart);
        }
    }

    fn close_proxy_connections(&mut self, p: PodId) {
        if let Some(proxy) = self.proxies.get_mut(&p) {
            proxy.running = false;
        }
        let cause = self.pods[p]
            .deletion
            .as_ref()
            .map_or(Cause::Involuntary, |d| d.cause);
        let cause = match self.proxies.get(&p).and_then(|x| x.stop_cause) {
            Some(c) if cause == Cause::Voluntary => c,
            _ => cause,
        };
        for c in 0..self.clients.len() {
            if self.clients[c].proxy == Some(p) {
                // A COMMIT the proxy waited for in vain, because the TN is down or its WAL blocked of a fault, is
                // lost to that fault: it could not have ended otherwise.
                let stuck_on_failed_tn = self.clients[c]
                    .txn
                    .and_then(|x| self.txns.get(&x))
                    .is_some_and(|t| t.stage == TxnStage::Committing)
                    && (self.tn.phase != TnPhase::Running || self.tn.wal_blocked_since.is_some())
                    && self.tn_wait_cause() == Cause::Involuntary;
                let cause = if stuck_on_failed_tn {
                    Cause::Involuntary
                } else {
                    cause
                };
                self.session_broken(c, "connection closed by proxy", cause);
            }
        }
    }

    /// The proxy reloads its CN list from HAKeeper (a failed load keeps the old list).
    pub(crate) fn refresh_proxy(&mut self, p: PodId) {
        if !self.hakeeper_available() {
            return;
        }
        let cache: Vec<(String, WorkState)> = self
            .hakeeper
            .cns
            .iter()
            .map(|(u, r)| (u.clone(), r.work_state))
            .collect();
        if let Some(proxy) = self.proxies.get_mut(&p).filter(|x| x.running) {
            proxy.cache = cache;
        }
    }

    /// CN pod that serves `uuid` for the workload right now, if any.
    pub(crate) fn routable_cn(&self, uuid: &str, state: WorkState) -> Option<PodId> {
        if !matches!(state, WorkState::Working | WorkState::Unknown) {
            return None;
        }
        let record = self.hakeeper.cns.get(uuid)?;
        let p = record.pod;
        let cn = self.cns.get(&p)?;
        let pod = &self.pods[p];
        let serves_workload = matches!(pod.pool_phase, None | Some(PoolPhase::Bound));
        (cn.uuid == uuid
            && cn.phase == CnPhase::Running
            && pod.status == PodStatus::Running
            && pod.deletion.is_none()
            && serves_workload)
            .then_some(p)
    }

    pub(crate) fn update_route_state(&mut self) {
        self.route_ok = self.proxies.values().any(|proxy| {
            proxy.running
                && proxy
                    .cache
                    .iter()
                    .any(|(u, s)| self.routable_cn(u, *s).is_some())
        });
    }

    pub(crate) fn any_proxy_can_route(&self) -> bool {
        self.route_ok
    }

    /// Every 5 s the proxy moves sessions off Draining (or no longer routable) CNs, only
    /// between transactions.
    pub(crate) fn rebalance_sessions(&mut self) {
        for c in 0..self.clients.len() {
            if self.clients[c].txn.is_some() {
                // Not inside a transaction: the proxy records the intent and moves the
                // session when the transaction ends.
                if self.session_unroutable(c).is_some() {
                    self.clients[c].transfer_intent = true;
                }
                continue;
            }
            self.move_unroutable_session(c);
        }
    }

    /// The session's proxy, if the session sits on a CN that proxy no longer routes to.
    fn session_unroutable(&self, c: ClientId) -> Option<PodId> {
        let client = &self.clients[c];
        let (Some(session), Some(proxy_pod)) = (client.session, client.proxy) else {
            return None;
        };
        let proxy = self.proxies.get(&proxy_pod)?;
        let uuid = self.cns.get(&session.pod).map(|cn| cn.uuid.clone());
        let still_routable = uuid.is_some_and(|u| {
            proxy
                .cache
                .iter()
                .any(|(cu, s)| *cu == u && self.routable_cn(cu, *s) == Some(session.pod))
        });
        (!still_routable).then_some(proxy_pod)
    }

    /// Moves an idle session off a CN its proxy no longer routes to (between transactions).
    pub(crate) fn move_unroutable_session(&mut self, c: ClientId) {
        self.clients[c].transfer_intent = false;
        let Some(proxy_pod) = self.session_unroutable(c) else {
            return;
        };
        let session = self.clients[c].session.expect("has a session");
        if let Some(target) = self.pick_cn(proxy_pod)
            && target != session.pod
        {
            // The client's connection to the proxy stays; only the proxy's to the CN moves.
            let connected_at = self.clients[c].connected_at;
            self.drop_session(c);
            self.attach_session(c, proxy_pod, target);
            self.clients[c].connected_at = connected_at;
        }
    }
}
