//! What an error from the MySQL protocol means for the transaction it hit.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where in a client's cycle an error came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Opening the connection: no transaction was started.
    Connect,
    /// `BEGIN`.
    Begin,
    /// A DML statement inside the transaction, before `COMMIT` was sent.
    Statement,
    /// `COMMIT` was in flight.
    Commit,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Connect => "connect",
            Phase::Begin => "begin",
            Phase::Statement => "statement",
            Phase::Commit => "commit",
        }
    }
}

/// What kind of error the client saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// An error packet from the server (the session is still usable).
    Server,
    /// The connection broke (EOF, reset, refused).
    Io,
    /// No answer within the configured timeout; the session state is unknown.
    Timeout,
    /// The client library gave up (protocol error, closed connection, ...).
    Driver,
}

/// One error, as far as the client can tell what it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SqlError {
    pub kind: ErrorKind,
    /// The code in the MySQL error packet. MatrixOne puts its own code here when it has no MySQL
    /// equivalent (`ER_UNKNOWN_ERROR`), so this is often a MatrixOne code such as 20635.
    pub mysql_code: Option<u16>,
    /// The MatrixOne error code (`pkg/common/moerr`), from the packet's code or, for wrapped
    /// errors sent as a generic MySQL code, recognised from the message.
    pub mo_code: Option<u16>,
    pub sql_state: Option<String>,
    pub message: String,
}

/// MatrixOne's own codes start at 20100 (`moerr.ErrInfo`) and stay below 30000 in v1.2; MySQL
/// server codes stay below 20000 and client codes are 2000..3000.
const MO_CODES: std::ops::Range<u16> = 20000..30000;

/// Messages of `moerr` errors that matter during restarts and hand-overs (v1.2.4
/// `pkg/common/moerr/error.go`), for errors that reach the client wrapped in another error.
const KNOWN_MESSAGES: &[(&str, u16)] = &[
    ("rpc timeout", 20500),
    ("the connection has been disconnected", 20502),
    ("no available backend", 20504),
    ("can not connect to remote backend", 20505),
    ("txn write conflict", 20601),
    ("retry for cn rolling restart", 20634),
    ("new txn in cn rolling restart", 20635),
    ("deadlock detected", 20701),
    ("lock table bind changed", 20702),
    ("lock table not found on remote lock service", 20703),
];

/// Codes that, returned by `COMMIT`, mean the transaction was aborted for sure: the TN refused
/// it (changed lock-table bind, write conflict) or the lock service aborted it (deadlock). Any
/// other error during `COMMIT` may have come after the TN committed (e.g. 20502 "the connection
/// has been disconnected" between CN and TN), so it counts as unknown.
const DEFINITE_AT_COMMIT: &[u16] = &[20601, 20701, 20702];

impl SqlError {
    pub fn from_mysql(err: &mysql_async::Error) -> Self {
        match err {
            mysql_async::Error::Server(e) => {
                let mo_code = if MO_CODES.contains(&e.code) {
                    Some(e.code)
                } else {
                    mo_code_from_message(&e.message)
                };
                SqlError {
                    kind: ErrorKind::Server,
                    mysql_code: Some(e.code),
                    mo_code,
                    sql_state: Some(e.state.clone()),
                    message: e.message.clone(),
                }
            }
            mysql_async::Error::Io(e) => SqlError::without_code(ErrorKind::Io, e.to_string()),
            other => SqlError::without_code(ErrorKind::Driver, other.to_string()),
        }
    }

    pub fn timeout(what: &str, after: Duration) -> Self {
        SqlError::without_code(
            ErrorKind::Timeout,
            format!("{what}: no answer within {after:?}"),
        )
    }

    pub(crate) fn config(message: String) -> Self {
        SqlError::without_code(ErrorKind::Driver, message)
    }

    fn without_code(kind: ErrorKind, message: String) -> Self {
        SqlError {
            kind,
            mysql_code: None,
            mo_code: mo_code_from_message(&message),
            sql_state: None,
            message,
        }
    }

    /// A short, stable key for counting: the MatrixOne code if there is one, else `mysql-<code>`,
    /// else the kind (`io`, `timeout`, `driver`).
    pub fn label(&self) -> String {
        match (self.mo_code, self.mysql_code, self.kind) {
            (Some(mo), _, _) => mo.to_string(),
            (None, Some(my), _) => format!("mysql-{my}"),
            (None, None, ErrorKind::Io) => "io".into(),
            (None, None, ErrorKind::Timeout) => "timeout".into(),
            (None, None, _) => "driver".into(),
        }
    }

    /// Whether the session can still be used (e.g. for `ROLLBACK`): only after an error packet.
    pub fn session_usable(&self) -> bool {
        self.kind == ErrorKind::Server
    }

    /// Whether this error, returned while `COMMIT` was in flight, proves the transaction did not
    /// commit.
    pub fn definite_at_commit(&self) -> bool {
        self.kind == ErrorKind::Server
            && self
                .mo_code
                .is_some_and(|c| DEFINITE_AT_COMMIT.contains(&c))
    }
}

impl std::fmt::Display for SqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.mysql_code, self.mo_code) {
            (Some(my), Some(mo)) if my != mo => write!(f, "[{my}/mo {mo}] {}", self.message),
            (Some(code), _) | (None, Some(code)) => write!(f, "[{code}] {}", self.message),
            (None, None) => write!(f, "[{:?}] {}", self.kind, self.message),
        }
    }
}

fn mo_code_from_message(message: &str) -> Option<u16> {
    let lower = message.to_ascii_lowercase();
    KNOWN_MESSAGES
        .iter()
        .find(|(needle, _)| lower.contains(needle))
        .map(|&(_, code)| code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16, message: &str) -> mysql_async::Error {
        mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: message.into(),
            state: "HY000".into(),
        })
    }

    #[test]
    fn a_matrixone_code_in_the_packet_is_kept_as_both_codes() {
        let e = SqlError::from_mysql(&server(20635, "new txn in CN rolling restart"));
        assert_eq!(e.kind, ErrorKind::Server);
        assert_eq!(e.mysql_code, Some(20635));
        assert_eq!(e.mo_code, Some(20635));
        assert_eq!(e.label(), "20635");
        assert!(e.session_usable());
        assert!(!e.definite_at_commit());
    }

    #[test]
    fn a_wrapped_matrixone_error_is_recognised_from_its_message() {
        let e = SqlError::from_mysql(&server(
            1815,
            "internal error: can not connect to remote backend, dial tcp 127.0.10.5:18003: connect: connection refused",
        ));
        assert_eq!(e.mysql_code, Some(1815));
        assert_eq!(e.mo_code, Some(20505));
        assert_eq!(e.label(), "20505");
        assert_eq!(e.to_string().split(']').next(), Some("[1815/mo 20505"));
    }

    #[test]
    fn a_plain_mysql_error_is_labelled_by_its_mysql_code() {
        let e = SqlError::from_mysql(&server(1062, "Duplicate entry '3' for key 'id'"));
        assert_eq!(e.mo_code, None);
        assert_eq!(e.label(), "mysql-1062");
    }

    #[test]
    fn only_refusals_by_the_kernel_are_definite_at_commit() {
        assert!(
            SqlError::from_mysql(&server(20702, "lock table bind changed")).definite_at_commit()
        );
        assert!(SqlError::from_mysql(&server(20601, "txn write conflict x")).definite_at_commit());
        // The CN lost the TN while committing: the TN may have committed.
        assert!(
            !SqlError::from_mysql(&server(20502, "the connection has been disconnected"))
                .definite_at_commit()
        );
        let io = SqlError::from_mysql(&mysql_async::Error::Io(mysql_async::IoError::Io(
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "eof"),
        )));
        assert_eq!(io.kind, ErrorKind::Io);
        assert_eq!(io.label(), "io");
        assert!(!io.session_usable());
        assert!(!io.definite_at_commit());
        let t = SqlError::timeout("COMMIT", Duration::from_secs(3));
        assert_eq!(t.label(), "timeout");
        assert!(!t.definite_at_commit());
    }
}
