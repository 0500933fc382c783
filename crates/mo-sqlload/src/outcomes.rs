//! What a workload saw: serializable counts, stalls, recent failures and the consistency check.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::classify::{Phase, SqlError};
use crate::schema::TableState;

/// Counts of one workload, from its start to the snapshot (or stop).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcomes {
    /// Milliseconds from start to this snapshot (to the stop request for `stop`).
    pub elapsed_ms: u64,
    /// Transactions whose `COMMIT` returned OK.
    pub committed: u64,
    /// Transactions that definitely did not commit: an error before `COMMIT` was sent (including
    /// `BEGIN`), or a `COMMIT` the kernel refused for sure (see [`SqlError::definite_at_commit`]).
    pub failed: u64,
    /// Transactions whose `COMMIT` was in flight when the error or disconnect came.
    pub unknown: u64,
    /// Failed attempts to open a session: no transaction was started.
    pub connect_errors: u64,
    /// `failed` by [`SqlError::label`] (e.g. `"20635"`, `"mysql-1105"`, `"io"`, `"timeout"`).
    pub failed_by_code: BTreeMap<String, u64>,
    /// `failed` by [`Phase`] (`begin`, `statement`, `commit`).
    pub failed_by_phase: BTreeMap<String, u64>,
    pub unknown_by_code: BTreeMap<String, u64>,
    pub connect_errors_by_code: BTreeMap<String, u64>,
    pub per_target: BTreeMap<String, TargetOutcomes>,
    pub tables: BTreeMap<String, TableOutcomes>,
    /// The longest transaction, from `BEGIN` sent to its end, whatever the outcome.
    pub max_txn_latency_ms: u64,
    /// The last failures, unknowns and connect errors, oldest first.
    pub recent_failures: Vec<FailureRecord>,
    /// The first record of each kind, keyed `<outcome>/<phase>/<code>` (e.g.
    /// `failed/statement/20635`): a flood of one kind cannot push the others out.
    pub first_failures: BTreeMap<String, FailureRecord>,
    /// Filled by `Workload::stop` when the config asks for it.
    pub consistency: Option<ConsistencyCheck>,
}

impl Outcomes {
    /// Transactions that did not commit or whose fate is unknown.
    pub fn broken(&self) -> u64 {
        self.failed + self.unknown
    }

    /// The longest time any table went without a commit touching it.
    pub fn max_commit_gap(&self) -> Duration {
        let ms = self
            .tables
            .values()
            .map(|t| t.max_commit_gap_ms)
            .max()
            .unwrap_or(0);
        Duration::from_millis(ms)
    }
}

/// Counts for one [`crate::Target`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetOutcomes {
    pub clients: usize,
    pub committed: u64,
    pub failed: u64,
    pub unknown: u64,
    pub connect_errors: u64,
    pub max_txn_latency_ms: u64,
}

/// Commits and stalls of one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableOutcomes {
    /// Committed transactions that touched the table.
    pub commits: u64,
    /// The longest wall-clock gap between two successive commits touching the table, counting
    /// from the workload's start and, for a snapshot, up to the snapshot (so a stall still in
    /// progress shows).
    pub max_commit_gap_ms: u64,
    /// When that gap began, in milliseconds from the workload's start.
    pub max_commit_gap_began_at_ms: u64,
    /// Rows updated by committed transactions (each update adds 1 to `v`).
    pub committed_updates: u64,
    /// Rows inserted by committed transactions (each with `v = 1`).
    pub committed_inserts: u64,
    /// Updates and inserts of transactions whose outcome is unknown.
    pub unknown_updates: u64,
    pub unknown_inserts: u64,
}

/// What the end of a transaction (or a connect attempt) was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureOutcome {
    Failed,
    Unknown,
    ConnectError,
}

impl FailureOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureOutcome::Failed => "failed",
            FailureOutcome::Unknown => "unknown",
            FailureOutcome::ConnectError => "connect_error",
        }
    }
}

/// One entry of the bounded failure log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// Milliseconds from the workload's start.
    pub at_ms: u64,
    /// Milliseconds since the Unix epoch.
    pub unix_ms: u64,
    pub target: String,
    pub client: usize,
    pub outcome: FailureOutcome,
    pub phase: Phase,
    pub code: String,
    pub error: SqlError,
    /// How long the transaction (or connect attempt) had run.
    pub elapsed_ms: u64,
}

/// Whether the tables changed exactly as the outcomes say: every committed update and insert
/// is there, no failed one is, and unknown ones are either.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConsistencyCheck {
    pub ok: bool,
    pub tables: BTreeMap<String, TableCheck>,
    /// Why the check could not be made (the tables could not be read).
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableCheck {
    pub before: TableState,
    pub after: TableState,
    /// Allowed ranges of `after - before`.
    pub rows_added: (i64, i64),
    pub sum_added: (i64, i64),
    pub ok: bool,
}

impl ConsistencyCheck {
    pub fn failed(error: String) -> Self {
        ConsistencyCheck {
            ok: false,
            tables: BTreeMap::new(),
            error: Some(error),
        }
    }

    /// Compares table states read before and after a workload with its outcomes. Exact when no
    /// transaction is unknown; otherwise each unknown one may or may not have committed.
    pub fn evaluate(
        before: &BTreeMap<String, TableState>,
        after: &BTreeMap<String, TableState>,
        tables: &BTreeMap<String, TableOutcomes>,
    ) -> Self {
        let mut check = ConsistencyCheck {
            ok: true,
            ..Default::default()
        };
        for (name, b) in before {
            let Some(a) = after.get(name) else {
                check.ok = false;
                check.error = Some(format!("table {name} missing after the run"));
                continue;
            };
            let t = tables.get(name).cloned().unwrap_or_default();
            let ci = t.committed_inserts as i64;
            let cu = t.committed_updates as i64;
            let ui = t.unknown_inserts as i64;
            let uu = t.unknown_updates as i64;
            let rows_added = (ci, ci + ui);
            let sum_added = (cu + ci, cu + ci + uu + ui);
            let dr = a.rows as i64 - b.rows as i64;
            let ds = a.sum - b.sum;
            let ok = (rows_added.0..=rows_added.1).contains(&dr)
                && (sum_added.0..=sum_added.1).contains(&ds);
            check.ok &= ok;
            check.tables.insert(
                name.clone(),
                TableCheck {
                    before: *b,
                    after: *a,
                    rows_added,
                    sum_added,
                    ok,
                },
            );
        }
        check
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(rows: u64, sum: i64) -> TableState {
        TableState { rows, sum }
    }

    fn one(name: &str, s: TableState) -> BTreeMap<String, TableState> {
        BTreeMap::from([(name.to_string(), s)])
    }

    #[test]
    fn exact_when_nothing_is_unknown() {
        let t = BTreeMap::from([(
            "t".to_string(),
            TableOutcomes {
                committed_updates: 10,
                committed_inserts: 2,
                ..Default::default()
            },
        )]);
        let before = one("t", state(100, 50));
        let good = ConsistencyCheck::evaluate(&before, &one("t", state(102, 62)), &t);
        assert!(good.ok, "{good:?}");
        // One more increment than committed: a "failed" transaction was applied after all.
        let extra = ConsistencyCheck::evaluate(&before, &one("t", state(102, 63)), &t);
        assert!(!extra.ok);
        // A committed insert is missing.
        let lost = ConsistencyCheck::evaluate(&before, &one("t", state(101, 61)), &t);
        assert!(!lost.ok);
    }

    #[test]
    fn unknown_transactions_widen_the_range() {
        let t = BTreeMap::from([(
            "t".to_string(),
            TableOutcomes {
                committed_updates: 10,
                unknown_updates: 3,
                unknown_inserts: 1,
                ..Default::default()
            },
        )]);
        let before = one("t", state(100, 0));
        for (rows, sum, ok) in [
            (100, 10, true),
            (101, 14, true),
            (100, 13, true),
            (100, 9, false),
            (101, 15, false),
            (102, 12, false),
        ] {
            let c = ConsistencyCheck::evaluate(&before, &one("t", state(rows, sum)), &t);
            assert_eq!(c.ok, ok, "rows {rows} sum {sum}: {c:?}");
        }
        let c = ConsistencyCheck::evaluate(&before, &BTreeMap::new(), &t);
        assert!(!c.ok && c.error.is_some());
    }
}
