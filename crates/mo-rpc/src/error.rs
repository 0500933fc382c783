//! Typed errors. A caller decides on the *kind* of a failure, never on its text: "does not
//! exist" is a variant of its own, distinct from a transport failure and from a timeout, so
//! that the decision core can keep each as the uncertainty it is.

use crate::pb::moerr;
use prost::Message;
use std::time::Duration;

/// Kernel error codes (`pkg/common/moerr/error.go`) the client tells apart.
pub mod code {
    pub const INTERNAL: u32 = 20101;
    pub const NOT_SUPPORTED: u32 = 20105;
    pub const NO_HAKEEPER: u32 = 20417;
    pub const NO_SERVICE: u32 = 20422;
    pub const DRAGONBOAT_TIMEOUT: u32 = 20429;
    pub const DRAGONBOAT_REJECTED: u32 = 20432;
    pub const DRAGONBOAT_SHARD_NOT_READY: u32 = 20434;
    pub const DRAGONBOAT_CLOSED: u32 = 20435;
    pub const DRAGONBOAT_SHARD_NOT_FOUND: u32 = 20437;
    pub const RPC_TIMEOUT: u32 = 20500;
    pub const SERVICE_UNAVAILABLE: u32 = 20506;
    pub const TN_SHARD_NOT_FOUND: u32 = 20605;
    pub const TXN_NOT_FOUND: u32 = 20611;
    pub const NOT_FOUND: u32 = 20620;
    pub const LOCK_TABLE_NOT_FOUND: u32 = 20703;
    pub const TASK_NOT_FOUND: u32 = 20906;
    pub const REPLICA_NOT_FOUND: u32 = 21101;
    /// `mysql_code` the kernel puts on almost every error (ER_UNKNOWN_ERROR).
    pub const MYSQL_UNKNOWN: u32 = 1105;
}

/// What a failure means to a caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The kernel says the thing asked about does not exist (an unknown CN, a missing shard).
    DoesNotExist,
    /// No answer in time: the request may or may not have been carried out.
    Timeout,
    /// The kernel does not offer this method.
    Unsupported,
    /// Could not reach the service, the connection broke, it answered garbage, or it said it
    /// cannot serve now (not the HAKeeper, shard not ready, closing).
    Unavailable,
}

/// An error the kernel answered with: `(code, message)` as `moerr` formats them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("kernel error {code}: {message}")]
pub struct KernelError {
    pub code: u32,
    pub message: String,
}

impl KernelError {
    pub fn new(code: u32, message: impl Into<String>) -> KernelError {
        KernelError {
            code,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self.code {
            code::NO_SERVICE
            | code::TN_SHARD_NOT_FOUND
            | code::TXN_NOT_FOUND
            | code::NOT_FOUND
            | code::LOCK_TABLE_NOT_FOUND
            | code::TASK_NOT_FOUND
            | code::REPLICA_NOT_FOUND => ErrorKind::DoesNotExist,
            // HAKeeper reports an unknown CN as an internal error whose only mark is the text
            // ("internal error: CN [uuid] does not exist"): recognised here, once.
            code::INTERNAL if self.message.ends_with("does not exist") => ErrorKind::DoesNotExist,
            code::NOT_SUPPORTED => ErrorKind::Unsupported,
            code::DRAGONBOAT_TIMEOUT | code::RPC_TIMEOUT => ErrorKind::Timeout,
            _ => ErrorKind::Unavailable,
        }
    }

    /// The bytes lock and query responses carry in their `Error` field.
    pub fn to_bytes(&self) -> Vec<u8> {
        moerr::Error {
            code: self.code,
            mysql_code: code::MYSQL_UNKNOWN,
            message: self.message.clone(),
            sql_state: "HY000".into(),
        }
        .encode_to_vec()
    }

    /// Reads a lock or query response's `Error` field; `None` when it is empty (success).
    pub fn from_bytes(bytes: &[u8]) -> Result<Option<KernelError>, prost::DecodeError> {
        if bytes.is_empty() {
            return Ok(None);
        }
        let e = moerr::Error::decode(bytes)?;
        Ok(Some(KernelError::new(e.code, e.message)))
    }
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum RpcError {
    #[error("connecting to {address}: {detail}")]
    Connect { address: String, detail: String },
    #[error("{address}: connection lost: {detail}")]
    ConnectionLost { address: String, detail: String },
    #[error("{address}: no answer within {timeout:?}")]
    Timeout { address: String, timeout: Duration },
    #[error("{address}: malformed answer: {detail}")]
    Malformed { address: String, detail: String },
    #[error("{address}: {error}")]
    Kernel { address: String, error: KernelError },
    #[error("no HAKeeper found: {}", tried.join("; "))]
    NoHaKeeper { tried: Vec<String> },
}

impl RpcError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            RpcError::Timeout { .. } => ErrorKind::Timeout,
            RpcError::Kernel { error, .. } => error.kind(),
            RpcError::Connect { .. }
            | RpcError::ConnectionLost { .. }
            | RpcError::Malformed { .. }
            | RpcError::NoHaKeeper { .. } => ErrorKind::Unavailable,
        }
    }

    /// The kernel's own code, when the kernel answered.
    pub fn kernel_code(&self) -> Option<u32> {
        match self {
            RpcError::Kernel { error, .. } => Some(error.code),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_cn_is_does_not_exist_and_an_unknown_method_is_unsupported() {
        let unknown = KernelError::new(code::INTERNAL, "internal error: CN [cn-9] does not exist");
        assert_eq!(unknown.kind(), ErrorKind::DoesNotExist);
        let internal = KernelError::new(code::INTERNAL, "internal error: queue full");
        assert_eq!(internal.kind(), ErrorKind::Unavailable);
        assert_eq!(
            KernelError::new(code::NOT_SUPPORTED, "not supported").kind(),
            ErrorKind::Unsupported
        );
        assert_eq!(
            KernelError::new(code::DRAGONBOAT_TIMEOUT, "").kind(),
            ErrorKind::Timeout
        );
        // "Not the HAKeeper" is not "does not exist": the client looks for the HAKeeper again.
        assert_eq!(
            KernelError::new(code::DRAGONBOAT_SHARD_NOT_FOUND, "").kind(),
            ErrorKind::Unavailable
        );
    }

    #[test]
    fn moerr_bytes_round_trip_and_empty_means_success() {
        let e = KernelError::new(code::SERVICE_UNAVAILABLE, "CN query service is closing");
        assert_eq!(KernelError::from_bytes(&e.to_bytes()).unwrap(), Some(e));
        assert_eq!(KernelError::from_bytes(&[]).unwrap(), None);
        assert!(KernelError::from_bytes(&[0x0a, 0x05, 0x01]).is_err());
    }
}
