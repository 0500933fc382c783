//! The workload: clients running short explicit transactions, and the record of how each ended.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::classify::{ErrorKind, Phase, SqlError};
use crate::error::{Error, Result};
use crate::outcomes::{
    ConsistencyCheck, FailureOutcome, FailureRecord, Outcomes, TableOutcomes, TargetOutcomes,
};
use crate::schema::{TableState, table_states};
use crate::target::{Target, check_identifier, exec};

/// How many clients go to one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLoad {
    pub target: Target,
    pub clients: usize,
}

/// When a client starts its next transaction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pacing {
    /// Right after the previous one ends, plus a think time.
    Closed { think_time: Duration },
    /// On a fixed schedule of this many transactions per second per client; a client that falls
    /// behind starts at once and does not burst to catch up.
    Rate { txns_per_second: f64 },
}

#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    pub targets: Vec<TargetLoad>,
    pub database: String,
    /// Tables made by [`crate::prepare`] with ids `1..=rows_per_table`.
    pub tables: Vec<String>,
    pub rows_per_table: u64,
    /// DML statements per transaction, each on a random table and row.
    pub statements_per_txn: usize,
    /// Share of statements that insert a new row (random id above `rows_per_table`) instead of
    /// updating an existing one.
    pub insert_ratio: f64,
    pub pacing: Pacing,
    /// Bound on every statement, `COMMIT` included. When it passes the session is dropped (its
    /// state is unknown) and the transaction counts as failed, or unknown during `COMMIT`.
    pub statement_timeout: Duration,
    pub connect_timeout: Duration,
    /// Pause after a failed connect attempt.
    pub reconnect_delay: Duration,
    /// Length of the failure log.
    pub recent_failures: usize,
    pub seed: u64,
    /// Read the tables before the start and after the stop (through this target) and check
    /// them against the outcomes ([`Outcomes::consistency`]).
    pub consistency_target: Option<Target>,
}

impl WorkloadConfig {
    /// Defaults: 100 rows per table, 3 statements per transaction, a fifth of them inserts,
    /// closed loop with 10 ms think time, 30 s statement timeout, consistency checked through the
    /// first target.
    pub fn new(targets: Vec<TargetLoad>, database: impl Into<String>, tables: Vec<String>) -> Self {
        let consistency_target = targets.first().map(|t| t.target.clone());
        WorkloadConfig {
            targets,
            database: database.into(),
            tables,
            rows_per_table: 100,
            statements_per_txn: 3,
            insert_ratio: 0.2,
            pacing: Pacing::Closed {
                think_time: Duration::from_millis(10),
            },
            statement_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            reconnect_delay: Duration::from_millis(200),
            recent_failures: 50,
            seed: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
            consistency_target,
        }
    }

    fn validate(&self) -> Result<()> {
        let fail = |m: &str| Err(Error::Config(m.into()));
        check_identifier("database", &self.database)?;
        for t in &self.tables {
            check_identifier("table", t)?;
        }
        for l in &self.targets {
            l.target.opts()?;
        }
        if self.tables.is_empty() {
            return fail("no tables");
        }
        if self.targets.iter().map(|t| t.clients).sum::<usize>() == 0 {
            return fail("no clients");
        }
        if self.rows_per_table == 0 || self.statements_per_txn == 0 {
            return fail("rows_per_table and statements_per_txn must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.insert_ratio) {
            return fail("insert_ratio must be within 0..=1");
        }
        if let Pacing::Rate { txns_per_second } = self.pacing
            && !(txns_per_second > 0.0 && txns_per_second.is_finite())
        {
            return fail("txns_per_second must be positive");
        }
        Ok(())
    }
}

/// A running workload. Dropping it asks the clients to stop after their current transaction.
pub struct Workload {
    shared: Arc<Shared>,
    stop_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    config: WorkloadConfig,
    baseline: Option<Result<BTreeMap<String, TableState>, String>>,
}

impl Workload {
    /// Validates the config, reads the baseline for the consistency check (if asked) and spawns
    /// the clients. Needs a Tokio runtime.
    pub async fn start(config: WorkloadConfig) -> Result<Workload> {
        config.validate()?;
        let baseline = match &config.consistency_target {
            Some(t) => Some(Ok(table_states(t, &config.database, &config.tables).await?)),
            None => None,
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared::new(&config));
        let mut tasks = Vec::new();
        let mut id = 0;
        for load in &config.targets {
            for _ in 0..load.clients {
                let client = Client {
                    id,
                    target: load.target.clone(),
                    config: config.clone(),
                    shared: shared.clone(),
                    stop: stop_rx.clone(),
                    rng: ChaCha8Rng::seed_from_u64(
                        config.seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    ),
                };
                tasks.push(tokio::spawn(client.run()));
                id += 1;
            }
        }
        tracing::info!(clients = id, tables = ?config.tables, seed = config.seed, "workload started");
        Ok(Workload {
            shared,
            stop_tx,
            tasks,
            config,
            baseline,
        })
    }

    /// The outcomes so far.
    pub fn snapshot(&self) -> Outcomes {
        self.shared.outcomes(Instant::now())
    }

    /// Asks every client to stop after its current transaction, waits for them, and checks
    /// consistency if configured. Gaps are measured up to the stop request.
    pub async fn stop(mut self) -> Outcomes {
        let stopped_at = Instant::now();
        let _ = self.stop_tx.send(true);
        for task in std::mem::take(&mut self.tasks) {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "workload client panicked");
            }
        }
        let mut outcomes = self.shared.outcomes(stopped_at);
        if let (Some(baseline), Some(target)) =
            (self.baseline.take(), &self.config.consistency_target)
        {
            outcomes.consistency = Some(match baseline {
                Err(e) => ConsistencyCheck::failed(e),
                Ok(before) => {
                    match table_states(target, &self.config.database, &self.config.tables).await {
                        Ok(after) => ConsistencyCheck::evaluate(&before, &after, &outcomes.tables),
                        Err(e) => ConsistencyCheck::failed(e.to_string()),
                    }
                }
            });
        }
        tracing::info!(
            committed = outcomes.committed,
            failed = outcomes.failed,
            unknown = outcomes.unknown,
            connect_errors = outcomes.connect_errors,
            consistent = ?outcomes.consistency.as_ref().map(|c| c.ok),
            "workload stopped"
        );
        outcomes
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.stop_tx.send(true);
    }
}

/// One DML statement of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Update { table: usize, id: u64 },
    Insert { table: usize, id: u64 },
}

impl Op {
    fn table(self) -> usize {
        match self {
            Op::Update { table, .. } | Op::Insert { table, .. } => table,
        }
    }
}

/// How one transaction ended.
#[derive(Debug)]
enum End {
    Committed,
    Failed(Phase, SqlError),
    Unknown(SqlError),
    /// `BEGIN` found the connection already broken (the server side closed it, e.g. a proxy
    /// restarted): no transaction started, nothing ran. Counted with the connect errors.
    NotStarted(SqlError),
}

/// One finished transaction: the statements that succeeded (with affected rows) and its end.
#[derive(Debug)]
struct TxnReport {
    done: Vec<(Op, u64)>,
    end: End,
    elapsed: Duration,
}

struct Client {
    id: usize,
    target: Target,
    config: WorkloadConfig,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    rng: ChaCha8Rng,
}

impl Client {
    async fn run(mut self) {
        let mut conn: Option<mysql_async::Conn> = None;
        let mut next = Instant::now();
        while !*self.stop.borrow() {
            let wait = match self.config.pacing {
                Pacing::Closed { think_time } => think_time,
                Pacing::Rate { txns_per_second } => {
                    let now = Instant::now();
                    let at = next.max(now);
                    next = at + Duration::from_secs_f64(1.0 / txns_per_second);
                    at - now
                }
            };
            if !wait.is_zero() && self.sleep_or_stop(wait).await {
                break;
            }
            let session = match conn.as_mut() {
                Some(c) => c,
                None => {
                    let began = Instant::now();
                    match self.target.connect(self.config.connect_timeout).await {
                        Ok(c) => conn.insert(c),
                        Err(e) => {
                            tracing::debug!(target = %self.target.name, client = self.id, error = %e, "connect failed");
                            self.shared
                                .record_connect_error(&self.target.name, self.id, e, began);
                            if self.sleep_or_stop(self.config.reconnect_delay).await {
                                break;
                            }
                            continue;
                        }
                    }
                }
            };
            let ops = self.plan();
            let (report, keep) = self.transaction(session, &ops).await;
            if !keep {
                conn = None;
            }
            self.shared
                .record_txn(&self.target.name, self.id, &self.config.tables, report);
        }
        if let Some(c) = conn {
            let _ = tokio::time::timeout(Duration::from_secs(2), c.disconnect()).await;
        }
    }

    /// Sleeps, returning early (true) when asked to stop.
    async fn sleep_or_stop(&mut self, d: Duration) -> bool {
        // A dropped sender (the workload is gone) also ends the wait: stop then.
        let woken = tokio::select! {
            _ = tokio::time::sleep(d) => false,
            _ = self.stop.wait_for(|s| *s) => true,
        };
        woken || *self.stop.borrow()
    }

    /// The statements of the next transaction, sorted by table and id so that concurrent
    /// transactions lock rows in one order and cannot deadlock with each other.
    fn plan(&mut self) -> Vec<Op> {
        let c = &self.config;
        let mut ops: Vec<Op> = (0..c.statements_per_txn)
            .map(|_| {
                let table = self.rng.random_range(0..c.tables.len());
                if self.rng.random_bool(c.insert_ratio) {
                    // Random ids far above the prepared rows: no two clients collide.
                    let id = c.rows_per_table + 1 + self.rng.random_range(0..(1u64 << 62));
                    Op::Insert { table, id }
                } else {
                    let id = self.rng.random_range(1..=c.rows_per_table);
                    Op::Update { table, id }
                }
            })
            .collect();
        ops.sort_by_key(|op| match *op {
            Op::Update { table, id } | Op::Insert { table, id } => (table, id),
        });
        ops
    }

    fn sql(&self, op: Op) -> String {
        let db = &self.config.database;
        match op {
            Op::Update { table, id } => {
                let t = &self.config.tables[table];
                format!("UPDATE {db}.{t} SET v = v + 1 WHERE id = {id}")
            }
            Op::Insert { table, id } => {
                let t = &self.config.tables[table];
                format!("INSERT INTO {db}.{t} (id, v) VALUES ({id}, 1)")
            }
        }
    }

    /// Runs one transaction; returns its report and whether the session can be kept.
    async fn transaction(&self, conn: &mut mysql_async::Conn, ops: &[Op]) -> (TxnReport, bool) {
        let timeout = self.config.statement_timeout;
        let began = Instant::now();
        let mut done = Vec::with_capacity(ops.len());
        let failed = |phase, e: SqlError, done| TxnReport {
            done,
            end: End::Failed(phase, e),
            elapsed: began.elapsed(),
        };
        if let Err(e) = exec(conn, "BEGIN", timeout).await {
            if e.kind == ErrorKind::Io {
                let report = TxnReport {
                    done,
                    end: End::NotStarted(e),
                    elapsed: began.elapsed(),
                };
                return (report, false);
            }
            let keep = e.session_usable() && rollback(conn, timeout).await;
            return (failed(Phase::Begin, e, done), keep);
        }
        for &op in ops {
            match exec(conn, &self.sql(op), timeout).await {
                Ok(affected) => done.push((op, affected)),
                Err(e) => {
                    let keep = e.session_usable() && rollback(conn, timeout).await;
                    return (failed(Phase::Statement, e, done), keep);
                }
            }
        }
        match exec(conn, "COMMIT", timeout).await {
            Ok(_) => (
                TxnReport {
                    done,
                    end: End::Committed,
                    elapsed: began.elapsed(),
                },
                true,
            ),
            Err(e) => {
                // Whatever the transaction's fate, leave no transaction open on a kept session.
                let keep = e.session_usable() && rollback(conn, timeout).await;
                let end = if e.definite_at_commit() {
                    End::Failed(Phase::Commit, e)
                } else {
                    End::Unknown(e)
                };
                (
                    TxnReport {
                        done,
                        end,
                        elapsed: began.elapsed(),
                    },
                    keep,
                )
            }
        }
    }
}

/// `ROLLBACK`, ignoring a server's error; false when the session is no longer usable.
async fn rollback(conn: &mut mysql_async::Conn, timeout: Duration) -> bool {
    match exec(conn, "ROLLBACK", timeout).await {
        Ok(_) => true,
        Err(e) => e.session_usable(),
    }
}

struct Shared {
    start: Instant,
    start_unix_ms: u64,
    recent_limit: usize,
    stats: Mutex<Stats>,
}

#[derive(Default)]
struct Stats {
    committed: u64,
    failed: u64,
    unknown: u64,
    connect_errors: u64,
    failed_by_code: BTreeMap<String, u64>,
    failed_by_phase: BTreeMap<String, u64>,
    unknown_by_code: BTreeMap<String, u64>,
    connect_errors_by_code: BTreeMap<String, u64>,
    per_target: BTreeMap<String, TargetOutcomes>,
    tables: BTreeMap<String, TableTrack>,
    max_txn_latency: Duration,
    recent: VecDeque<FailureRecord>,
    first: BTreeMap<String, FailureRecord>,
}

struct TableTrack {
    out: TableOutcomes,
    last_commit: Instant,
    max_gap: Duration,
    max_gap_began: Instant,
}

impl Shared {
    fn new(config: &WorkloadConfig) -> Self {
        let start = Instant::now();
        let mut stats = Stats::default();
        for load in &config.targets {
            stats
                .per_target
                .entry(load.target.name.clone())
                .or_default()
                .clients += load.clients;
        }
        for t in &config.tables {
            stats.tables.insert(
                t.clone(),
                TableTrack {
                    out: TableOutcomes::default(),
                    last_commit: start,
                    max_gap: Duration::ZERO,
                    max_gap_began: start,
                },
            );
        }
        Shared {
            start,
            start_unix_ms: unix_ms(SystemTime::now()),
            recent_limit: config.recent_failures,
            stats: Mutex::new(stats),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Stats> {
        // A client that panicked while holding the lock left consistent counts behind: every
        // update is a few increments.
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn since_start(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_millis() as u64
    }

    fn push_failure(
        &self,
        stats: &mut Stats,
        (target, client): (&str, usize),
        outcome: FailureOutcome,
        phase: Phase,
        error: SqlError,
        elapsed: Duration,
    ) {
        let at_ms = self.since_start(Instant::now());
        let record = FailureRecord {
            at_ms,
            unix_ms: self.start_unix_ms + at_ms,
            target: target.into(),
            client,
            outcome,
            phase,
            code: error.label(),
            error,
            elapsed_ms: elapsed.as_millis() as u64,
        };
        stats
            .first
            .entry(format!(
                "{}/{}/{}",
                outcome.as_str(),
                phase.as_str(),
                record.code
            ))
            .or_insert_with(|| record.clone());
        if self.recent_limit == 0 {
            return;
        }
        while stats.recent.len() >= self.recent_limit {
            stats.recent.pop_front();
        }
        stats.recent.push_back(record);
    }

    fn record_connect_error(&self, target: &str, client: usize, error: SqlError, began: Instant) {
        let mut s = self.lock();
        s.connect_errors += 1;
        *s.connect_errors_by_code.entry(error.label()).or_default() += 1;
        s.per_target
            .entry(target.into())
            .or_default()
            .connect_errors += 1;
        self.push_failure(
            &mut s,
            (target, client),
            FailureOutcome::ConnectError,
            Phase::Connect,
            error,
            began.elapsed(),
        );
    }

    fn record_txn(&self, target: &str, client: usize, tables: &[String], report: TxnReport) {
        self.record_txn_at(Instant::now(), target, client, tables, report);
    }

    fn record_txn_at(
        &self,
        now: Instant,
        target: &str,
        client: usize,
        tables: &[String],
        report: TxnReport,
    ) {
        let mut guard = self.lock();
        let s = &mut *guard;
        s.max_txn_latency = s.max_txn_latency.max(report.elapsed);
        let per = s.per_target.entry(target.into()).or_default();
        per.max_txn_latency_ms = per
            .max_txn_latency_ms
            .max(report.elapsed.as_millis() as u64);
        match report.end {
            End::NotStarted(error) => {
                s.connect_errors += 1;
                *s.connect_errors_by_code.entry(error.label()).or_default() += 1;
                per.connect_errors += 1;
                self.push_failure(
                    s,
                    (target, client),
                    FailureOutcome::ConnectError,
                    Phase::Begin,
                    error,
                    report.elapsed,
                );
            }
            End::Committed => {
                s.committed += 1;
                per.committed += 1;
                let touched: BTreeSet<usize> =
                    report.done.iter().map(|(op, _)| op.table()).collect();
                for (op, affected) in &report.done {
                    let Some(t) = s.tables.get_mut(&tables[op.table()]) else {
                        continue;
                    };
                    match op {
                        Op::Update { .. } => t.out.committed_updates += affected,
                        Op::Insert { .. } => t.out.committed_inserts += affected,
                    }
                }
                for i in touched {
                    let Some(t) = s.tables.get_mut(&tables[i]) else {
                        continue;
                    };
                    t.out.commits += 1;
                    let gap = now.saturating_duration_since(t.last_commit);
                    if gap > t.max_gap {
                        t.max_gap = gap;
                        t.max_gap_began = t.last_commit;
                    }
                    t.last_commit = t.last_commit.max(now);
                }
            }
            End::Failed(phase, error) => {
                s.failed += 1;
                per.failed += 1;
                *s.failed_by_code.entry(error.label()).or_default() += 1;
                *s.failed_by_phase.entry(phase.as_str().into()).or_default() += 1;
                tracing::debug!(target, client, phase = phase.as_str(), error = %error, "transaction failed");
                self.push_failure(
                    s,
                    (target, client),
                    FailureOutcome::Failed,
                    phase,
                    error,
                    report.elapsed,
                );
            }
            End::Unknown(error) => {
                s.unknown += 1;
                per.unknown += 1;
                *s.unknown_by_code.entry(error.label()).or_default() += 1;
                for (op, affected) in &report.done {
                    let Some(t) = s.tables.get_mut(&tables[op.table()]) else {
                        continue;
                    };
                    match op {
                        Op::Update { .. } => t.out.unknown_updates += affected,
                        Op::Insert { .. } => t.out.unknown_inserts += affected,
                    }
                }
                tracing::debug!(target, client, error = %error, "transaction outcome unknown");
                self.push_failure(
                    s,
                    (target, client),
                    FailureOutcome::Unknown,
                    Phase::Commit,
                    error,
                    report.elapsed,
                );
            }
        }
    }

    /// The outcomes with gaps measured up to `now`.
    fn outcomes(&self, now: Instant) -> Outcomes {
        let s = self.lock();
        let tables = s
            .tables
            .iter()
            .map(|(name, t)| {
                let ongoing = now.saturating_duration_since(t.last_commit);
                let (gap, began) = if ongoing > t.max_gap {
                    (ongoing, t.last_commit)
                } else {
                    (t.max_gap, t.max_gap_began)
                };
                let mut out = t.out.clone();
                out.max_commit_gap_ms = gap.as_millis() as u64;
                out.max_commit_gap_began_at_ms = self.since_start(began);
                (name.clone(), out)
            })
            .collect();
        Outcomes {
            elapsed_ms: self.since_start(now),
            committed: s.committed,
            failed: s.failed,
            unknown: s.unknown,
            connect_errors: s.connect_errors,
            failed_by_code: s.failed_by_code.clone(),
            failed_by_phase: s.failed_by_phase.clone(),
            unknown_by_code: s.unknown_by_code.clone(),
            connect_errors_by_code: s.connect_errors_by_code.clone(),
            per_target: s.per_target.clone(),
            tables,
            max_txn_latency_ms: s.max_txn_latency.as_millis() as u64,
            recent_failures: s.recent.iter().cloned().collect(),
            first_failures: s.first.clone(),
            consistency: None,
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::ErrorKind;

    fn config() -> WorkloadConfig {
        let mut c = WorkloadConfig::new(
            vec![
                TargetLoad {
                    target: Target::new("proxy", "127.0.0.1:6001"),
                    clients: 2,
                },
                TargetLoad {
                    target: Target::new("cn0", "127.0.0.1:6002"),
                    clients: 1,
                },
            ],
            "db",
            vec!["a".into(), "b".into()],
        );
        c.recent_failures = 2;
        c
    }

    fn err(code: u16) -> SqlError {
        SqlError {
            kind: ErrorKind::Server,
            mysql_code: Some(code),
            mo_code: Some(code),
            sql_state: None,
            message: format!("error {code}"),
        }
    }

    fn committed(ops: &[(Op, u64)]) -> TxnReport {
        TxnReport {
            done: ops.to_vec(),
            end: End::Committed,
            elapsed: Duration::from_millis(5),
        }
    }

    /// A connection the server closed between transactions: the next `BEGIN` fails with an
    /// I/O error, nothing ran. A connect error, never a failed transaction.
    #[test]
    fn a_begin_on_a_closed_connection_is_a_connect_error_not_a_transaction() {
        let c = config();
        let sh = Shared::new(&c);
        let closed = TxnReport {
            done: vec![],
            end: End::NotStarted(SqlError {
                kind: ErrorKind::Io,
                mysql_code: None,
                mo_code: None,
                sql_state: None,
                message: "connection closed".into(),
            }),
            elapsed: Duration::from_millis(1),
        };
        sh.record_txn_at(sh.start, "proxy", 0, &c.tables, closed);
        let o = sh.outcomes(sh.start);
        assert_eq!((o.failed, o.unknown, o.connect_errors), (0, 0, 1));
        assert_eq!(o.per_target["proxy"].connect_errors, 1);
        assert_eq!(o.connect_errors_by_code, BTreeMap::from([("io".into(), 1)]));
    }

    #[test]
    fn every_end_is_counted_once_and_by_target() {
        let c = config();
        let sh = Shared::new(&c);
        let t0 = sh.start;
        let upd = Op::Update { table: 0, id: 1 };
        let ins = Op::Insert { table: 1, id: 500 };
        sh.record_txn_at(t0, "proxy", 0, &c.tables, committed(&[(upd, 1), (ins, 1)]));
        let failed = TxnReport {
            done: vec![(upd, 1)],
            end: End::Failed(Phase::Statement, err(20635)),
            elapsed: Duration::from_millis(7),
        };
        sh.record_txn_at(t0, "cn0", 2, &c.tables, failed);
        let unknown = TxnReport {
            done: vec![(upd, 1), (ins, 1)],
            end: End::Unknown(SqlError::timeout("COMMIT", Duration::from_secs(1))),
            elapsed: Duration::from_millis(1000),
        };
        sh.record_txn_at(t0, "proxy", 1, &c.tables, unknown);
        sh.record_connect_error("cn0", 2, err(20101), Instant::now());
        let o = sh.outcomes(t0);
        assert_eq!(
            (o.committed, o.failed, o.unknown, o.connect_errors),
            (1, 1, 1, 1)
        );
        assert_eq!(o.failed_by_code, BTreeMap::from([("20635".into(), 1)]));
        assert_eq!(o.failed_by_phase, BTreeMap::from([("statement".into(), 1)]));
        assert_eq!(o.unknown_by_code, BTreeMap::from([("timeout".into(), 1)]));
        assert_eq!(o.per_target["proxy"].clients, 2);
        assert_eq!(o.per_target["proxy"].committed, 1);
        assert_eq!(o.per_target["proxy"].unknown, 1);
        assert_eq!(o.per_target["cn0"].failed, 1);
        assert_eq!(o.per_target["cn0"].connect_errors, 1);
        assert_eq!(o.max_txn_latency_ms, 1000);
        // The failed transaction's update is nowhere; the unknown one's is kept apart.
        assert_eq!(o.tables["a"].committed_updates, 1);
        assert_eq!(o.tables["a"].unknown_updates, 1);
        assert_eq!(o.tables["b"].committed_inserts, 1);
        assert_eq!(o.tables["b"].unknown_inserts, 1);
        // The log keeps the last two, oldest first.
        let kinds: Vec<_> = o.recent_failures.iter().map(|f| f.outcome).collect();
        assert_eq!(
            kinds,
            [FailureOutcome::Unknown, FailureOutcome::ConnectError]
        );
        assert_eq!(o.recent_failures[1].phase, Phase::Connect);
        // The first of each kind stays, however many came after.
        let first: Vec<_> = o.first_failures.keys().map(String::as_str).collect();
        assert_eq!(
            first,
            [
                "connect_error/connect/20101",
                "failed/statement/20635",
                "unknown/commit/timeout"
            ]
        );
    }

    #[test]
    fn the_longest_gap_between_commits_is_tracked_per_table_and_includes_an_ongoing_stall() {
        let c = config();
        let sh = Shared::new(&c);
        let t0 = sh.start;
        let on = |t: usize| committed(&[(Op::Update { table: t, id: 1 }, 1)]);
        let ms = Duration::from_millis;
        sh.record_txn_at(t0 + ms(100), "proxy", 0, &c.tables, on(0));
        sh.record_txn_at(t0 + ms(150), "proxy", 0, &c.tables, on(1));
        sh.record_txn_at(t0 + ms(2100), "proxy", 0, &c.tables, on(0)); // a: 2 s stall
        sh.record_txn_at(t0 + ms(2200), "proxy", 0, &c.tables, on(1)); // b: 2.05 s stall
        sh.record_txn_at(t0 + ms(2300), "proxy", 0, &c.tables, on(0));
        let o = sh.outcomes(t0 + ms(2400));
        assert_eq!(o.tables["a"].max_commit_gap_ms, 2000);
        assert_eq!(o.tables["a"].max_commit_gap_began_at_ms, 100);
        assert_eq!(o.tables["b"].max_commit_gap_ms, 2050);
        assert_eq!(o.tables["a"].commits, 3);
        assert_eq!(o.max_commit_gap(), ms(2050));
        // Nothing committed on `b` since 2.2 s: at 5 s its stall is 2.8 s and still going.
        let later = sh.outcomes(t0 + ms(5000));
        assert_eq!(later.tables["b"].max_commit_gap_ms, 2800);
        assert_eq!(later.tables["b"].max_commit_gap_began_at_ms, 2200);
        assert_eq!(later.tables["a"].max_commit_gap_ms, 2700);
    }

    #[test]
    fn plans_lock_in_one_order() {
        let mut c = config();
        c.statements_per_txn = 8;
        c.insert_ratio = 0.5;
        let (_tx, rx) = watch::channel(false);
        let mut client = Client {
            id: 0,
            target: c.targets[0].target.clone(),
            config: c.clone(),
            shared: Arc::new(Shared::new(&c)),
            stop: rx,
            rng: ChaCha8Rng::seed_from_u64(7),
        };
        let mut inserts = 0;
        for _ in 0..50 {
            let ops = client.plan();
            assert_eq!(ops.len(), 8);
            let keys: Vec<_> = ops
                .iter()
                .map(|op| match *op {
                    Op::Update { table, id } => {
                        assert!((1..=c.rows_per_table).contains(&id));
                        (table, id)
                    }
                    Op::Insert { table, id } => {
                        inserts += 1;
                        assert!(id > c.rows_per_table);
                        (table, id)
                    }
                })
                .collect();
            assert!(keys.windows(2).all(|w| w[0] <= w[1]), "{keys:?}");
        }
        assert!(inserts > 100 && inserts < 300, "{inserts}");
        assert_eq!(
            client.sql(Op::Update { table: 1, id: 3 }),
            "UPDATE db.b SET v = v + 1 WHERE id = 3"
        );
    }

    #[test]
    fn bad_configs_are_refused() {
        let ok = config();
        assert!(ok.validate().is_ok());
        let mut c = ok.clone();
        c.tables = vec!["x; drop".into()];
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.insert_ratio = 1.5;
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.pacing = Pacing::Rate {
            txns_per_second: 0.0,
        };
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.targets.iter_mut().for_each(|t| t.clients = 0);
        assert!(c.validate().is_err());
        let mut c = ok;
        c.targets[0].target.address = "nowhere".into();
        assert!(matches!(c.validate(), Err(Error::Address(_))));
    }
}
