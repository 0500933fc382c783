//! MatrixOne's RPC transport ("morpc"), as the kernel's `pkg/common/morpc` codec writes and
//! reads it: one length-prefixed frame per message, a flag byte, an xxHash64 checksum, the
//! deadline and trace headers, and a protobuf body whose field 1 is the request id.
//!
//! This crate holds the framing (no I/O): [`frame::encode`] and [`frame::decode`]. Decoding is
//! total: malformed, truncated or oversized input is a typed error, never a panic, and nothing is
//! allocated beyond the bytes given (an announced length is checked against the limit before
//! any wait for more input).

pub mod frame;
