//! Setting up the workload's tables, and the lock-table helpers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use serde::{Deserialize, Serialize};

use crate::classify::SqlError;
use crate::error::{Error, Result};
use crate::target::{Target, check_identifier, exec};

/// Setup statements are few but DDL on a busy cluster can be slow.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Rows per `INSERT` when filling a table.
const INSERT_BATCH: usize = 500;

/// Creates `database` and each table (`id BIGINT PRIMARY KEY, v BIGINT NOT NULL`) and leaves
/// exactly the rows `id = 1..=rows`: missing ones are inserted with `v = 0`, rows a workload
/// inserted earlier (ids outside that range) are deleted, existing `v` values are kept.
/// Running it again changes nothing.
pub async fn prepare(target: &Target, database: &str, tables: &[String], rows: u64) -> Result<()> {
    check_identifier("database", database)?;
    for t in tables {
        check_identifier("table", t)?;
    }
    if rows == 0 {
        return Err(Error::Config("rows must be at least 1".into()));
    }
    let mut conn = connect(target).await?;
    run(
        &mut conn,
        target,
        &format!("CREATE DATABASE IF NOT EXISTS {database}"),
    )
    .await?;
    for t in tables {
        run(
            &mut conn,
            target,
            &format!(
                "CREATE TABLE IF NOT EXISTS {database}.{t} (id BIGINT PRIMARY KEY, v BIGINT NOT NULL)"
            ),
        )
        .await?;
    }
    for t in tables {
        let removed = run(
            &mut conn,
            target,
            &format!("DELETE FROM {database}.{t} WHERE id < 1 OR id > {rows}"),
        )
        .await?;
        let present: BTreeSet<u64> = query(&mut conn, &format!("SELECT id FROM {database}.{t}"))
            .await
            .map_err(|e| target.sql_error(e))?
            .into_iter()
            .collect();
        let missing: Vec<u64> = (1..=rows).filter(|id| !present.contains(id)).collect();
        for chunk in missing.chunks(INSERT_BATCH) {
            let values: Vec<String> = chunk.iter().map(|id| format!("({id}, 0)")).collect();
            run(
                &mut conn,
                target,
                &format!(
                    "INSERT INTO {database}.{t} (id, v) VALUES {}",
                    values.join(", ")
                ),
            )
            .await?;
        }
        tracing::info!(target = %target.name, table = %format!("{database}.{t}"), removed, inserted = missing.len(), "table prepared");
    }
    let _ = conn.disconnect().await;
    Ok(())
}

/// The table's id (`mo_catalog.mo_tables.rel_id`), the key of its rows' lock table
/// ([`crate::row_lock_table`]: group 0, no row sharding). A table with unique secondary indexes
/// also locks its hidden index tables, each by its own rel_id; the tables made here have none.
pub async fn table_id(target: &Target, database: &str, table: &str) -> Result<u64> {
    check_identifier("database", database)?;
    check_identifier("table", table)?;
    let mut conn = connect(target).await?;
    let ids: Vec<u64> = query(
        &mut conn,
        &format!(
            "SELECT rel_id FROM mo_catalog.mo_tables WHERE reldatabase = '{database}' AND relname = '{table}'"
        ),
    )
    .await
    .map_err(|e| target.sql_error(e))?;
    let _ = conn.disconnect().await;
    ids.first().copied().ok_or_else(|| Error::TableNotFound {
        target: target.name.clone(),
        database: database.into(),
        table: table.into(),
    })
}

/// Runs one short locking transaction on `cn` (connect to the CN's own SQL port, not the
/// proxy): `BEGIN; SELECT id ... WHERE id = 1 FOR UPDATE; COMMIT`.
///
/// The first CN that locks a table becomes the owner of its lock table, so on a table nobody
/// has locked since the TN (its allocator) started, this makes `cn` the owner. If another CN
/// already owns a valid bind, the bind does not move: check the owner with the allocator.
pub async fn make_owner(cn: &Target, database: &str, table: &str) -> Result<()> {
    check_identifier("database", database)?;
    check_identifier("table", table)?;
    let mut conn = connect(cn).await?;
    let result = async {
        exec(&mut conn, "BEGIN", SETUP_TIMEOUT).await?;
        let locked: Vec<u64> = query(
            &mut conn,
            &format!("SELECT id FROM {database}.{table} WHERE id = 1 FOR UPDATE"),
        )
        .await?;
        if locked.is_empty() {
            exec(&mut conn, "ROLLBACK", SETUP_TIMEOUT).await?;
            return Ok(false);
        }
        exec(&mut conn, "COMMIT", SETUP_TIMEOUT).await?;
        Ok(true)
    }
    .await;
    let _ = conn.disconnect().await;
    match result {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::NoRowToLock {
            target: cn.name.clone(),
            database: database.into(),
            table: table.into(),
        }),
        Err(e) => Err(cn.sql_error(e)),
    }
}

/// Row count and sum of `v` of one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableState {
    pub rows: u64,
    pub sum: i64,
}

/// Reads the state of each table (one read-only statement per table).
pub async fn table_states(
    target: &Target,
    database: &str,
    tables: &[String],
) -> Result<BTreeMap<String, TableState>> {
    check_identifier("database", database)?;
    let mut conn = connect(target).await?;
    let mut states = BTreeMap::new();
    for t in tables {
        check_identifier("table", t)?;
        // SUM of a BIGINT may come back as a DECIMAL: cast it so it parses as an integer.
        let row: Vec<(u64, i64)> = query(
            &mut conn,
            &format!("SELECT COUNT(*), CAST(COALESCE(SUM(v), 0) AS SIGNED) FROM {database}.{t}"),
        )
        .await
        .map_err(|e| target.sql_error(e))?;
        let (rows, sum) = row.first().copied().unwrap_or((0, 0));
        states.insert(t.clone(), TableState { rows, sum });
    }
    let _ = conn.disconnect().await;
    Ok(states)
}

/// One write transaction on `target`: `UPDATE <table> SET v = v + 1 WHERE id = <id>`, then
/// `COMMIT`. The kernel's refusal comes back as [`Error::Sql`] (e.g. 20635 "new txn in CN
/// rolling restart" on a CN marked for a restart).
pub async fn write_once(target: &Target, database: &str, table: &str, id: u64) -> Result<()> {
    check_identifier("database", database)?;
    check_identifier("table", table)?;
    let mut conn = connect(target).await?;
    let result = async {
        exec(&mut conn, "BEGIN", SETUP_TIMEOUT).await?;
        exec(
            &mut conn,
            &format!("UPDATE {database}.{table} SET v = v + 1 WHERE id = {id}"),
            SETUP_TIMEOUT,
        )
        .await?;
        exec(&mut conn, "COMMIT", SETUP_TIMEOUT).await
    }
    .await;
    if result.is_err() {
        let _ = exec(&mut conn, "ROLLBACK", SETUP_TIMEOUT).await;
    }
    let _ = conn.disconnect().await;
    result.map(|_| ()).map_err(|e| target.sql_error(e))
}

/// An open transaction holding the lock of one row (a long statement in flight, as far as
/// the lock service sees it) until [`HeldLock::commit`].
pub struct HeldLock {
    conn: mysql_async::Conn,
    target: Target,
}

/// Begins a transaction on `target` and locks row `id` of `table` (`UPDATE … WHERE id = id`).
pub async fn hold_row_lock(
    target: &Target,
    database: &str,
    table: &str,
    id: u64,
) -> Result<HeldLock> {
    check_identifier("database", database)?;
    check_identifier("table", table)?;
    let mut conn = connect(target).await?;
    exec(&mut conn, "BEGIN", SETUP_TIMEOUT)
        .await
        .map_err(|e| target.sql_error(e))?;
    exec(
        &mut conn,
        &format!("UPDATE {database}.{table} SET v = v + 1 WHERE id = {id}"),
        SETUP_TIMEOUT,
    )
    .await
    .map_err(|e| target.sql_error(e))?;
    Ok(HeldLock {
        conn,
        target: target.clone(),
    })
}

impl HeldLock {
    pub async fn commit(mut self) -> Result<()> {
        let result = exec(&mut self.conn, "COMMIT", SETUP_TIMEOUT).await;
        let _ = self.conn.disconnect().await;
        result.map(|_| ()).map_err(|e| self.target.sql_error(e))
    }
}

async fn connect(target: &Target) -> Result<mysql_async::Conn> {
    target.opts()?;
    target
        .connect(SETUP_TIMEOUT)
        .await
        .map_err(|e| target.sql_error(e))
}

async fn run(conn: &mut mysql_async::Conn, target: &Target, sql: &str) -> Result<u64> {
    exec(conn, sql, SETUP_TIMEOUT)
        .await
        .map_err(|e| target.sql_error(e))
}

async fn query<T>(conn: &mut mysql_async::Conn, sql: &str) -> Result<Vec<T>, SqlError>
where
    T: mysql_async::prelude::FromRow + Send + 'static,
{
    match tokio::time::timeout(SETUP_TIMEOUT, conn.query::<T, _>(sql)).await {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(e)) => Err(SqlError::from_mysql(&e)),
        Err(_) => Err(SqlError::timeout("query", SETUP_TIMEOUT)),
    }
}

/// The rows of a read-only statement, every value as text (diagnostics: the kernel's system
/// views such as `mo_transactions` and `mo_locks`, printed when a test's expectation fails).
pub async fn rows_as_text(target: &Target, sql: &str) -> Result<Vec<Vec<String>>> {
    let mut conn = connect(target).await?;
    let rows: Result<Vec<mysql_async::Row>, SqlError> = query(&mut conn, sql).await;
    let _ = conn.disconnect().await;
    let rows = rows.map_err(|e| target.sql_error(e))?;
    Ok(rows
        .into_iter()
        .map(|row| {
            row.unwrap()
                .into_iter()
                .map(|v| match v {
                    mysql_async::Value::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
                    mysql_async::Value::NULL => "NULL".into(),
                    other => other.as_sql(true),
                })
                .collect()
        })
        .collect())
}
