//! The morpc frame (big-endian throughout):
//!
//! ```text
//! u32 total      bytes after this field (payload included)
//! u8  flags      0x01 payload | 0x02 checksum | 0x04 custom headers | 0x08 LZ4 | 0x10 stream
//!                | 0x20 ping | 0x40 pong
//! u64 checksum   if 0x02: xxHash64 (seed 0) of body ‖ payload as sent
//! u32 payload    if 0x01: payload length
//! headers        if 0x04: i64 remaining timeout (ns), then u8 n + n bytes of trace context
//! u32 sequence   if 0x10
//! body           protobuf (field 1 = request id); for ping/pong 8 raw bytes, the id
//! payload        raw bytes
//! ```

use xxhash_rust::xxh64::xxh64;

pub const FLAG_PAYLOAD: u8 = 0x01;
pub const FLAG_CHECKSUM: u8 = 0x02;
pub const FLAG_CUSTOM_HEADERS: u8 = 0x04;
pub const FLAG_COMPRESSED: u8 = 0x08;
pub const FLAG_STREAM: u8 = 0x10;
pub const FLAG_PING: u8 = 0x20;
pub const FLAG_PONG: u8 = 0x40;
const KNOWN_FLAGS: u8 = 0x7f;

/// The kernel's default largest message body (100 MiB), plus its header allowance (10 MiB).
pub const DEFAULT_MAX_BODY: usize = 100 << 20;
const HEADER_ALLOWANCE: usize = 10 << 20;
/// Flags, checksum, payload size, deadline, trace context and stream sequence take a few dozen
/// bytes.
const SMALL_HEADER_ALLOWANCE: usize = 64 << 10;
/// The trace context the kernel writes: 16-byte trace id + 8-byte span id.
pub const TRACE_CONTEXT_LEN: usize = 24;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame length {0} is not positive")]
    BadLength(i64),
    #[error("frame of {size} bytes exceeds the limit of {limit}")]
    TooBig { size: usize, limit: usize },
    #[error("frame ends after {have} of the {need} bytes its headers need")]
    Truncated { need: usize, have: usize },
    #[error("unknown flag bits {0:#04x}")]
    UnknownFlags(u8),
    #[error("payload of {payload} bytes does not fit in the {room} bytes left in the frame")]
    BadPayloadLength { payload: usize, room: usize },
    #[error("trace context of {0} bytes (the kernel reads at least {TRACE_CONTEXT_LEN})")]
    BadTraceLength(usize),
    #[error("checksum mismatch: frame says {expected:#018x}, content hashes to {actual:#018x}")]
    ChecksumMismatch { expected: u64, actual: u64 },
    #[error("compressed content does not decompress within {limit} bytes: {detail}")]
    Decompress { limit: usize, detail: String },
    #[error("negative timeout header ({0} ns)")]
    NegativeTimeout(i64),
}

/// One message on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frame {
    /// Flag bits as sent; [`encode`] derives 0x01/0x02/0x04/0x10 from the fields below and
    /// takes 0x08 (compress), 0x20 and 0x40 from here. Decoded bodies are decompressed.
    pub flags: u8,
    /// Remaining time the receiver has to answer, in nanoseconds (the deadline header).
    pub timeout_ns: Option<i64>,
    /// Trace context bytes (the kernel sends 24, all zero without a span).
    pub trace: Vec<u8>,
    pub stream_sequence: Option<u32>,
    pub body: Vec<u8>,
    /// Present for message types that carry one (logservice), even when empty.
    pub payload: Option<Vec<u8>>,
    /// Write (and, when present in input, verify) the xxHash64 checksum.
    pub checksum: bool,
}

impl Frame {
    /// A request or response frame the way the Go codec sends it: checksum on, both custom
    /// headers (a zero trace context), and an (empty) payload for payload-carrying types.
    pub fn message(body: Vec<u8>, timeout_ns: i64, with_payload: bool) -> Frame {
        Frame {
            flags: 0,
            timeout_ns: Some(timeout_ns),
            trace: vec![0; TRACE_CONTEXT_LEN],
            stream_sequence: None,
            body,
            payload: with_payload.then(Vec::new),
            checksum: true,
        }
    }

    /// An internal ping (or pong) carrying `id` as 8 raw bytes.
    pub fn ping(id: u64, pong: bool, timeout_ns: i64) -> Frame {
        Frame {
            flags: if pong { FLAG_PONG } else { FLAG_PING },
            ..Frame::message(id.to_be_bytes().to_vec(), timeout_ns, false)
        }
    }

    fn wire_flags(&self) -> u8 {
        let mut flags = self.flags & (FLAG_PING | FLAG_PONG | FLAG_COMPRESSED);
        if self.payload.is_some() {
            flags |= FLAG_PAYLOAD;
        }
        if self.checksum {
            flags |= FLAG_CHECKSUM;
        }
        if self.timeout_ns.is_some() {
            flags |= FLAG_CUSTOM_HEADERS;
        }
        if self.stream_sequence.is_some() {
            flags |= FLAG_STREAM;
        }
        flags
    }
}

fn checksum(body: &[u8], payload: &[u8]) -> u64 {
    // xxHash64 over body ‖ payload without concatenating: the streaming digest.
    let mut h = xxhash_rust::xxh64::Xxh64::new(0);
    h.update(body);
    h.update(payload);
    let digest = h.digest();
    debug_assert!(!payload.is_empty() || digest == xxh64(body, 0));
    digest
}

/// The bytes of `frame`, length prefix included.
pub fn encode(frame: &Frame) -> Vec<u8> {
    let flags = frame.wire_flags();
    let payload = frame.payload.as_deref().unwrap_or(&[]);
    if flags & FLAG_COMPRESSED != 0 {
        // Body and payload as separate LZ4 blocks, as the kernel's codec sends them.
        let compressed = Frame {
            flags: frame.flags & !FLAG_COMPRESSED,
            body: lz4_flex::block::compress(&frame.body),
            payload: frame.payload.as_ref().map(|p| lz4_flex::block::compress(p)),
            ..frame.clone()
        };
        let mut bytes = encode(&compressed);
        bytes[4] |= FLAG_COMPRESSED;
        return bytes;
    }
    let mut rest = Vec::with_capacity(64 + frame.body.len() + payload.len());
    rest.push(flags);
    if flags & FLAG_CHECKSUM != 0 {
        rest.extend_from_slice(&checksum(&frame.body, payload).to_be_bytes());
    }
    if flags & FLAG_PAYLOAD != 0 {
        rest.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    }
    if let Some(timeout) = frame.timeout_ns {
        rest.extend_from_slice(&timeout.to_be_bytes());
        rest.push(frame.trace.len() as u8);
        rest.extend_from_slice(&frame.trace);
    }
    if let Some(seq) = frame.stream_sequence {
        rest.extend_from_slice(&seq.to_be_bytes());
    }
    rest.extend_from_slice(&frame.body);
    rest.extend_from_slice(payload);
    let mut out = Vec::with_capacity(4 + rest.len());
    out.extend_from_slice(&(rest.len() as u32).to_be_bytes());
    out.extend_from_slice(&rest);
    out
}

/// Reads fixed-size fields off a slice, failing (never panicking) when it runs out.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or(FrameError::Truncated {
                need: self.at.saturating_add(n),
                have: self.data.len(),
            })?;
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, FrameError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
}

/// Decodes one frame from the start of `input`. `Ok(None)`: more bytes are needed (the
/// announced length is already known to be within `max_body`); `Ok(Some((frame, used)))`:
/// one frame and the number of bytes it took.
pub fn decode(input: &[u8], max_body: usize) -> Result<Option<(Frame, usize)>, FrameError> {
    if input.len() < 4 {
        return Ok(None);
    }
    let total = i32::from_be_bytes([input[0], input[1], input[2], input[3]]);
    if total <= 0 {
        return Err(FrameError::BadLength(total as i64));
    }
    let total = total as usize;
    // The kernel's own allowance for what precedes a body goes with its own limit; a tighter
    // limit (a client reading one service's answers) allows what real headers take.
    let allowance = if max_body >= DEFAULT_MAX_BODY {
        HEADER_ALLOWANCE
    } else {
        SMALL_HEADER_ALLOWANCE
    };
    let limit = max_body.saturating_add(allowance);
    if total > limit {
        return Err(FrameError::TooBig { size: total, limit });
    }
    if input.len() - 4 < total {
        return Ok(None);
    }
    let frame = decode_content_within(&input[4..4 + total], max_body)?;
    Ok(Some((frame, 4 + total)))
}

/// Decodes what follows the length prefix (exactly one frame's bytes), with the kernel's
/// default body limit for decompressed content.
pub fn decode_content(data: &[u8]) -> Result<Frame, FrameError> {
    decode_content_within(data, DEFAULT_MAX_BODY)
}

/// LZ4 block decompression (the kernel's `pierrec/lz4` blocks carry no size): like the
/// kernel's decoder, try a buffer and double it, never beyond `limit`.
fn decompress(data: &[u8], limit: usize) -> Result<Vec<u8>, FrameError> {
    if data.is_empty() {
        return Ok(Vec::new());
    }
    let mut size = data.len().saturating_mul(4).clamp(64, limit.max(64));
    loop {
        let mut out = vec![0u8; size];
        match lz4_flex::block::decompress_into(data, &mut out) {
            Ok(n) => {
                out.truncate(n);
                return Ok(out);
            }
            Err(lz4_flex::block::DecompressError::OutputTooSmall { .. }) if size < limit => {
                size = size.saturating_mul(2).min(limit);
            }
            Err(e) => {
                return Err(FrameError::Decompress {
                    limit,
                    detail: e.to_string(),
                });
            }
        }
    }
}

fn decode_content_within(data: &[u8], max_body: usize) -> Result<Frame, FrameError> {
    let mut r = Reader { data, at: 0 };
    let flags = r.u8()?;
    if flags & !KNOWN_FLAGS != 0 {
        return Err(FrameError::UnknownFlags(flags & !KNOWN_FLAGS));
    }
    let expected = if flags & FLAG_CHECKSUM != 0 {
        Some(r.u64()?)
    } else {
        None
    };
    let payload_len = if flags & FLAG_PAYLOAD != 0 {
        Some(r.u32()? as usize)
    } else {
        None
    };
    let (timeout_ns, trace) = if flags & FLAG_CUSTOM_HEADERS != 0 {
        let timeout = r.u64()? as i64;
        if timeout < 0 {
            return Err(FrameError::NegativeTimeout(timeout));
        }
        let n = r.u8()? as usize;
        if n != 0 && n < TRACE_CONTEXT_LEN {
            return Err(FrameError::BadTraceLength(n));
        }
        (Some(timeout), r.take(n)?.to_vec())
    } else {
        (None, Vec::new())
    };
    let stream_sequence = if flags & FLAG_STREAM != 0 {
        Some(r.u32()?)
    } else {
        None
    };
    let rest = &data[r.at..];
    let payload_size = payload_len.unwrap_or(0);
    if payload_size > rest.len() {
        return Err(FrameError::BadPayloadLength {
            payload: payload_size,
            room: rest.len(),
        });
    }
    let (body, payload) = rest.split_at(rest.len() - payload_size);
    if let Some(expected) = expected {
        let actual = checksum(body, payload);
        if actual != expected {
            return Err(FrameError::ChecksumMismatch { expected, actual });
        }
    }
    // The checksum covers the bytes as sent; body and payload are compressed separately.
    let (body, payload) = if flags & FLAG_COMPRESSED != 0 {
        (decompress(body, max_body)?, decompress(payload, max_body)?)
    } else {
        (body.to_vec(), payload.to_vec())
    };
    Ok(Frame {
        flags,
        timeout_ns,
        trace,
        stream_sequence,
        body,
        payload: payload_len.map(|_| payload),
        checksum: expected.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A kernel with `[rpc] enable-compress` sends body and payload as separate LZ4 blocks;
    /// the checksum covers them compressed.
    #[test]
    fn compressed_frames_decode_to_their_content() {
        let body: Vec<u8> = b"answer ".iter().copied().cycle().take(3000).collect();
        let payload = vec![1u8; 500];
        let (zbody, zpayload) = (
            lz4_flex::block::compress(&body),
            lz4_flex::block::compress(&payload),
        );
        let mut rest = vec![FLAG_COMPRESSED | FLAG_CHECKSUM | FLAG_PAYLOAD];
        rest.extend_from_slice(&checksum(&zbody, &zpayload).to_be_bytes());
        rest.extend_from_slice(&(zpayload.len() as u32).to_be_bytes());
        rest.extend_from_slice(&zbody);
        rest.extend_from_slice(&zpayload);
        let mut bytes = (rest.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(&rest);
        let (frame, used) = decode(&bytes, DEFAULT_MAX_BODY).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(frame.body, body);
        assert_eq!(frame.payload, Some(payload.clone()));
        // Our encoder writes the same layout.
        let ours = encode(&Frame {
            flags: FLAG_COMPRESSED,
            timeout_ns: None,
            trace: vec![],
            stream_sequence: None,
            body: body.clone(),
            payload: Some(payload),
            checksum: true,
        });
        assert_eq!(ours, bytes);
    }

    fn hex(text: &str) -> Vec<u8> {
        text.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).expect("hex"))
            .collect()
    }

    /// A logservice CHECK_HAKEEPER request (id 1, 10 s) as the kernel's codec frames it
    /// (layout from `pkg/common/morpc/codec.go`; body from the gogoproto encoding).
    #[test]
    fn a_check_hakeeper_request_frames_as_the_kernel_does() {
        let body = hex("08 01 10 0a 1a 0d 3a 0b 08 80 92 b8 c3 98 fe ff ff ff 01");
        let frame = Frame::message(body.clone(), 10_000_000_000, true);
        let bytes = encode(&frame);
        let mut expected =
            hex("00 00 00 41 07 b0 9a 7c 87 6c f2 4f 6a 00 00 00 00 00 00 00 02 54 0b e4 00 18");
        expected.extend_from_slice(&[0; 24]);
        expected.extend_from_slice(&body);
        assert_eq!(bytes, expected);
        let (decoded, used) = decode(&bytes, DEFAULT_MAX_BODY).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(decoded.body, body);
        assert_eq!(decoded.payload, Some(vec![]));
        assert_eq!(decoded.timeout_ns, Some(10_000_000_000));
        assert_eq!(decoded.flags, 0x07);
    }

    #[test]
    fn a_query_request_has_no_payload_flag() {
        let body = hex(
            "08 01 10 18 da 01 00 ea 01 00 f2 01 00 fa 01 00 82 02 00 8a 02 00 92 02 00 a2 02 00 c2 02 00 ca 02 00",
        );
        let bytes = encode(&Frame::message(body, 10_000_000_000, false));
        assert_eq!(
            &bytes[..13],
            &hex("00 00 00 4c 06 e1 7b dc 63 8f 88 ec 5c")[..]
        );
    }

    #[test]
    fn malformed_frames_are_typed_errors() {
        let good = encode(&Frame::message(vec![8, 1], 1_000, true));
        assert_eq!(decode(&good[..3], 100), Ok(None));
        assert_eq!(decode(&good[..good.len() - 1], 100), Ok(None));
        assert_eq!(decode(&[0, 0, 0, 0], 100), Err(FrameError::BadLength(0)));
        assert_eq!(
            decode(&[0x80, 0, 0, 0], 100),
            Err(FrameError::BadLength(i32::MIN as i64))
        );
        // An announced 2 GiB frame is refused before any byte of it is awaited.
        assert!(matches!(
            decode(&[0x7f, 0xff, 0xff, 0xff], DEFAULT_MAX_BODY),
            Err(FrameError::TooBig { .. })
        ));
        let mut corrupt = good.clone();
        *corrupt.last_mut().unwrap() ^= 1;
        assert!(matches!(
            decode(&corrupt, 100),
            Err(FrameError::ChecksumMismatch { .. })
        ));
        // Compressed content that is not LZ4, or that would exceed the limit.
        assert!(matches!(
            decode(&[0, 0, 0, 3, 0x08, 0xf0, 0x01], 100),
            Err(FrameError::Decompress { .. })
        ));
        let bomb = lz4_flex::block::compress(&[7u8; 4096]);
        let mut frame = vec![0x08];
        frame.extend_from_slice(&bomb);
        let mut bytes = (frame.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(&frame);
        assert!(matches!(
            decode(&bytes, 1000),
            Err(FrameError::Decompress { limit: 1000, .. })
        ));
        assert_eq!(
            decode(&[0, 0, 0, 1, 0x80], 100),
            Err(FrameError::UnknownFlags(0x80))
        );
        // Payload longer than the frame.
        assert!(matches!(
            decode(&[0, 0, 0, 5, 0x01, 0, 0, 0, 9], 100),
            Err(FrameError::BadPayloadLength {
                payload: 9,
                room: 0
            })
        ));
        // Headers cut short inside the frame.
        assert!(matches!(
            decode(&[0, 0, 0, 3, 0x04, 0, 0], 100),
            Err(FrameError::Truncated { .. })
        ));
    }

    proptest! {
        #[test]
        fn frames_round_trip(
            body in proptest::collection::vec(any::<u8>(), 0..200),
            payload in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..50)),
            timeout in proptest::option::of(0i64..i64::MAX),
            seq in proptest::option::of(any::<u32>()),
            checksum in any::<bool>(),
        ) {
            let frame = Frame {
                flags: 0,
                timeout_ns: timeout,
                trace: if timeout.is_some() { vec![7; TRACE_CONTEXT_LEN] } else { vec![] },
                stream_sequence: seq,
                body,
                payload,
                checksum,
            };
            let bytes = encode(&frame);
            let (decoded, used) = decode(&bytes, DEFAULT_MAX_BODY).unwrap().unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(Frame { flags: 0, ..decoded }, frame);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes, 1 << 16);
            let _ = decode_content(&bytes);
        }
    }
}
