//! A real SQL workload against MatrixOne over the MySQL protocol, for end-to-end tests that
//! prove an operator never breaks a transaction.
//!
//! Clients (Tokio tasks) connect to [`Target`]s (the proxy, or a CN's SQL port) and run short
//! explicit pessimistic transactions: `BEGIN`, a few `UPDATE t SET v = v + 1 WHERE id = ?` and
//! `INSERT`s on random rows of the [`prepare`]d tables, `COMMIT`. Every transaction ends in
//! exactly one of:
//! - **committed**: `COMMIT` answered OK;
//! - **failed** (definite): an error before `COMMIT` was sent (`BEGIN` or a DML statement; the
//!   client then rolls back, ignoring errors, and reconnects if the session broke), or a
//!   `COMMIT` the kernel refused for sure (20601 write conflict, 20701 deadlock, 20702 "lock
//!   table bind changed");
//! - **unknown**: any other error, disconnect or timeout while `COMMIT` was in flight.
//!
//! Failed connects are counted apart (`connect_errors`): no transaction was started.
//! Errors are keyed by [`SqlError::label`]: MatrixOne sends its own code in the MySQL error
//! packet when it has no MySQL equivalent (so 20635 "new txn in CN rolling restart" arrives as
//! code 20635), otherwise the MySQL code; wrapped kernel errors are recognised by message.
//!
//! [`Outcomes`] also carry, per table, the longest wall-clock gap between two commits touching
//! it (a DML stall) and, after [`Workload::stop`], a [`ConsistencyCheck`]: the tables' row
//! counts and sums of `v` before and after must match the committed statements exactly, give or
//! take the unknown ones. A "failed" transaction that was applied after all shows there.
//!
//! # Lock tables
//! The first CN that locks a table owns its lock table (the TN's allocator binds it). The bind
//! is keyed by `(group, table id)`: for DML and `SELECT ... FOR UPDATE` the group is 0 and the
//! table id is the table's `mo_catalog.mo_tables.rel_id` ([`table_id`]); rows are not sharded
//! (kernel v1.2.4 `pkg/sql/plan/build_dml_util.go` `LockTarget{TableId: tableDef.TblId}`,
//! `pkg/sql/colexec/lockop/lock_op.go` (group left 0), `pkg/lockservice/service.go`
//! `getLockTableWithCreate(group, tableID, ...)`). [`make_owner`] runs one locking transaction
//! on a chosen CN so that it binds a table first.

mod classify;
mod error;
mod outcomes;
mod schema;
mod target;
mod workload;

pub use classify::{ErrorKind, Phase, SqlError};
pub use error::{Error, Result};
pub use outcomes::{
    ConsistencyCheck, FailureOutcome, FailureRecord, Outcomes, TableCheck, TableOutcomes,
    TargetOutcomes,
};
pub use schema::{TableState, make_owner, prepare, table_id, table_states};
pub use target::Target;
pub use workload::{Pacing, TargetLoad, Workload, WorkloadConfig};
