//! The three kernel services the operator speaks to. Each has one request and one response
//! type (no type tag travels on the wire) and puts the request id in protobuf field 1.

use crate::pb::{lock, logservice, query};
use prost::Message;

/// A morpc service: its message types and how its frames are flagged.
pub trait Service: Send + Sync + 'static {
    type Request: Message + Default + Clone + Send + 'static;
    type Response: Message + Default + Clone + Send + 'static;
    /// For logs and errors.
    const NAME: &'static str;
    /// The kernel's Go type is a `PayloadMessage` (frames carry the payload-size field).
    const PAYLOAD: bool;
    /// The largest answer body this client reads for this service: well above what a real
    /// cluster answers (a GetClusterDetails of hundreds of CNs is a few MiB), far below the
    /// kernel's own 100 MiB, so a garbage length costs little.
    const MAX_BODY: usize = 16 << 20;

    fn set_request_id(request: &mut Self::Request, id: u64);
    fn request_id(request: &Self::Request) -> u64;
    fn response_id(response: &Self::Response) -> u64;
    /// The kernel's answer to a method it has no handler for.
    fn not_supported(request: &Self::Request) -> Self::Response;
}

/// Every kernel message keeps its request id in field 1, `RequestID`.
macro_rules! request_id_is_field_1 {
    () => {
        fn set_request_id(request: &mut Self::Request, id: u64) {
            request.request_id = id;
        }
        fn request_id(request: &Self::Request) -> u64 {
            request.request_id
        }
        fn response_id(response: &Self::Response) -> u64 {
            response.request_id
        }
    };
}

/// HAKeeper, on the log service's RPC port (32001 by default).
pub struct HaKeeper;
/// The lock-table allocator, on the TN's lock-service address (22002 by default).
pub struct LockAllocator;
/// A CN's query service (19998 by default).
pub struct QueryService;

impl Service for HaKeeper {
    type Request = logservice::Request;
    type Response = logservice::Response;
    const NAME: &'static str = "logservice";
    const PAYLOAD: bool = true;

    request_id_is_field_1!();
    fn not_supported(request: &Self::Request) -> Self::Response {
        logservice::Response {
            request_id: request.request_id,
            method: request.method,
            error_code: crate::error::code::NOT_SUPPORTED,
            error_message: format!("not supported: logservice method type {}", request.method),
            ..Default::default()
        }
    }
}

impl Service for LockAllocator {
    type Request = lock::Request;
    type Response = lock::Response;
    const NAME: &'static str = "lock";
    const MAX_BODY: usize = 4 << 20;
    const PAYLOAD: bool = false;

    request_id_is_field_1!();
    fn not_supported(request: &Self::Request) -> Self::Response {
        let name = lock::Method::try_from(request.method)
            .map(|m| m.as_str_name().to_string())
            .unwrap_or_else(|_| request.method.to_string());
        lock::Response {
            request_id: request.request_id,
            method: request.method,
            error: crate::KernelError::new(
                crate::error::code::NOT_SUPPORTED,
                format!("not supported: method [{name}]"),
            )
            .to_bytes(),
            ..Default::default()
        }
    }
}

impl Service for QueryService {
    type Request = query::Request;
    type Response = query::Response;
    const NAME: &'static str = "query";
    const PAYLOAD: bool = false;

    request_id_is_field_1!();
    fn not_supported(request: &Self::Request) -> Self::Response {
        query::Response {
            request_id: request.request_id,
            cmd_method: request.cmd_method,
            error: crate::KernelError::new(
                crate::error::code::NOT_SUPPORTED,
                format!(
                    "not supported: {} not support in current service",
                    request.cmd_method
                ),
            )
            .to_bytes(),
            ..Default::default()
        }
    }
}
