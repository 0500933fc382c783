//! The lock service: the TN's lock-table allocator and its entries (one per CN process), each
//! CN's lock service with its bind keepalive, today's restart handshake, orphan and leaked
//! holders, bind invalidation, and the optional instance-bound drain extension. Rules follow
//! v1.2.4 `pkg/lockservice` (see `docs/fidelity.md`, "Lock service and the restart handshake").

use super::*;

impl Allocator {
    /// `getServiceBindsWithoutPrefix(uuid)`: the kernel walks a Go map and takes the first
    /// entry with that UUID, so with two (a CN restarted before its old entry went) either one
    /// answers, at random. `salt` tells apart the lookups of one instant; the choice depends on
    /// nothing but the instant, the salt and the UUID, so runs stay deterministic.
    pub(crate) fn entry_by_uuid(&self, uuid: &str, now: Millis, salt: u64) -> Option<Instance> {
        let matching: Vec<Instance> = self
            .services
            .iter()
            .filter(|(_, e)| e.uuid == uuid)
            .map(|(i, _)| *i)
            .collect();
        match matching.len() {
            0 => None,
            1 => Some(matching[0]),
            n => {
                let text = uuid
                    .bytes()
                    .fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b));
                let pick = splitmix(now.0 ^ salt.rotate_left(32) ^ text) % n as u64;
                Some(matching[pick as usize])
            }
        }
    }

    /// `GetBind` registers the asking service (`registerService`).
    pub(crate) fn register(&mut self, me: Instance, uuid: &str) {
        self.services.entry(me).or_insert_with(|| ServiceEntry {
            uuid: uuid.to_string(),
            status: EntryStatus::Enable,
            disabled_at: None,
            reported_txns: 0,
        });
    }

    /// `CanRestartService(uuid)` and `RemainTxnInService(uuid)` as the kernel answers them:
    /// (true, 0) for a UUID it has no entry for; −1 remaining while the entry has reported no
    /// transaction and cannot restart. Each call looks the UUID up anew.
    pub(crate) fn restart_answer(&self, uuid: &str, now: Millis) -> mo_core::RestartAnswer {
        let status = |salt| {
            self.entry_by_uuid(uuid, now, salt)
                .map(|i| &self.services[&i])
        };
        let can_restart = status(1).is_none_or(|e| e.status == EntryStatus::CanRestart);
        let remaining_txns = match status(2) {
            None => 0,
            Some(e) if e.reported_txns > 0 => e.reported_txns as i64,
            Some(_) => match status(3) {
                Some(e) if e.status == EntryStatus::CanRestart => 0,
                _ => -1,
            },
        };
        mo_core::RestartAnswer {
            can_restart,
            remaining_txns,
        }
    }
}

impl Simulation {
    /// When the allocator first finds an owner silent since `silent_since`: its check
    /// (`checkInvalidBinds`) runs every `keepBindTimeout` from the allocator's start and takes
    /// the services whose last keepalive is at least that old (`serviceBinds.timeout`), so the
    /// binds move 10–20 s after the owner went silent, by the timer's phase. (The owner's last
    /// keepalive came up to `bind_keepalive` before it closed: the model dates it at the close.)
    /// From v4.0 a service is taken only once silent for twice `keepBindTimeout`
    /// (`keepBindGraceFactor`): the binds move 20–30 s after, on an allocator of that release.
    pub(crate) fn bind_invalidation_at(&self, silent_since: Millis) -> Millis {
        let period = self.t.bind_invalidation.millis().0.max(1);
        let start = self.tn.allocator.checks_since.0;
        // The silence the allocator's release waits for, in rounds of 10 s (the default
        // `keepBindTimeout`); a release the table cannot place, v1.2's.
        let rounds_silent = mo_core::generation::Generation::of(&self.pods[self.tn.pod].version)
            .map_or(1, |g| g.facts().allocator_entry_linger.0 / 10_000)
            .max(1);
        let due = silent_since.0 + rounds_silent * period;
        let rounds = due.saturating_sub(start).div_ceil(period).max(1);
        Millis(start + rounds * period)
    }

    /// The instance's lock service stopped: the allocator removes its entry and invalidates
    /// its binds at the first check that finds it silent long enough and not answering. An
    /// entry disabled by a finished hand-over went silent when it was disabled (its keepalives
    /// are refused since), so it goes at the first check after the process is gone.
    pub(crate) fn schedule_invalidation(&mut self, me: Instance) {
        let disabled_at = self
            .tn
            .allocator
            .services
            .get(&me)
            .and_then(|e| e.disabled_at);
        let silent_since = disabled_at.map_or(self.now, |d| d.min(self.now));
        let mut at = self.bind_invalidation_at(silent_since);
        let period = self.t.bind_invalidation.millis();
        while at < self.now {
            at += period;
        }
        self.schedule(at, Ev::BindInvalidate(me.pod, me.epoch));
    }

    /// A CN process died without its shutdown (a crash, SIGKILL, its node failing): the locks
    /// its transactions hold in other CNs' lock tables are never unlocked. Their owners keep
    /// counting them (orphans) until the orphan check removes them.
    pub(crate) fn orphan_remote_locks(&mut self, p: PodId) {
        let Some(epoch) = self.cns.get(&p).map(|c| c.epoch) else {
            return;
        };
        let me = Instance { pod: p, epoch };
        let held: Vec<(TxnId, Instance)> = self
            .txns
            .iter()
            .filter(|(_, t)| t.cn == me)
            .flat_map(|(&x, t)| t.locks.iter().map(move |l| (x, l.owner)))
            .filter(|(_, owner)| *owner != me)
            .collect();
        for (x, owner) in held {
            if let Some(cn) = self.cns.get_mut(&owner.pod)
                && cn.epoch == owner.epoch
                && cn.holders.remove(&x)
            {
                cn.stale_holders.insert(x, me);
                self.saw("orphan locks of a CN that died without its shutdown");
            }
        }
    }

    /// The owner's orphan check (`service_remote.go` `unlockTimeoutRemoteTxn`) runs every
    /// `RemoteLockTimeout` from the lock service's start: the first round at or after `from`
    /// plus that timeout.
    pub(crate) fn orphan_check_at(&self, owner: PodId, from: Millis) -> Millis {
        let period = self.t.remote_lock_timeout.millis().0.max(1);
        let start = self.pods[owner].last_start.0;
        let due = from.0 + period;
        let rounds = due.saturating_sub(start).div_ceil(period).max(1);
        Millis(start + rounds * period)
    }

    /// Releases the transactions the owner counts whose CN instance is gone. The release first
    /// tells the allocator they cannot commit (`CannotCommit`): with the TN down, the next round.
    pub(crate) fn orphan_check(&mut self, p: PodId, epoch: u64) {
        if self.tn.phase != TnPhase::Running {
            if self
                .cns
                .get(&p)
                .is_some_and(|c| c.epoch == epoch && c.lock_open)
            {
                let at = self.orphan_check_at(p, self.now);
                self.schedule(at, Ev::OrphanCheck(p, epoch));
            }
            return;
        }
        let gone: Vec<TxnId> = match self.cns.get(&p) {
            Some(cn) if cn.epoch == epoch && cn.lock_open => cn
                .stale_holders
                .iter()
                .filter(|(_, r)| !self.instance_running(**r))
                .map(|(&x, _)| x)
                .collect(),
            _ => return,
        };
        if gone.is_empty() {
            return;
        }
        let cn = self.cns.get_mut(&p).expect("checked above");
        for x in &gone {
            cn.stale_holders.remove(x);
        }
        let (name, n) = (self.pods[p].name.clone(), gone.len());
        self.log("cn", || format!("{name}: {n} orphan transactions released"));
        self.check_unlock(p);
    }

    /// Whether that CN process still runs (its lock service can answer a validation).
    pub(crate) fn instance_running(&self, i: Instance) -> bool {
        self.cns
            .get(&i.pod)
            .is_some_and(|c| c.epoch == i.epoch && c.phase != CnPhase::Down)
    }

    /// The allocator removes a silent service: its entry goes, its binds become invalid and
    /// the next locker rebinds the table. The check asks the service first (`validateService`):
    /// a process that still runs keeps its entry.
    pub(crate) fn bind_invalidate(&mut self, p: PodId, epoch: u64) {
        if self.tn.phase != TnPhase::Running {
            return;
        }
        let owner = Instance { pod: p, epoch };
        if self.instance_running(owner) && self.cns[&p].lock_open {
            return;
        }
        self.tn.allocator.services.remove(&owner);
        let before = self.tn.allocator.binds.len();
        self.tn.allocator.binds.retain(|_, b| b.owner != owner);
        let moved = before - self.tn.allocator.binds.len();
        if moved > 0 {
            let name = self.pods[p].name.clone();
            self.log("allocator", || {
                format!("binds of silent {name} invalidated ({moved} tables)")
            });
        }
    }

    /// Every transaction the CN's lock service counts as active (`activeTxnHolder`): its own
    /// that locked anything (until their unlock starts), the remote ones holding locks in its
    /// tables, and the stale ones it never heard unlock. What "unlock success" waits for, and
    /// what `RemainTxnInService` reports.
    pub(crate) fn active_txns(&self, p: PodId) -> BTreeSet<TxnId> {
        let Some(cn) = self.cns.get(&p) else {
            return BTreeSet::new();
        };
        let me = Instance {
            pod: p,
            epoch: cn.epoch,
        };
        let mut active: BTreeSet<TxnId> = cn.holders.clone();
        active.extend(cn.stale_holders.keys().copied());
        active.extend(
            self.txns
                .iter()
                .filter(|(_, t)| {
                    t.cn == me && !t.locks.is_empty() && t.stage != TxnStage::Unlocking
                })
                .map(|(&x, _)| x),
        );
        active
    }

    pub(crate) fn schedule_keepalive(&mut self, p: PodId, epoch: u64) {
        if let Some(cn) = self.cns.get_mut(&p)
            && cn.epoch == epoch
            && !cn.keepalive_due
        {
            cn.keepalive_due = true;
            self.after(self.t.bind_keepalive, Ev::CnKeepalive(p, epoch));
        }
    }

    /// `SetRestartService(uuid)`: names a UUID, not an instance. The allocator marks the first
    /// entry with that UUID it finds (with two, either); one it does not know only gets logged.
    /// An entry already at "can restart" goes back to waiting for good (the wedge).
    pub(crate) fn set_restart_service(&mut self, uuid: &str) -> Result<(), mo_core::ActionError> {
        if self.tn.phase != TnPhase::Running {
            return Err(mo_core::ActionError::Unavailable(
                "lock allocator (TN) unavailable".into(),
            ));
        }
        if self
            .tn
            .allocator
            .services
            .values()
            .filter(|e| e.uuid == uuid)
            .count()
            > 1
        {
            self.saw("restart request while the allocator holds two entries for the UUID");
        }
        let Some(target) = self.tn.allocator.entry_by_uuid(uuid, self.now, 0) else {
            self.saw("restart request for a UUID the allocator does not know");
            self.log("allocator", || {
                format!("not found restart lock service {uuid}: answering (true, 0)")
            });
            return Ok(());
        };
        let entry = self
            .tn
            .allocator
            .services
            .get_mut(&target)
            .expect("found above");
        let wedged = entry.status == EntryStatus::CanRestart;
        entry.status = EntryStatus::Waiting;
        if wedged {
            self.saw("second restart request that wedged an entry");
            let name = self.pods[target.pod].name.clone();
            self.log("allocator", || {
                format!("restart requested again for {name} after it could restart: its entry waits for good")
            });
        }
        self.schedule_keepalive(target.pod, target.epoch);
        Ok(())
    }

    /// The CN's bind keepalive (every `bind_keepalive`), both sides: the CN reports its status
    /// and, while not Enable, the transactions it still counts; the allocator answers with its
    /// entry's status. A CN learns it is to restart at one keepalive (it then refuses new
    /// locks) and reports "unlock success" at a later one, once it counts no transaction; the
    /// allocator then disables the entry and invalidates its binds ("can restart").
    pub(crate) fn cn_keepalive(&mut self, p: PodId, epoch: u64) {
        let Some(cn) = self.cns.get_mut(&p) else {
            return;
        };
        if cn.epoch != epoch || !cn.lock_open {
            return;
        }
        cn.keepalive_due = false;
        if self.tn.phase != TnPhase::Running {
            // The keepalive fails; the CN changes nothing and tries again.
            if cn.restart_mode != RestartMode::None || cn.kernel_drain.is_some() {
                self.schedule_keepalive(p, epoch);
            }
            return;
        }
        if cn.kernel_drain.is_some() {
            self.extension_drain_keepalive(p);
            return;
        }
        self.check_unlock(p);
        let me = Instance { pod: p, epoch };
        let status = self.cns[&p].restart_mode;
        let active = if status == RestartMode::None {
            0
        } else {
            self.active_txns(p).len()
        };
        let Some(entry) = self
            .tn
            .allocator
            .services
            .get_mut(&me)
            .filter(|e| e.disabled_at.is_none())
        else {
            // Refused: the allocator does not know this service (a new allocator) or disabled
            // it. The CN drops the lock tables it owned; it keeps counting the transactions
            // that held locks in them, whose unlocks it will refuse.
            self.drop_local_lock_tables(p);
            return;
        };
        if status != RestartMode::None {
            entry.reported_txns = active;
        }
        let name = self.pods[p].name.clone();
        match status {
            RestartMode::None => {
                if entry.status != EntryStatus::Waiting {
                    return;
                }
                let cn = self.cns.get_mut(&p).expect("checked");
                cn.restart_mode = RestartMode::Waiting;
                cn.restart_time = Some(self.now);
                self.log("cn", || {
                    format!("{name}: restart requested, refusing new locks")
                });
            }
            RestartMode::Waiting => entry.status = EntryStatus::Waiting,
            RestartMode::UnlockSuccess => {
                entry.status = EntryStatus::CanRestart;
                entry.disabled_at = Some(self.now);
                self.tn.allocator.binds.retain(|_, b| b.owner != me);
                self.cns.get_mut(&p).expect("checked").confirmed_epoch = Some(epoch);
                self.log("cn", || {
                    format!("{name}: unlock success, tables handed over")
                });
            }
        }
        self.schedule_keepalive(p, epoch);
    }

    /// The CN's lock service saw its last counted transaction end while waiting to restart:
    /// "unlock success" (`service.go` `Unlock`); the allocator hears it at the next keepalive.
    pub(crate) fn check_unlock(&mut self, p: PodId) {
        let waiting = self
            .cns
            .get(&p)
            .is_some_and(|cn| cn.restart_mode == RestartMode::Waiting || cn.kernel_drain.is_some());
        if !waiting || !self.active_txns(p).is_empty() {
            return;
        }
        if let Some(cn) = self.cns.get_mut(&p)
            && cn.restart_mode == RestartMode::Waiting
        {
            cn.restart_mode = RestartMode::UnlockSuccess;
        }
        if self.cns[&p].kernel_drain.is_some() {
            self.extension_drain_keepalive(p);
        }
    }

    /// The keepalive was refused: the lock tables this instance owned are dropped. Remote
    /// transactions that held locks in them stay counted: their unlocks, sent under the old
    /// bind, are refused (`handleRemoteUnlock` → `getLocalLockTable` answers the new bind).
    fn drop_local_lock_tables(&mut self, p: PodId) {
        let Some(cn) = self.cns.get(&p) else {
            return;
        };
        let me = Instance {
            pod: p,
            epoch: cn.epoch,
        };
        let remote: Vec<(TxnId, Instance)> = cn
            .holders
            .iter()
            .filter_map(|x| self.txns.get(x).map(|t| (*x, t.cn)))
            .filter(|(_, requester)| *requester != me)
            .collect();
        if remote.is_empty() {
            return;
        }
        let cn = self.cns.get_mut(&p).expect("checked above");
        for (x, requester) in &remote {
            cn.holders.remove(x);
            cn.stale_holders.insert(*x, *requester);
        }
        self.saw("remote holders a lock owner keeps counting after a TN restart");
        let (name, n) = (self.pods[p].name.clone(), remote.len());
        self.log("cn", || {
            format!(
                "{name}: keepalive refused, lock tables dropped ({n} remote holders still counted)"
            )
        });
    }

    /// The optional instance-bound drain (not in the stock kernel): the CN refuses new locks
    /// and the drain is done once it counts no transaction.
    fn extension_drain_keepalive(&mut self, p: PodId) {
        let Some(cn) = self.cns.get_mut(&p) else {
            return;
        };
        let epoch = cn.epoch;
        if cn.restart_mode == RestartMode::None {
            cn.restart_mode = RestartMode::Waiting;
            cn.restart_time = Some(self.now);
        }
        if !self.active_txns(p).is_empty() {
            self.schedule_keepalive(p, epoch);
            return;
        }
        let owner = Instance { pod: p, epoch };
        self.tn.allocator.binds.retain(|_, b| b.owner != owner);
        let cn = self.cns.get_mut(&p).expect("checked above");
        cn.restart_mode = RestartMode::UnlockSuccess;
        cn.confirmed_epoch = Some(epoch);
        if let Some(id) = cn.kernel_drain
            && let Some(drain) = self.kernel_drains.get_mut(&id)
            && drain.state == KernelDrainState::Pending
        {
            drain.state = KernelDrainState::Done;
            let name = self.pods[p].name.clone();
            self.log("cn", || {
                format!("{name}: drain {id} done, tables handed over")
            });
        }
    }

    /// `BeginDrain(instance)`: only the live instance HAKeeper reports with that start epoch can
    /// be drained.
    pub(crate) fn begin_drain(
        &mut self,
        uuid: &str,
        start_epoch: u64,
    ) -> Result<u64, mo_core::ActionError> {
        use mo_core::ActionError;
        if !self.drain_protocol {
            return Err(ActionError::Unsupported("BeginDrain".into()));
        }
        if self.tn.phase != TnPhase::Running {
            return Err(ActionError::Unavailable(
                "lock allocator (TN) unavailable".into(),
            ));
        }
        let Some((&p, cn)) = self.cns.iter().find(|(_, c)| c.uuid == uuid && c.lock_open) else {
            return Err(ActionError::DoesNotExist(format!(
                "no running instance of CN {uuid}"
            )));
        };
        // The only instance id the kernel reports is its HAKeeper record's UpTime, which a
        // restart before the record expires keeps: the extension checks that, no more.
        let reported = self.hakeeper.cns.get(uuid).map(|r| r.epoch);
        if reported != Some(start_epoch) {
            return Err(ActionError::Conflict(format!(
                "instance mismatch: CN {uuid} reports start epoch {reported:?}, not {start_epoch}"
            )));
        }
        if let Some(id) = cn.kernel_drain
            && self
                .kernel_drains
                .get(&id)
                .is_some_and(|d| d.state != KernelDrainState::Cancelled)
        {
            return Ok(id); // idempotent
        }
        self.drain_counter += 1;
        let id = self.drain_counter;
        let instance = Instance {
            pod: p,
            epoch: cn.epoch,
        };
        self.kernel_drains.insert(
            id,
            KernelDrain {
                instance,
                state: KernelDrainState::Pending,
            },
        );
        self.cns.get_mut(&p).expect("found above").kernel_drain = Some(id);
        self.schedule_keepalive(p, instance.epoch);
        let name = self.pods[p].name.clone();
        self.log("allocator", || {
            format!("BeginDrain({name}, epoch {start_epoch}) -> drain {id}")
        });
        Ok(id)
    }

    pub(crate) fn cancel_drain(&mut self, id: u64) -> Result<(), mo_core::ActionError> {
        use mo_core::ActionError;
        if !self.drain_protocol {
            return Err(ActionError::Unsupported("CancelDrain".into()));
        }
        if self.tn.phase != TnPhase::Running {
            return Err(ActionError::Unavailable(
                "lock allocator (TN) unavailable".into(),
            ));
        }
        let drain = self
            .kernel_drains
            .get_mut(&id)
            .ok_or_else(|| ActionError::DoesNotExist(format!("drain {id}")))?;
        drain.state = KernelDrainState::Cancelled;
        let instance = drain.instance;
        if let Some(cn) = self.cns.get_mut(&instance.pod)
            && cn.epoch == instance.epoch
            && cn.kernel_drain == Some(id)
        {
            cn.kernel_drain = None;
            // Today's handshake, if also asked for this instance, keeps it restarting.
            let handshake = self
                .tn
                .allocator
                .services
                .get(&instance)
                .is_some_and(|e| e.status != EntryStatus::Enable);
            if !handshake {
                // Back in service: an earlier "done" no longer says anything about it.
                cn.restart_mode = RestartMode::None;
                cn.restart_time = None;
                cn.confirmed_epoch = None;
            }
        }
        Ok(())
    }

    pub(crate) fn query_drain(&self, drain: &KernelDrain) -> mo_core::DrainAnswer {
        use mo_core::DrainAnswer;
        match drain.state {
            KernelDrainState::Done => DrainAnswer::Done,
            KernelDrainState::Cancelled => DrainAnswer::Cancelled,
            KernelDrainState::Pending => match self.cns.get(&drain.instance.pod) {
                Some(cn) if cn.epoch == drain.instance.epoch && cn.lock_open => {
                    DrainAnswer::Pending {
                        remaining_txns: self.active_txns(drain.instance.pod).len() as u64,
                    }
                }
                _ => DrainAnswer::InstanceGone,
            },
        }
    }
}
