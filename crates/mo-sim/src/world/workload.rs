//! Clients running DML transactions through the proxy. Every transaction ends committed,
//! failed with a definite error, or unknown (the client cannot tell whether it committed).

use super::*;
use rand::Rng;

/// What the client is told.
#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    Committed,
    Failed(String, Cause),
    Unknown(String, Cause),
}

pub(crate) enum LockResult {
    Granted(HeldLock),
    /// The owner refuses new locks while it hands its tables over: retry shortly.
    Retry,
    /// The allocator (TN) is unreachable: the CN retries for `cn_tn_wait`.
    WaitForTn,
    Failed(String, Cause),
}

/// A lock refused with "retry for CN rolling restart" is asked again after this, for as long
/// as it takes: v1.2.4 `sql/colexec/lockop/lock_op.go` `canRetryLock` sleeps
/// `defaultWaitTimeOnRetryLock` (1 s) and `doLock` has no deadline.
const LOCK_RETRY: Millis = Millis(1_000);
const RECONNECT_DELAY: Millis = Millis(1_000);
/// The CN retries a failed remote unlock at once, asking the allocator each time whether the
/// bind changed: modelled as a look every 100 ms.
const UNLOCK_RETRY: Millis = Millis(100);
const TN_RETRY: Millis = Millis(500);

impl Simulation {
    fn wake_client(&mut self, c: ClientId, delay: Millis) {
        if !self.clients[c].wakeup_pending {
            self.clients[c].wakeup_pending = true;
            let at = self.now + delay;
            self.schedule(at, Ev::ClientNext(c));
        }
    }

    fn think_time(&mut self) -> Millis {
        let u: f64 = self.rng.random::<f64>().max(1e-12);
        let secs = -u.ln() / self.scenario.workload.txn_rate;
        Millis((secs * 1000.0).min(3_600_000.0) as u64)
    }

    /// The proxy's choice: a routable CN with the fewest sessions.
    pub(crate) fn pick_cn(&self, proxy: PodId) -> Option<PodId> {
        let proxy = self.proxies.get(&proxy)?;
        if !proxy.running {
            return None;
        }
        proxy
            .cache
            .iter()
            .filter_map(|(u, s)| self.routable_cn(u, *s))
            .min_by_key(|p| (self.cns[p].sessions.len(), *p))
    }

    pub(crate) fn attach_session(&mut self, c: ClientId, proxy: PodId, cn: PodId) {
        let epoch = self.cns[&cn].epoch;
        self.cns
            .get_mut(&cn)
            .expect("routable CN exists")
            .sessions
            .insert(c);
        self.clients[c].session = Some(Instance { pod: cn, epoch });
        if self.clients[c].proxy != Some(proxy) {
            self.clients[c].connected_at = self.now;
        }
        self.clients[c].proxy = Some(proxy);
    }

    pub(crate) fn drop_session(&mut self, c: ClientId) {
        if let Some(s) = self.clients[c].session.take()
            && let Some(cn) = self.cns.get_mut(&s.pod)
        {
            cn.sessions.remove(&c);
        }
        if let Some(p) = self.clients[c].proxy.take()
            && !self.proxies.get(&p).is_some_and(|x| x.running)
        {
            self.maybe_proxy_exit(p);
        }
    }

    /// Whether `table` is one of the clients' (not the kernel's internal ones).
    pub(crate) fn is_client_table(&self, table: &str) -> bool {
        self.tables[..self.client_tables].iter().any(|t| t == table)
    }

    /// One background worker per CN pod, each starting at a random point of its interval.
    pub(crate) fn start_background_work(&mut self) {
        let Some(spec) = self.scenario.workload.background.clone() else {
            return;
        };
        let cns: Vec<String> = self
            .pods
            .iter()
            .filter(|p| p.component == Component::Cn)
            .map(|p| p.name.clone())
            .collect();
        let start = self.scenario.workload.start.millis();
        for name in cns {
            let c = self.clients.len();
            self.clients.push(Client {
                background_on: Some(name),
                ..Client::default()
            });
            let first = Millis(
                self.background_rng
                    .random_range(0..spec.interval.millis().0.max(1)),
            );
            self.schedule(start + first, Ev::ClientNext(c));
        }
    }

    fn background_gap(&mut self) -> Millis {
        let mean = self
            .scenario
            .workload
            .background
            .as_ref()
            .map_or(10_000.0, |b| b.interval.millis().0 as f64);
        let u: f64 = self.background_rng.random::<f64>().max(1e-12);
        Millis(((-u.ln() * mean) as u64).clamp(1, 3_600_000))
    }

    /// The kernel's own transaction on the worker's CN, if that CN runs: one statement on each
    /// of a random choice of the internal tables.
    fn background_next(&mut self, c: ClientId) {
        let name = self.clients[c]
            .background_on
            .clone()
            .expect("a background worker");
        let running = self.pod_by_name.get(&name).copied().filter(|p| {
            self.pods[*p].process_alive
                && self
                    .cns
                    .get(p)
                    .is_some_and(|cn| cn.phase == CnPhase::Running && cn.lock_open)
        });
        let Some(p) = running else {
            let gap = self.background_gap();
            self.wake_client(c, gap);
            return;
        };
        let n = self.tables.len() - self.client_tables;
        let statements = self.background_rng.random_range(1..=n);
        let tables = (0..statements)
            .map(|_| self.client_tables + self.background_rng.random_range(0..n))
            .collect();
        let cn = Instance {
            pod: p,
            epoch: self.cns[&p].epoch,
        };
        self.begin_txn(c, cn, tables);
    }

    /// Ends the background transactions running on that CN instance (it stops).
    pub(crate) fn end_background_work_on(&mut self, cn: Instance, cause: Cause) {
        let running: Vec<ClientId> = (0..self.clients.len())
            .filter(|&c| {
                self.clients[c].background_on.is_some()
                    && self.clients[c]
                        .txn
                        .and_then(|x| self.txns.get(&x))
                        .is_some_and(|t| t.cn == cn)
            })
            .collect();
        for c in running {
            self.session_broken(c, "connection closed by CN", cause);
        }
    }

    pub(crate) fn client_next(&mut self, c: ClientId) {
        self.clients[c].wakeup_pending = false;
        if self.clients[c].txn.is_some() {
            return;
        }
        if self.clients[c].background_on.is_some() {
            self.background_next(c);
            return;
        }
        let lifetime = self.scenario.workload.connection_lifetime;
        if self.clients[c].session.is_some()
            && lifetime.is_some_and(|l| self.now - self.clients[c].connected_at >= l.millis())
        {
            // Closed between transactions and opened again through the Service.
            self.drop_session(c);
        }
        if self.clients[c].session.is_none() {
            // The SQL Service's endpoints: running proxies it selects, not being deleted.
            let running: Vec<PodId> = self
                .proxies
                .iter()
                .filter(|&(&p, x)| {
                    x.running && self.pods[p].serving && self.pods[p].deletion.is_none()
                })
                .map(|(&p, _)| p)
                .collect();
            let chosen = (!running.is_empty())
                .then(|| running[c % running.len()])
                .and_then(|proxy| self.pick_cn(proxy).map(|cn| (proxy, cn)));
            let Some((proxy, cn)) = chosen else {
                // No route: the client's connect fails; no transaction was started.
                self.wake_client(c, RECONNECT_DELAY);
                return;
            };
            self.attach_session(c, proxy, cn);
        }
        let session = self.clients[c].session.expect("attached above");
        let w = &self.scenario.workload;
        let (lo, hi, n_tables) = (w.statements_min, w.statements_max, self.client_tables);
        let statements = self.rng.random_range(lo..=hi);
        let tables = (0..statements)
            .map(|_| self.rng.random_range(0..n_tables))
            .collect();
        self.begin_txn(c, session, tables);
    }

    /// A new transaction of client (or worker) `c` on that CN: its first statement starts.
    fn begin_txn(&mut self, c: ClientId, cn: Instance, tables: Vec<usize>) {
        self.txn_counter += 1;
        let x = self.txn_counter;
        self.txns.insert(x, Txn::new(c, cn, self.now, tables));
        self.clients[c].txn = Some(x);
        self.after(self.t.lock_rpc_latency, Ev::StmtDone(c, x));
    }

    /// Start of statement `next_stmt`: it takes its lock first, then executes for
    /// `statement_latency` holding it; after the last statement comes COMMIT.
    pub(crate) fn stmt_done(&mut self, c: ClientId, x: TxnId) {
        let Some(txn) = self.txns.get(&x) else {
            return;
        };
        if txn.reported || txn.stage != TxnStage::Statements {
            return;
        }
        let table = txn.tables[txn.next_stmt];
        match self.acquire_lock(x, table) {
            LockResult::Granted(lock) => {
                let txn = self.txns.get_mut(&x).expect("present");
                txn.locks.push(lock);
                txn.next_stmt += 1;
                let latency = self.scenario.workload.statement_latency;
                if txn.next_stmt == txn.tables.len() {
                    txn.stage = TxnStage::Committing;
                    txn.commit_sent_at = self.now + latency.millis();
                    self.after(latency, Ev::CommitAtTn(c, x));
                } else {
                    self.after(latency, Ev::StmtDone(c, x));
                }
            }
            LockResult::Retry => {
                let at = self.now + LOCK_RETRY;
                self.schedule(at, Ev::StmtDone(c, x));
            }
            LockResult::WaitForTn => {
                self.retry_tn(x, Ev::StmtDone(c, x), "lock table allocator unavailable")
            }
            LockResult::Failed(error, cause) => self.abort_txn(x, error, cause),
        }
    }

    /// Lock-service rules: the first locker owns a table; others lock through the owner's
    /// lock port; an owner that is handing over refuses new transactions.
    pub(crate) fn acquire_lock(&mut self, x: TxnId, table: usize) -> LockResult {
        let requester = self.txns[&x].cn;
        // The requester's own lock service, once told to restart, admits only transactions it
        // already holds locks for; any other fails with 20635, and nothing sets the service
        // back to Enable (v1.2.4 `lockservice/service.go` `Lock` → `canLockOnServiceStatus`).
        // (The kernel also admits a transaction whose snapshot predates the mark on a table
        // the CN already references; the model does not, so it fails more, never fewer.)
        if let Some(cn) = self.cns.get(&requester.pod)
            && cn.epoch == requester.epoch
            && cn.restart_mode != RestartMode::None
            && self.txns[&x].locks.is_empty()
        {
            let text = format!(
                "new txn in CN rolling restart (20635) on {}",
                self.pods[requester.pod].name
            );
            return LockResult::Failed(text, Cause::Voluntary);
        }
        let table_name = &self.tables[table];
        let Some(bind) = self.tn.allocator.binds.get(table_name).cloned() else {
            if self.tn.phase != TnPhase::Running {
                return LockResult::WaitForTn;
            }
            if let Some(owner) = self.preset_owners.get(table_name).cloned() {
                return self.bind_to_preset_owner(x, table, &owner);
            }
            let Some(cn) = self.cns.get(&requester.pod) else {
                return LockResult::Retry;
            };
            // `GetBind` from a service the allocator has marked (its entry not Enable) is refused
            // with 20635, which the locker does not retry (v1.2.4 `lock_table_allocator.go`
            // `canGetBind`, `lockop/lock_op.go` `canRetryLock`), even before the CN has heard.
            let marked = self
                .tn
                .allocator
                .services
                .get(&requester)
                .is_some_and(|e| e.status != EntryStatus::Enable);
            if marked {
                let text = format!(
                    "new txn in CN rolling restart (20635) on {}: no lock table bind for a marked service",
                    self.pods[requester.pod].name
                );
                return LockResult::Failed(text, Cause::Voluntary);
            }
            if cn.restart_mode != RestartMode::None {
                // A CN that is restarting cannot become an owner; the proxy moves the session.
                return LockResult::Retry;
            }
            self.bind_version_bump += 1;
            let bind = Bind {
                owner: requester,
                uuid: cn.uuid.clone(),
                version: self.bind_version_bump,
            };
            self.tn
                .allocator
                .binds
                .insert(table_name.clone(), bind.clone());
            return self.grant(x, table, &bind);
        };
        let owner = bind.owner;
        // A lost owner (`ErrBackendClosed`, `ErrBackendCannotConnect`, `ErrNoAvailableBackend`)
        // fails only a transaction that already holds a lock on that table; any other sleeps
        // 1 s and asks again until the bind moves (v1.2.4 `lockop/lock_op.go` `canRetryLock`).
        let holds_table = self.txns[&x].locks.iter().any(|l| l.table == table);
        let Some(cn) = self.cns.get(&owner.pod).filter(|c| c.epoch == owner.epoch) else {
            if !holds_table {
                return LockResult::Retry;
            }
            let cause = self.stopped_cause(owner.pod);
            let text = format!(
                "failed to lock on remote {}:6003: connection refused",
                self.pods[owner.pod].name
            );
            return LockResult::Failed(text, cause);
        };
        if !cn.lock_open {
            if !holds_table {
                return LockResult::Retry;
            }
            let cause = cn.stop_cause;
            let pod = &self.pods[owner.pod];
            let reason = if pod.process_alive && pod.epoch == owner.epoch {
                "EOF"
            } else {
                "connection refused"
            };
            let text = format!("failed to lock on remote {}:6003: {reason}", pod.name);
            return LockResult::Failed(text, cause);
        }
        if cn.restart_mode != RestartMode::None {
            match self.admitted_while_restarting(owner, x, table) {
                None => return LockResult::Retry,
                Some(true) => self.saw("older transaction admitted by a CN told to restart"),
                Some(false) => {}
            }
        }
        self.grant(x, table, &bind)
    }

    /// What a lock service told to restart still admits (v1.2.4 `lockservice/service.go`
    /// `canLockOnServiceStatus`): a transaction it already counts as active (one of its own
    /// that locked anything, or one holding a lock here), or one whose snapshot is not newer
    /// than the restart time, on a table an active transaction references, while any is
    /// active. (Every other locker retries: "retry for CN rolling restart".)
    /// `Some(false)`: admitted as active; `Some(true)`: admitted for its older snapshot.
    fn admitted_while_restarting(&self, owner: Instance, x: TxnId, table: usize) -> Option<bool> {
        let cn = self.cns.get(&owner.pod)?;
        let txn = &self.txns[&x];
        if cn.holders.contains(&x)
            || cn.stale_holders.contains_key(&x)
            || (txn.cn == owner && !txn.locks.is_empty())
        {
            return Some(false);
        }
        let older_snapshot = cn.restart_time.is_some_and(|t| txn.created_at <= t);
        let referenced = cn.holders.iter().any(|h| {
            self.txns
                .get(h)
                .is_some_and(|t| t.locks.iter().any(|l| l.table == table && l.owner == owner))
        });
        (older_snapshot && referenced).then_some(true)
    }

    /// A table reserved for a CN (set up by a test) binds to that CN once its lock service is
    /// open; lockers wait until then.
    fn bind_to_preset_owner(&mut self, x: TxnId, table: usize, owner: &str) -> LockResult {
        let Some(&pod) = self.pod_by_name.get(owner) else {
            return LockResult::Retry;
        };
        let Some(cn) = self.cns.get(&pod).filter(|c| c.lock_open) else {
            return LockResult::Retry;
        };
        self.bind_version_bump += 1;
        let bind = Bind {
            owner: Instance {
                pod,
                epoch: cn.epoch,
            },
            uuid: cn.uuid.clone(),
            version: self.bind_version_bump,
        };
        let name = self.tables[table].clone();
        self.preset_owners.remove(&name);
        self.tn.allocator.binds.insert(name, bind.clone());
        self.grant(x, table, &bind)
    }

    fn grant(&mut self, x: TxnId, table: usize, bind: &Bind) -> LockResult {
        if let Some(cn) = self.cns.get_mut(&bind.owner.pod) {
            cn.holders.insert(x);
        }
        // Locking went through `GetBind`, which registers the requester with the allocator.
        let requester = self.txns[&x].cn;
        if let Some(cn) = self.cns.get(&requester.pod) {
            let uuid = cn.uuid.clone();
            self.tn.allocator.register(requester, &uuid);
        }
        self.tn.allocator.register(bind.owner, &bind.uuid);
        LockResult::Granted(HeldLock {
            table,
            owner: bind.owner,
            version: bind.version,
        })
    }

    /// Why the process on pod `p` is gone, as far as the world knows.
    fn stopped_cause(&self, p: PodId) -> Cause {
        match self.cns.get(&p) {
            Some(cn) if cn.phase != CnPhase::Running => cn.stop_cause,
            _ => self.pods[p]
                .deletion
                .as_ref()
                .map_or(Cause::Involuntary, |d| d.cause),
        }
    }

    /// Why a commit or a lock request waits on the TN: its WAL's shard or HAKeeper out of a
    /// fault, else why the TN last stopped.
    pub(crate) fn tn_wait_cause(&self) -> Cause {
        let involuntary = match self.tn.phase {
            TnPhase::Running | TnPhase::Stopping => {
                self.tn.wal_blocked_since.is_some() && self.wal_outage_cause() == Cause::Involuntary
            }
            TnPhase::WaitingForHakeeper => {
                self.hakeeper.outage_until.is_some()
                    || self.shard_outage_cause(0) == Cause::Involuntary
            }
            TnPhase::Starting | TnPhase::Down => false,
        };
        if involuntary {
            Cause::Involuntary
        } else {
            self.tn_cause()
        }
    }

    /// Why the TN last stopped (set when its pod is deleted or its process dies).
    pub(crate) fn tn_cause(&self) -> Cause {
        self.tn.stop_cause
    }

    pub(crate) fn commit_at_tn(&mut self, c: ClientId, x: TxnId) {
        let Some(txn) = self.txns.get(&x) else {
            return;
        };
        let cn_alive = self
            .cns
            .get(&txn.cn.pod)
            .is_some_and(|cn| cn.epoch == txn.cn.epoch && cn.phase != CnPhase::Down);
        if !cn_alive {
            // The CN died before the commit reached the TN: it never happened.
            let cause = self.stopped_cause(txn.cn.pod);
            self.resolve_txn_aborted(x, None, cause);
            return;
        }
        if self.tn.phase != TnPhase::Running {
            // The CN does not retry a commit (v1.2.4 `txn/rpc/sender.go` `Send`); nothing
            // reached the TN, so the transaction did not commit.
            let cause = self.tn_wait_cause();
            self.abort_txn(x, "TN unavailable: connection refused".into(), cause);
            return;
        }
        let txn = &self.txns[&x];
        let binds_intact = txn.locks.iter().all(|l| {
            self.tn
                .allocator
                .binds
                .get(&self.tables[l.table])
                .is_some_and(|b| b.owner == l.owner && b.version == l.version)
        });
        if !binds_intact {
            // A bind the restarted TN's new allocator never granted was lost to that restart;
            // any other changed because its owner stopped.
            let lost_to_tn = txn
                .locks
                .iter()
                .any(|l| l.version <= self.tn.binds_lost_up_to);
            let cause = if lost_to_tn {
                self.tn_cause()
            } else {
                txn.locks
                    .iter()
                    .map(|l| self.stopped_cause(l.owner.pod))
                    .find(|c| *c == Cause::Involuntary)
                    .unwrap_or(Cause::Voluntary)
            };
            self.abort_txn(x, "lock table bind changed".into(), cause);
            return;
        }
        self.tn.wal_waiting.push(x);
        if self.wal_available() && self.tn.wal_blocked_since.is_none() {
            self.after(self.t.wal_append_latency, Ev::WalDone(x));
        } else {
            self.arm_commit_timeout(c, x);
            self.on_log_change();
        }
    }

    /// The CN retries an unreachable TN for `cn_tn_wait`, then gives up with `error`.
    fn retry_tn(&mut self, x: TxnId, again: Ev, error: &str) {
        let now = self.now;
        let wait = self.t.cn_tn_wait.millis();
        let txn = self.txns.get_mut(&x).expect("present");
        let deadline = *txn.tn_wait_deadline.get_or_insert(now + wait);
        if now >= deadline {
            let cause = self.tn_wait_cause();
            self.abort_txn(x, error.to_string(), cause);
        } else {
            self.schedule(now + TN_RETRY, again);
        }
    }

    /// The client's COMMIT timeout matters only once a commit waits; arming it then keeps
    /// the event queue small.
    fn arm_commit_timeout(&mut self, c: ClientId, x: TxnId) {
        let timeout = self.scenario.workload.commit_timeout.millis();
        if let Some(txn) = self.txns.get_mut(&x)
            && !txn.timeout_armed
        {
            txn.timeout_armed = true;
            let at = txn.commit_sent_at + timeout;
            self.schedule(at.max(self.now), Ev::CommitTimeout(c, x));
        }
    }

    pub(crate) fn wal_done(&mut self, x: TxnId) {
        let Some(pos) = self.tn.wal_waiting.iter().position(|&w| w == x) else {
            return;
        };
        if !matches!(self.tn.phase, TnPhase::Running | TnPhase::Stopping) || !self.wal_available() {
            return; // still waiting; a later flush completes it
        }
        self.tn.wal_waiting.remove(pos);
        let Some(txn) = self.txns.remove(&x) else {
            return;
        };
        // Committed. The CN now unlocks before COMMIT returns; an unlock on a lock table whose
        // owner is gone fails and is retried (only logged) until the bind changes.
        let unreachable: Vec<HeldLock> = txn
            .locks
            .iter()
            .filter(|lock| {
                !self
                    .cns
                    .get(&lock.owner.pod)
                    .is_some_and(|cn| cn.epoch == lock.owner.epoch && cn.lock_open)
            })
            .cloned()
            .collect();
        self.release_locks(x, &txn);
        self.truth_committed += 1;
        // The longest stretch a table with DML went without a commit (what a lost lock owner
        // costs when its lockers wait instead of failing).
        for lock in txn.locks.iter().filter(|l| l.table < self.client_tables) {
            if let Some(last) = self.last_commit_on.insert(lock.table, self.now) {
                self.longest_table_stall = self.longest_table_stall.max(self.now - last);
            }
        }
        if let Some(audit) = &mut self.audit {
            audit.truth_committed.push(x);
        }
        if txn.reported {
            return;
        }
        if unreachable.is_empty() {
            self.tell_client(txn.client, x, Outcome::Committed);
            return;
        }
        let owner = self.pods[unreachable[0].owner.pod].name.clone();
        self.log("cn", || {
            format!(
                "txn {x}: failed to unlock on remote {owner}:6003; retrying until its bind changes"
            )
        });
        let client = txn.client;
        self.txns.insert(
            x,
            Txn {
                stage: TxnStage::Unlocking,
                locks: unreachable,
                ..txn
            },
        );
        self.after(Dur(UNLOCK_RETRY), Ev::UnlockRetry(client, x));
    }

    /// The retried unlock of a committed transaction: done once the allocator shows every
    /// table it still unlocks bound elsewhere (or anew); COMMIT then returns success.
    pub(crate) fn unlock_retry(&mut self, c: ClientId, x: TxnId) {
        let Some(txn) = self.txns.get(&x).filter(|t| t.stage == TxnStage::Unlocking) else {
            return;
        };
        if txn.reported {
            self.txns.remove(&x);
            return;
        }
        let allocator_answers = self.tn.phase == TnPhase::Running;
        let changed = allocator_answers
            && txn.locks.iter().all(|lock| {
                self.tn
                    .allocator
                    .binds
                    .get(&self.tables[lock.table])
                    .is_none_or(|b| b.version != lock.version || b.owner != lock.owner)
            });
        if changed {
            self.txns.remove(&x);
            self.tell_client(c, x, Outcome::Committed);
        } else {
            self.after(Dur(UNLOCK_RETRY), Ev::UnlockRetry(c, x));
        }
    }

    pub(crate) fn commit_timeout(&mut self, c: ClientId, x: TxnId) {
        let Some(txn) = self.txns.get_mut(&x) else {
            return;
        };
        if txn.reported {
            return;
        }
        txn.reported = true;
        let client = txn.client;
        // Waiting on an unlock, COMMIT is held by the lock owner that went away.
        let cause = match txn.stage {
            TxnStage::Unlocking => {
                let owner = txn.locks.first().map(|l| l.owner.pod);
                owner.map_or(Cause::Voluntary, |p| self.stopped_cause(p))
            }
            _ => self.tn_wait_cause(),
        };
        self.count(
            c,
            x,
            &Outcome::Unknown("commit timed out: context deadline exceeded".into(), cause),
        );
        // The client gives up on the connection; the transaction resolves later at the TN.
        self.clients[client].txn = None;
        self.drop_session(c);
        let delay = self.next_delay(c);
        self.wake_client(c, delay);
    }

    /// The session's connection broke: before COMMIT the transaction definitely did not
    /// commit; during COMMIT the client cannot know.
    pub(crate) fn session_broken(&mut self, c: ClientId, error: &str, cause: Cause) {
        if let Some(x) = self.clients[c].txn {
            let stage = self.txns.get(&x).map(|t| t.stage);
            match stage {
                Some(TxnStage::Statements) => {
                    self.abort_txn(x, format!("{error} (no COMMIT sent)"), cause)
                }
                Some(TxnStage::Committing | TxnStage::Unlocking) => {
                    let txn = self.txns.get_mut(&x).expect("present");
                    if !txn.reported {
                        txn.reported = true;
                        let outcome = Outcome::Unknown(format!("{error} during COMMIT"), cause);
                        self.count(c, x, &outcome);
                    }
                    self.clients[c].txn = None;
                }
                None => self.clients[c].txn = None,
            }
        }
        self.drop_session(c);
        self.wake_client(c, RECONNECT_DELAY);
    }

    fn abort_txn(&mut self, x: TxnId, error: String, cause: Cause) {
        let Some(txn) = self.txns.remove(&x) else {
            return;
        };
        self.release_locks(x, &txn);
        if !txn.reported {
            self.tell_client(txn.client, x, Outcome::Failed(error, cause));
        }
    }

    /// The transaction did not commit (TN lost it, or its CN died before COMMIT arrived).
    pub(crate) fn resolve_txn_aborted(&mut self, x: TxnId, error: Option<&str>, cause: Cause) {
        let Some(txn) = self.txns.remove(&x) else {
            return;
        };
        self.release_locks(x, &txn);
        if !txn.reported {
            let text = error.unwrap_or("connection lost during COMMIT").to_string();
            self.tell_client(txn.client, x, Outcome::Unknown(text, cause));
        }
    }

    pub(crate) fn release_locks(&mut self, x: TxnId, txn: &Txn) {
        for lock in &txn.locks {
            let owner = lock.owner.pod;
            if let Some(cn) = self.cns.get_mut(&owner)
                && cn.epoch == lock.owner.epoch
                && cn.holders.remove(&x)
            {
                self.check_unlock(owner);
            }
        }
        // Its own lock service counted it too.
        if !txn.locks.is_empty() && self.instance_running(txn.cn) {
            self.check_unlock(txn.cn.pod);
        }
    }

    /// When the client (or background worker) starts its next transaction.
    fn next_delay(&mut self, c: ClientId) -> Millis {
        if self.clients[c].background_on.is_some() {
            self.background_gap()
        } else {
            self.think_time()
        }
    }

    fn tell_client(&mut self, c: ClientId, x: TxnId, outcome: Outcome) {
        self.count(c, x, &outcome);
        if self.clients[c].txn == Some(x) {
            self.clients[c].txn = None;
            if self.clients[c]
                .proxy
                .is_some_and(|p| !self.proxies.get(&p).is_some_and(|x| x.running))
            {
                // The proxy is shutting down: it closes this connection after the transaction.
                self.drop_session(c);
            } else if self.clients[c].transfer_intent {
                self.move_unroutable_session(c);
            }
            let delay = self.next_delay(c);
            self.wake_client(c, delay);
        }
    }

    /// Counts the one outcome the client of `x` is told (callers flip `reported` first).
    fn count(&mut self, c: ClientId, x: TxnId, outcome: &Outcome) {
        if self.clients[c].background_on.is_some() {
            let counts = &mut self.background_counts;
            match outcome {
                Outcome::Committed => counts.committed += 1,
                Outcome::Failed(..) => counts.failed_definite += 1,
                Outcome::Unknown(..) => counts.unknown += 1,
            }
            if let Outcome::Failed(text, _) | Outcome::Unknown(text, _) = outcome {
                let text = text.clone();
                self.log("kernel", || format!("background txn {x}: {text}"));
            }
            return;
        }
        if let Some(trace) = &mut self.trace {
            let bucket = (self.now.as_secs_f64() / trace.bucket_seconds) as usize;
            if trace.outcomes.len() <= bucket {
                trace.outcomes.resize(bucket + 1, [0; 3]);
            }
            let column = match outcome {
                Outcome::Committed => 0,
                Outcome::Failed(..) => 1,
                Outcome::Unknown(..) => 2,
            };
            trace.outcomes[bucket][column] += 1;
        }
        if let Some(audit) = &mut self.audit {
            let kind = match outcome {
                Outcome::Committed => OutcomeKind::Committed,
                Outcome::Failed(..) => OutcomeKind::Failed,
                Outcome::Unknown(..) => OutcomeKind::Unknown,
            };
            audit.outcomes.push((x, kind));
        }
        match outcome {
            Outcome::Committed => self.counts.committed += 1,
            Outcome::Failed(text, cause) | Outcome::Unknown(text, cause) => {
                if matches!(outcome, Outcome::Failed(..)) {
                    self.counts.failed_definite += 1;
                } else {
                    self.counts.unknown += 1;
                }
                match cause {
                    Cause::Voluntary => self.failures_voluntary += 1,
                    Cause::Involuntary => self.failures_involuntary += 1,
                    Cause::TnRestart => self.failures_tn_restart += 1,
                    Cause::ProxyRestart => self.failures_proxy_restart += 1,
                }
                *self.errors_by_kind.entry(text.clone()).or_default() += 1;
                if *cause == Cause::Voluntary {
                    self.last_failure.clone_from(text);
                }
                let (kind, text) = (
                    if matches!(outcome, Outcome::Failed(..)) {
                        "failed"
                    } else {
                        "unknown"
                    },
                    text.clone(),
                );
                self.log("client", || format!("txn {kind}: {text}"));
            }
        }
    }
}
