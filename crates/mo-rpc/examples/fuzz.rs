//! Mutation fuzzing of the frame and message decoders on stable Rust (no coverage guidance).
//!
//! Inputs: random bytes, and valid frames and messages (every request and response type the
//! clients and servers decode) with bits flipped, bytes replaced, cut short, length fields
//! rewritten and pieces spliced together. For each input:
//! - the frame decoder returns a frame or a typed error, never a panic, and keeps no more
//!   bytes than it was given; a decoded frame re-encodes to the same frame;
//! - each message decoder returns a message or an error, never a panic; a decoded message
//!   re-encodes and decodes to itself;
//! - the bytes allocated while decoding stay within a fixed multiple of the input's length
//!   (measured by a counting allocator: no input makes the decoder allocate out of proportion).
//!
//! Seeded and reproducible; prints the executions count and the worst allocation ratio.
//!
//! `cargo run --release -p mo-rpc --example fuzz -- [seconds] [seed]`

use mo_rpc::frame::{DEFAULT_MAX_BODY, Frame, TRACE_CONTEXT_LEN, decode, decode_content, encode};
use mo_rpc::pb::{lock, logservice, metadata, moerr, query, status};
use prost::Message;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Counts the bytes live and the peak since the last reset.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            let live = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size
                - layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allowed: this many bytes per input byte, plus a fixed allowance (first map nodes, vectors'
/// first capacity). Linear in the input: a frame's body limit bounds what a peer can cost us.
const BYTES_PER_INPUT_BYTE: usize = 1024;
const FIXED_ALLOWANCE: usize = 256 << 10;

fn text(rng: &mut ChaCha8Rng) -> String {
    let n = rng.random_range(0..12);
    (0..n)
        .map(|_| rng.random_range(b'a'..=b'z') as char)
        .collect()
}

fn shard(rng: &mut ChaCha8Rng) -> logservice::LogShardInfo {
    logservice::LogShardInfo {
        shard_id: rng.random_range(0..4),
        replicas: (0..rng.random_range(0..4))
            .map(|i| (i, text(rng)))
            .collect(),
        term: rng.random(),
        leader_id: rng.random_range(0..4),
        ..Default::default()
    }
}

/// A valid encoded message of a random type, with random contents.
fn valid_message(rng: &mut ChaCha8Rng) -> Vec<u8> {
    match rng.random_range(0..6) {
        0 => logservice::Request {
            request_id: rng.random(),
            method: rng.random_range(0..30),
            log_request: Some(logservice::LogRequest {
                shard_id: rng.random(),
                ts: rng.random_bool(0.5).then_some(prost_types::Timestamp {
                    seconds: -62_135_596_800,
                    nanos: 0,
                }),
                ..Default::default()
            }),
            cn_state_label: rng.random_bool(0.5).then(|| logservice::CnStateLabel {
                uuid: text(rng),
                state: rng.random_range(0..4),
                labels: BTreeMap::from([(
                    text(rng),
                    metadata::LabelList {
                        labels: vec![text(rng)],
                    },
                )]),
            }),
            delete_cn_store: rng.random_bool(0.3).then(|| logservice::DeleteCnStore {
                store_id: text(rng),
            }),
            ..Default::default()
        }
        .encode_to_vec(),
        1 => {
            let stores = (0..rng.random_range(0..4))
                .map(|_| {
                    (
                        text(rng),
                        logservice::CnStoreInfo {
                            tick: rng.random(),
                            query_address: text(rng),
                            work_state: rng.random_range(0..4),
                            up_time: rng.random(),
                            ..Default::default()
                        },
                    )
                })
                .collect();
            let log = logservice::LogStoreInfo {
                tick: rng.random(),
                replicas: vec![logservice::LogReplicaInfo {
                    log_shard_info: Some(shard(rng)),
                    replica_id: rng.random(),
                    ..Default::default()
                }],
                ..Default::default()
            };
            logservice::Response {
                request_id: rng.random(),
                error_code: rng.random_range(0..3) * 20101,
                error_message: text(rng),
                checker_state: Some(logservice::CheckerState {
                    tick: rng.random(),
                    cn_state: Some(logservice::CnState { stores }),
                    log_state: Some(logservice::LogState {
                        shards: BTreeMap::from([(1, shard(rng))]),
                        stores: BTreeMap::from([(text(rng), log)]),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec()
        }
        2 => lock::Request {
            request_id: rng.random(),
            method: rng.random_range(12..15),
            set_restart_service: Some(lock::SetRestartServiceRequest {
                service_id: text(rng),
            }),
            begin_drain: rng.random_bool(0.3).then(|| lock::BeginDrainRequest {
                service_id: text(rng),
                start_epoch: rng.random(),
            }),
            ..Default::default()
        }
        .encode_to_vec(),
        3 => lock::Response {
            request_id: rng.random(),
            error: if rng.random_bool(0.3) {
                moerr::Error {
                    code: 20105,
                    message: text(rng),
                    ..Default::default()
                }
                .encode_to_vec()
            } else {
                vec![]
            },
            remain_txn_in_service: Some(lock::RemainTxnInServiceResponse {
                remain_txn: rng.random(),
            }),
            list_drains: Some(lock::ListDrainsResponse {
                drains: (0..rng.random_range(0..3))
                    .map(|i| lock::DrainState {
                        drain_id: i,
                        status: rng.random_range(0..4),
                        remaining_txns: rng.random(),
                    })
                    .collect(),
            }),
            ..Default::default()
        }
        .encode_to_vec(),
        4 => query::Request {
            request_id: rng.random(),
            cmd_method: rng.random_range(0..25),
            show_process_list_request: Some(query::ShowProcessListRequest {
                tenant: text(rng),
                sys_tenant: rng.random(),
            }),
            get_pipeline_info_request: Some(query::GetPipelineInfoRequest {}),
            ..Default::default()
        }
        .encode_to_vec(),
        _ => query::Response {
            request_id: rng.random(),
            show_process_list_response: Some(query::ShowProcessListResponse {
                sessions: (0..rng.random_range(0..3))
                    .map(|i| status::Session {
                        conn_id: i,
                        account: text(rng),
                        session_start: Some(prost_types::Timestamp {
                            seconds: rng.random(),
                            nanos: rng.random_range(0..1_000_000_000),
                        }),
                        ..Default::default()
                    })
                    .collect(),
            }),
            get_replica_count: Some(query::GetReplicaCountResponse {
                count: rng.random(),
            }),
            ..Default::default()
        }
        .encode_to_vec(),
    }
}

fn valid_frame(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let body = if rng.random_bool(0.5) {
        valid_message(rng)
    } else {
        let len = rng.random_range(0..64);
        (0..len).map(|_| rng.random()).collect()
    };
    let payload = rng.random_bool(0.5).then(|| {
        let n = rng.random_range(0..16);
        (0..n).map(|_| rng.random()).collect()
    });
    let timeout = rng.random_bool(0.8).then(|| rng.random_range(0..i64::MAX));
    encode(&Frame {
        flags: if rng.random_bool(0.1) {
            0x20
        } else if rng.random_bool(0.2) {
            mo_rpc::frame::FLAG_COMPRESSED
        } else {
            0
        },
        timeout_ns: timeout,
        trace: if timeout.is_some() {
            vec![0; TRACE_CONTEXT_LEN]
        } else {
            vec![]
        },
        stream_sequence: rng.random_bool(0.2).then(|| rng.random()),
        body,
        payload,
        checksum: rng.random_bool(0.7),
    })
}

fn mutate(rng: &mut ChaCha8Rng, mut bytes: Vec<u8>, other: &[u8]) -> Vec<u8> {
    for _ in 0..rng.random_range(1..4) {
        match rng.random_range(0..7) {
            0 if !bytes.is_empty() => {
                let i = rng.random_range(0..bytes.len());
                bytes[i] ^= 1 << rng.random_range(0..8);
            }
            1 if !bytes.is_empty() => {
                let i = rng.random_range(0..bytes.len());
                bytes[i] = rng.random();
            }
            2 => {
                let n = rng.random_range(0..=bytes.len());
                bytes.truncate(n);
            }
            3 if bytes.len() >= 4 => {
                // Rewrite the length prefix (or a payload length) with an extreme value.
                let v: u32 = *[0, 1, u32::MAX, i32::MAX as u32, 0x8000_0000, rng.random()]
                    .get(rng.random_range(0..6))
                    .expect("in range");
                let at = if rng.random_bool(0.5) || bytes.len() < 17 {
                    0
                } else {
                    13
                };
                bytes[at..at + 4].copy_from_slice(&v.to_be_bytes());
            }
            4 => {
                let cut = rng.random_range(0..=other.len());
                bytes.extend_from_slice(&other[..cut]);
            }
            5 if !bytes.is_empty() => {
                // A protobuf length or varint blown up: 0xff… continuation bytes.
                let i = rng.random_range(0..bytes.len());
                let n = rng.random_range(1..11);
                for j in i..(i + n).min(bytes.len()) {
                    bytes[j] = 0xff;
                }
            }
            _ => {
                let n = rng.random_range(0..8);
                bytes.extend((0..n).map(|_| rng.random::<u8>()));
            }
        }
    }
    bytes
}

/// Decodes `bytes` as `M`; what decodes must re-encode to itself.
fn check_message<M: Message + Default + PartialEq>(bytes: &[u8]) {
    if let Ok(m) = M::decode(bytes) {
        let again = M::decode(m.encode_to_vec().as_slice()).expect("re-encoded message decodes");
        assert!(again == m, "a decoded message re-encodes to itself");
    }
}

fn check_messages(bytes: &[u8]) {
    check_message::<logservice::Request>(bytes);
    check_message::<logservice::Response>(bytes);
    check_message::<lock::Request>(bytes);
    check_message::<lock::Response>(bytes);
    check_message::<query::Request>(bytes);
    check_message::<query::Response>(bytes);
    check_message::<moerr::Error>(bytes);
}

fn check_frame(input: &[u8]) {
    if let Ok(Some((frame, used))) = decode(input, 1 << 20) {
        assert!(used <= input.len());
        // Plain content is at most what was given; decompressed content is bounded by the
        // allocation check in `main` instead.
        if frame.flags & mo_rpc::frame::FLAG_COMPRESSED == 0 {
            let kept =
                frame.body.len() + frame.trace.len() + frame.payload.as_ref().map_or(0, Vec::len);
            assert!(kept <= used, "kept {kept} bytes of {used}");
        }
        let again = encode(&frame);
        let (back, _) = decode(&again, DEFAULT_MAX_BODY)
            .expect("a decoded frame re-encodes")
            .expect("complete");
        assert_eq!(back.body, frame.body);
        assert_eq!(back.payload, frame.payload);
        assert_eq!(back.flags & 0x08, frame.flags & 0x08);
        check_messages(&frame.body);
    }
    let _ = decode_content(input);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(600);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let (mut frames, mut messages) = (0u64, 0u64);
    let mut worst_ratio = 0.0f64;
    let mut last_report = Instant::now();
    while Instant::now() < deadline {
        for _ in 0..1000 {
            let as_frame = rng.random_bool(0.5);
            let input = if rng.random_bool(0.15) {
                let n = rng.random_range(0..64);
                (0..n).map(|_| rng.random()).collect()
            } else if as_frame {
                let a = valid_frame(&mut rng);
                let b = valid_frame(&mut rng);
                mutate(&mut rng, a, &b)
            } else {
                let a = valid_message(&mut rng);
                let b = valid_message(&mut rng);
                mutate(&mut rng, a, &b)
            };
            let before = LIVE.load(Ordering::Relaxed);
            PEAK.store(before, Ordering::Relaxed);
            if as_frame {
                check_frame(&input);
                frames += 1;
            } else {
                check_messages(&input);
                messages += 1;
            }
            let grew = PEAK.load(Ordering::Relaxed).saturating_sub(before);
            let allowed = BYTES_PER_INPUT_BYTE * input.len() + FIXED_ALLOWANCE;
            assert!(
                grew <= allowed,
                "decoding {} bytes allocated {grew} bytes: {input:02x?}",
                input.len()
            );
            if input.len() >= 16 {
                worst_ratio = worst_ratio.max(grew as f64 / input.len() as f64);
            }
        }
        if last_report.elapsed() >= Duration::from_secs(60) {
            eprintln!(
                "{:>5} s: {} executions",
                started.elapsed().as_secs(),
                frames + messages
            );
            last_report = Instant::now();
        }
    }
    println!(
        "fuzz: {} executions ({frames} frame inputs, {messages} message inputs, every frame \
         body also decoded as each message type) in {:.1} s (seed {seed}), no finding; worst \
         allocation while decoding: {worst_ratio:.1} bytes per input byte (inputs of 16+ bytes)",
        frames + messages,
        started.elapsed().as_secs_f64()
    );
}
