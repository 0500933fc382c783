//! Mutation fuzzing of the frame decoder on stable Rust (no coverage guidance): random bytes,
//! and valid frames with bits flipped, bytes replaced, cut short, length fields rewritten and
//! pieces spliced together. Every input must decode to a frame or a typed error — never a
//! panic, never more bytes kept than were given — and every decoded frame must survive
//! re-encoding. Seeded and reproducible; prints the executions count.
//!
//! `cargo run --release -p mo-rpc --example fuzz_frames -- [seconds] [seed]`

use mo_rpc::frame::{DEFAULT_MAX_BODY, Frame, TRACE_CONTEXT_LEN, decode, decode_content, encode};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::{Duration, Instant};

fn valid_frame(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let len = rng.random_range(0..64);
    let body: Vec<u8> = (0..len).map(|_| rng.random()).collect();
    let payload = rng.random_bool(0.5).then(|| {
        let n = rng.random_range(0..16);
        (0..n).map(|_| rng.random()).collect()
    });
    let timeout = rng.random_bool(0.8).then(|| rng.random_range(0..i64::MAX));
    encode(&Frame {
        flags: if rng.random_bool(0.1) { 0x20 } else { 0 },
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
        match rng.random_range(0..6) {
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
            _ => {
                let n = rng.random_range(0..8);
                bytes.extend((0..n).map(|_| rng.random::<u8>()));
            }
        }
    }
    bytes
}

fn check(input: &[u8]) {
    if let Ok(Some((frame, used))) = decode(input, 1 << 20) {
        assert!(used <= input.len());
        let kept =
            frame.body.len() + frame.trace.len() + frame.payload.as_ref().map_or(0, Vec::len);
        assert!(kept <= used, "kept {kept} bytes of {used}");
        let again = encode(&frame);
        let (back, _) = decode(&again, DEFAULT_MAX_BODY)
            .expect("a decoded frame re-encodes")
            .expect("complete");
        assert_eq!(back.body, frame.body);
        assert_eq!(back.payload, frame.payload);
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
    let mut execs: u64 = 0;
    let mut last_report = Instant::now();
    while Instant::now() < deadline {
        for _ in 0..1000 {
            let input = if rng.random_bool(0.2) {
                let n = rng.random_range(0..64);
                (0..n).map(|_| rng.random()).collect()
            } else {
                let a = valid_frame(&mut rng);
                let b = valid_frame(&mut rng);
                mutate(&mut rng, a, &b)
            };
            check(&input);
            execs += 1;
        }
        if last_report.elapsed() >= Duration::from_secs(60) {
            eprintln!("{:>5} s: {execs} executions", started.elapsed().as_secs());
            last_report = Instant::now();
        }
    }
    println!(
        "fuzz_frames: {execs} executions in {:.1} s (seed {seed}), no finding",
        started.elapsed().as_secs_f64()
    );
}
