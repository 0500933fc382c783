//! Where SQL goes, and opening sessions there.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use serde::{Deserialize, Serialize};

use crate::classify::SqlError;
use crate::error::{Error, Result};

/// A MySQL-protocol endpoint: the proxy, or one CN's SQL port directly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// A name for reports (e.g. `proxy`, `cn0`).
    pub name: String,
    /// `host:port`.
    pub address: String,
    pub user: String,
    pub password: String,
}

impl Target {
    pub fn new(name: impl Into<String>, address: impl Into<String>) -> Self {
        Target {
            name: name.into(),
            address: address.into(),
            user: "dump".into(),
            password: "111".into(),
        }
    }

    pub fn with_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.user = user.into();
        self.password = password.into();
        self
    }

    pub(crate) fn opts(&self) -> Result<mysql_async::Opts> {
        let (host, port) = self
            .address
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
            .filter(|(h, _)| !h.is_empty())
            .ok_or_else(|| Error::Address(self.address.clone()))?;
        Ok(mysql_async::OptsBuilder::default()
            .ip_or_hostname(host)
            .tcp_port(port)
            .user(Some(&self.user))
            .pass(Some(&self.password))
            // The library would otherwise ask for `@@socket` and switch to a unix socket on
            // loopback, bypassing the address we were told to use.
            .prefer_socket(false)
            // Given values spare the connect-time `SELECT @@max_allowed_packet, @@wait_timeout`.
            .max_allowed_packet(Some(16 << 20))
            .wait_timeout(Some(28_800))
            .stmt_cache_size(0)
            .tcp_nodelay(true)
            .into())
    }

    /// Opens one session, within `timeout`.
    pub(crate) async fn connect(&self, timeout: Duration) -> Result<mysql_async::Conn, SqlError> {
        let opts = self.opts().map_err(|e| SqlError::config(e.to_string()))?;
        match tokio::time::timeout(timeout, mysql_async::Conn::new(opts)).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(SqlError::from_mysql(&e)),
            Err(_) => Err(SqlError::timeout("connect", timeout)),
        }
    }

    /// Waits until the endpoint logs a session in and answers `SELECT 1`, trying every half
    /// second for up to `limit`. A CN accepts connections before it can serve them: at boot
    /// it answers 20101 "there is no tenant sys" for a while (measured on v1.2.4).
    pub async fn wait_serving(&self, limit: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let attempt = async {
                let mut conn = self.connect(Duration::from_secs(5)).await?;
                let answer = conn
                    .query_drop("SELECT 1")
                    .await
                    .map_err(|e| SqlError::from_mysql(&e));
                let _ = conn.disconnect().await;
                answer
            };
            match attempt.await {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(self.sql_error(e));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    pub(crate) fn sql_error(&self, error: SqlError) -> Error {
        Error::Sql {
            target: self.name.clone(),
            error,
        }
    }
}

/// Runs one statement within `timeout`; returns the affected row count.
pub(crate) async fn exec(
    conn: &mut mysql_async::Conn,
    sql: &str,
    timeout: Duration,
) -> Result<u64, SqlError> {
    match tokio::time::timeout(timeout, conn.query_drop(sql)).await {
        Ok(Ok(())) => Ok(conn.affected_rows()),
        Ok(Err(e)) => Err(SqlError::from_mysql(&e)),
        Err(_) => Err(SqlError::timeout(first_word(sql), timeout)),
    }
}

fn first_word(sql: &str) -> &str {
    sql.split_whitespace().next().unwrap_or(sql)
}

/// Table and database names are spliced into SQL text: allow plain identifiers only.
pub(crate) fn check_identifier(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{what} {name:?} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_into_host_and_port() {
        let opts = Target::new("p", "127.0.10.7:6001").opts().unwrap();
        assert_eq!(opts.ip_or_hostname(), "127.0.10.7");
        assert_eq!(opts.tcp_port(), 6001);
        assert_eq!(opts.user(), Some("dump"));
        assert!(!opts.prefer_socket());
        let v6 = Target::new("p", "[::1]:6001").opts().unwrap();
        assert_eq!(v6.ip_or_hostname(), "::1");
        for bad in ["127.0.0.1", ":6001", "host:port", "host:70000"] {
            assert!(
                matches!(Target::new("p", bad).opts(), Err(Error::Address(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn only_plain_identifiers_pass() {
        assert!(check_identifier("table", "t_1").is_ok());
        for bad in ["", "1t", "t;drop", "a b", "t`", "db.t"] {
            assert!(check_identifier("table", bad).is_err(), "{bad}");
        }
    }
}
