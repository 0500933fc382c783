use crate::classify::SqlError;

/// Errors of the helpers and of starting a workload. Failures of the workload's own
/// transactions are not errors: they are counted in [`crate::Outcomes`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("invalid address {0:?}: expected host:port")]
    Address(String),
    #[error("{target}: {error}")]
    Sql { target: String, error: SqlError },
    #[error("{target}: table {database}.{table} not found in mo_catalog.mo_tables")]
    TableNotFound {
        target: String,
        database: String,
        table: String,
    },
    #[error("{target}: {database}.{table} has no row to lock (run prepare first)")]
    NoRowToLock {
        target: String,
        database: String,
        table: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
