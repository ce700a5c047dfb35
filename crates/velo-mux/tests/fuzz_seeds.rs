//! Writes the recorded-traffic seeds of every fuzz target's corpus (`fuzz/corpus/*/traffic-*`)
//! from [`velo_mux::fuzzing::record_traffic`]: the bytes that crossed the lanes of a
//! bench-shaped run, cut to a few KiB each and put in each target's input format.
//!
//! Regenerate after a wire format change:
//! `cargo test -p velo-mux --test fuzz_seeds -- --ignored`.

use std::path::{Path, PathBuf};

use velo_mux::fuzzing::{Traffic, record_traffic};

/// Bytes of recorded lane traffic per seed: enough for many frames, small to commit.
const SEED_BYTES: usize = 3 * 1024;

/// The `handshake` target's frontend instance id (`velo_session::fuzzing::FRONTEND_ID`): the
/// recorded workers' HELLOs name it, so the seeds are answered.
const FRONTEND_ID: u128 = 0xfedc_ba98_7654_3210_8899_aabb_ccdd_eeff;

/// The largest injected frame body of the `mux` target's operations.
const MAX_INJECT: usize = 255;

#[test]
#[ignore = "writes fuzz/corpus/*/traffic-*; run with --ignored after a wire format change"]
fn record_bench_traffic_into_the_fuzz_corpora() {
    #[allow(clippy::disallowed_methods)] // the epoch of the run's virtual clock
    let traffic = record_traffic(std::time::Instant::now());
    let lanes = traffic.worker_writes.len();
    for lane in 0..lanes {
        let to_frontend = take_writes(&traffic.worker_writes[lane], SEED_BYTES).concat();
        write(
            "decode",
            &format!("traffic-lane{lane}-to-frontend.bin"),
            &to_frontend,
        );
    }
    let to_worker = take_writes(&traffic.frontend_writes[0], SEED_BYTES).concat();
    write("decode", "traffic-lane0-to-worker.bin", &to_worker);
    handshake_seeds(&traffic);
    ucx_seeds(&traffic);
    response_plane_seeds(&traffic);
    mux_seeds(&traffic);
}

/// Whole writes from the front of `writes`, up to about `max` bytes (at least one).
fn take_writes(writes: &[Vec<u8>], max: usize) -> Vec<Vec<u8>> {
    let mut total = 0;
    let mut out = Vec::new();
    for w in writes {
        if total + w.len() > max && !out.is_empty() {
            break;
        }
        total += w.len();
        out.push(w.clone());
    }
    out
}

/// A worker's HELLO on `lane` of `lanes` (the golden vector's fields otherwise).
fn hello(lane: u16, lanes: u16) -> Vec<u8> {
    let worker = velo_wire::InstanceId::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
    let config = velo_mux::MuxConfig::builder(velo_mux::Side::Worker)
        .lanes(lanes)
        .build()
        .expect("defaults");
    let frontend = velo_wire::InstanceId::from_u128(FRONTEND_ID);
    let mut out = Vec::new();
    velo_wire::Frame::Hello(config.hello(lane, worker, frontend)).encode(&mut out);
    out
}

/// `handshake`: every lane of the recorded worker as a connection (HELLO, then its batches),
/// once in whole reads and once in 7-byte reads.
fn handshake_seeds(traffic: &Traffic) {
    let lanes = u16::try_from(traffic.worker_writes.len()).expect("at most 64 lanes");
    for (name, read_size) in [
        ("traffic-4-lanes.bin", 255u8),
        ("traffic-4-lanes-7-byte-reads.bin", 7),
    ] {
        let mut input = Vec::new();
        for lane in 0..lanes {
            let mut bytes = hello(lane, lanes);
            bytes.extend(
                take_writes(&traffic.worker_writes[usize::from(lane)], SEED_BYTES / 4).concat(),
            );
            input.push(read_size);
            input.extend_from_slice(&u16::try_from(bytes.len()).expect("small").to_le_bytes());
            input.extend_from_slice(&bytes);
        }
        write("handshake", name, &input);
    }
}

/// `ucx_message`: lane 0's writes as eager messages in order, then the fin.
fn ucx_seeds(traffic: &Traffic) {
    let mut input = vec![2, 0]; // the 4 MiB limit; no split check
    for w in take_writes(&traffic.worker_writes[0], SEED_BYTES) {
        input.extend_from_slice(&[1, 0x30]);
        input.extend_from_slice(&u16::try_from(w.len()).expect("small").to_le_bytes());
        input.extend_from_slice(&w);
    }
    input.extend_from_slice(&[1, 0x33, 0, 0]);
    write("ucx_message", "traffic-lane0-messages.bin", &input);
}

/// `prologue` and `classic_reader`: the run's prologue and items, alone and as one classic
/// connection.
fn response_plane_seeds(traffic: &Traffic) {
    let mut prologue = vec![0];
    prologue.extend_from_slice(&traffic.prologue);
    write("prologue", "traffic-prologue.bin", &prologue);
    let last = traffic.items.len() - 1;
    for (name, item) in [("first", &traffic.items[0]), ("last", &traffic.items[last])] {
        let mut input = vec![1];
        input.extend_from_slice(item);
        write("prologue", &format!("traffic-item-{name}.bin"), &input);
    }
    let mut input = vec![2, 255];
    let handshake = br#"{"stream":1,"token":"07070707070707070707070707070707"}"#;
    classic(&mut input, 0x01, handshake);
    classic(&mut input, 0x02, &traffic.prologue);
    for item in &traffic.items {
        classic(&mut input, 0x03, item);
    }
    classic(&mut input, 0x04, b"");
    write("classic_reader", "traffic-stream.bin", &input);
}

/// A classic message: `u32` LE length of kind and payload, kind, payload.
fn classic(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    let len = u32::try_from(payload.len() + 1).expect("small");
    out.extend_from_slice(&len.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
}

/// `mux`: recorded batch bodies that fit one injection, injected into the frontend after a
/// stream is open.
fn mux_seeds(traffic: &Traffic) {
    let mut input = vec![0x00, 0, 1, 16]; // default-ish config; open; pump
    let bytes = traffic.worker_writes[0].concat();
    let mut rest = &bytes[..];
    let mut frames = 0;
    while let [_, a, b, c, d, tail @ ..] = rest {
        let len = usize::try_from(u32::from_le_bytes([*a, *b, *c, *d])).expect("u32 fits");
        let Some((body, next)) = tail.split_at_checked(len) else {
            break;
        };
        if body.len() <= MAX_INJECT && frames < 8 {
            input.extend_from_slice(&[21, 1, 0, u8::try_from(body.len()).expect("checked")]);
            input.extend_from_slice(body);
            frames += 1;
        }
        rest = next;
    }
    input.push(23);
    write("mux", "traffic-injected-batches.bin", &input);
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    std::fs::create_dir_all(&dir).expect("corpus directory");
    std::fs::write(dir.join(name), bytes).expect("corpus file");
    println!("{target}/{name}: {} bytes", bytes.len());
}
