//! MatrixOne's RPC protocol ("morpc") in Rust, as the kernel's `pkg/common/morpc` codec writes
//! and reads it: one length-prefixed frame per message, a flag byte, an xxHash64 checksum,
//! the deadline and trace headers, and a protobuf body whose field 1 is the request id.
//!
//! - [`frame`]: the framing (no I/O). Decoding is total: malformed, truncated or oversized
//!   input is a typed error, never a panic, and nothing is allocated beyond the bytes given.
//! - [`pb`]: the messages, generated from `proto/` (the kernel's field numbers).
//! - [`transport`]: a multiplexed TCP client connection and a server loop.
//! - [`client`]: HAKeeper (with discovery), the TN lock allocator and a CN's query service.
//! - [`error`]: typed errors; "does not exist" is a kind of its own.
//!
//! `docs/morpc-protocol.md` says where each rule comes from in the kernel's source.

pub mod client;
pub mod error;
pub mod frame;
pub mod pb;
pub mod service;
pub mod transport;

pub use client::{
    Discovery, DrainState, HaKeeperClient, LockAllocatorClient, LogStoreClient, QueryClient,
};
pub use error::{ErrorKind, KernelError, RpcError};
pub use service::{HaKeeper, LockAllocator, QueryService, Service};
pub use transport::{Endpoint, Handler, Options, serve};
