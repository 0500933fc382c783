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
//! The first CN that locks a table owns its lock table (the TN's allocator binds it). DML on a
//! table needs two binds (see [`lockkey`] for the kernel sources): its rows' lock table
//! `(group 0, rel_id)` ([`row_lock_table`] of [`table_id`], the table's
//! `mo_catalog.mo_tables.rel_id`), and the lock table holding the table's own `mo_tables` row,
//! which every DML statement locks in shared mode: `(account id, CRC-64 of the packed row key)`
//! ([`catalog_lock_table`]). [`make_owner`] runs one locking transaction on a chosen CN so that
//! it binds the tables nobody bound yet.

mod classify;
mod error;
pub mod lockkey;
mod outcomes;
mod schema;
mod target;
mod workload;

pub use classify::{ErrorKind, Phase, SqlError};
pub use error::{Error, Result};
pub use lockkey::{LockTableKey, catalog_lock_table, row_lock_table};
pub use outcomes::{
    ConsistencyCheck, FailureOutcome, FailureRecord, Outcomes, TableCheck, TableOutcomes,
    TargetOutcomes,
};
pub use schema::{
    HeldLock, TableState, hold_row_lock, make_owner, prepare, rows_as_text, table_id, table_states,
    write_once,
};
pub use target::Target;
pub use workload::{Pacing, TargetLoad, Workload, WorkloadConfig};
