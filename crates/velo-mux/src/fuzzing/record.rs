//! Recorded traffic for the fuzz corpora: a bench-shaped run (velo-bench's closed loop in
//! miniature: concurrent streams of engine-output items, default lanes, window and batching,
//! credit flowing back, a cancel and a stop) between a worker and a frontend mux, with every
//! byte that crosses each lane kept, write by write. `tests/fuzz_seeds.rs` turns it into seed
//! inputs for every target.

use std::time::{Duration, Instant};

use bytes::Bytes;
use velo_wire::{CancelCode, InstanceId, Token};

use crate::{LaneId, Mux, MuxConfig, Recv, Side, StreamKey};

/// Streams of the recorded run.
const STREAMS: u64 = 16;
/// Items per stream (the last rides on FINAL).
const ITEMS: u32 = 24;
/// Virtual time between engine passes: each pass sends one item per stream.
const PASS: Duration = Duration::from_millis(2);
/// The stream the frontend cancels, and after how many items.
const CANCELLED: (u64, u32) = (5, 6);
/// The stream the frontend stops (graceful), and after how many items.
const STOPPED: (u64, u32) = (9, 10);
/// Passes after which a run that has not finished is a bug in the recorder.
const MAX_PASSES: usize = 10_000;

/// What crossed the lanes of a recorded run.
#[derive(Debug, Clone, Default)]
pub struct Traffic {
    /// Per lane, each write the worker made (one `poll_transmit`), in order.
    pub worker_writes: Vec<Vec<Vec<u8>>>,
    /// Per lane, each write the frontend made, in order.
    pub frontend_writes: Vec<Vec<Vec<u8>>>,
    /// The prologue every stream opened with.
    pub prologue: Vec<u8>,
    /// The items of one stream, as the engine encoded them.
    pub items: Vec<Vec<u8>>,
}

/// Runs the recorded workload with the default configurations on both sides.
pub fn record_traffic(epoch: Instant) -> Traffic {
    let worker = MuxConfig::builder(Side::Worker).build().expect("defaults");
    let frontend = MuxConfig::builder(Side::Frontend)
        .build()
        .expect("defaults");
    let lanes = usize::from(worker.lanes());
    let mut w = Mux::new(worker, epoch);
    let mut f = Mux::new(frontend, epoch);
    for lane in (0..worker_lanes(&w)).map(LaneId) {
        let (wid, fid) = (InstanceId::from_u128(1), InstanceId::from_u128(2));
        let to_worker = f.config().hello(lane.0, fid, wid);
        let to_frontend = w.config().hello(lane.0, wid, fid);
        w.handle_lane_up(epoch, lane, &to_worker);
        f.handle_lane_up(epoch, lane, &to_frontend);
    }
    let mut traffic = Traffic {
        worker_writes: vec![Vec::new(); lanes],
        frontend_writes: vec![Vec::new(); lanes],
        prologue: br#"{"error":null}"#.to_vec(),
        items: (0..ITEMS).map(|i| engine_output(1, i)).collect(),
    };
    let mut run = Run {
        now: epoch,
        streams: Vec::new(),
        accepted: Vec::new(),
    };
    for ticket in 1..=STREAMS {
        let key = w
            .open(run.now, ticket, &Token([7; 16]), &traffic.prologue)
            .expect("the recorded run opens within the limits");
        run.streams.push((ticket, key, 0));
    }
    for _ in 0..MAX_PASSES {
        run.engine_pass(&mut w);
        run.exchange(&mut w, &mut f, &mut traffic);
        run.consume(&mut f);
        run.exchange(&mut w, &mut f, &mut traffic);
        if run.streams.is_empty() && w.is_flushed() && f.is_flushed() {
            return traffic;
        }
        run.now += PASS;
        w.handle_timeout(run.now);
        f.handle_timeout(run.now);
    }
    panic!("the recorded run did not finish within {MAX_PASSES} passes");
}

fn worker_lanes(w: &Mux) -> u16 {
    w.config().lanes()
}

/// The recorded run's state: the worker's streams (ticket, key, items sent) and the
/// frontend's (ticket, key, items read).
struct Run {
    now: Instant,
    streams: Vec<(u64, StreamKey, u32)>,
    accepted: Vec<(u64, StreamKey, u32)>,
}

impl Run {
    /// One engine pass: one item per live stream, the last one with FINAL.
    fn engine_pass(&mut self, w: &mut Mux) {
        let now = self.now;
        self.streams.retain_mut(|(ticket, key, sent)| {
            if w.send_end(*key).is_some() {
                w.release(now, *key);
                return false;
            }
            let item = engine_output(*ticket, *sent);
            let last = *sent + 1 == ITEMS || w.is_stop_requested(*key);
            let done = if last {
                w.finish(now, *key, Bytes::from(item)).is_ok()
            } else {
                w.send(now, *key, &item).is_ok()
            };
            *sent += u32::from(done);
            if last && done {
                w.release(now, *key);
                return false;
            }
            true
        });
        w.flush_hint(now);
    }

    /// Every lane's writers transmit everything; the bytes are delivered and recorded.
    fn exchange(&mut self, w: &mut Mux, f: &mut Mux, traffic: &mut Traffic) {
        let lanes = usize::from(worker_lanes(w));
        for i in 0..lanes {
            let lane = LaneId(u16::try_from(i).expect("at most 64 lanes"));
            carry(self.now, lane, w, f, &mut traffic.worker_writes[i]);
            carry(self.now, lane, f, w, &mut traffic.frontend_writes[i]);
        }
        while let Some(event) = f.poll_event() {
            if let crate::MuxEvent::Opened { stream, ticket, .. } = event {
                f.accept_stream(self.now, stream);
                self.accepted.push((ticket, stream, 0));
            }
        }
        while w.poll_event().is_some() {}
    }

    /// The frontend reads everything; one stream is cancelled and one stopped part-way.
    fn consume(&mut self, f: &mut Mux) {
        let now = self.now;
        self.accepted.retain_mut(|(ticket, key, read)| {
            while let Some(r) = f.recv(now, *key) {
                match r {
                    Recv::Item(_) => *read += 1,
                    Recv::End(_) => {
                        f.release(now, *key);
                        return false;
                    }
                }
            }
            if (*ticket, *read) == CANCELLED {
                f.cancel(now, *key, CancelCode::CANCELLED);
            }
            if (*ticket, *read) == STOPPED {
                f.stop(now, *key);
            }
            true
        });
    }
}

/// Moves what `from` transmits on `lane` into `to`, keeping each write.
fn carry(now: Instant, lane: LaneId, from: &mut Mux, to: &mut Mux, writes: &mut Vec<Vec<u8>>) {
    let mut chunks = Vec::new();
    let mut rx = bytes::BytesMut::new();
    while from.poll_transmit(now, lane, &mut chunks).is_some() {
        from.handle_transmitted(now, lane);
        let write: Vec<u8> = chunks.drain(..).flat_map(|c| c.to_vec()).collect();
        rx.extend_from_slice(&write);
        writes.push(write);
    }
    if !rx.is_empty() {
        to.handle_input(now, lane, &mut rx)
            .expect("recorded traffic is valid");
    }
}

/// Item `index` of stream `ticket`: velo-bench's engine output (`token_ids`, `text`,
/// `cum_log_probs`, `finish_reason`, `index`) in MessagePack with field names, 50-150 bytes.
pub fn engine_output(ticket: u64, index: u32) -> Vec<u8> {
    const TEXTS: [&str; 4] = [" the", " response", " plane", " streams tokens quickly"];
    let id = u32::try_from((ticket.wrapping_mul(2_654_435_761) ^ u64::from(index)) % 151_936)
        .unwrap_or(0);
    let mut out = vec![0x85];
    str_field(&mut out, "token_ids");
    out.extend_from_slice(&[0x91, 0xce]);
    out.extend_from_slice(&id.to_be_bytes());
    str_field(&mut out, "text");
    str_field(
        &mut out,
        TEXTS[usize::try_from(id).unwrap_or(0) % TEXTS.len()],
    );
    str_field(&mut out, "cum_log_probs");
    out.push(0xcb);
    out.extend_from_slice(&(-0.25 * f64::from(index)).to_be_bytes());
    str_field(&mut out, "finish_reason");
    if index + 1 == ITEMS {
        str_field(&mut out, "length");
    } else {
        out.push(0xc0);
    }
    str_field(&mut out, "index");
    out.push(0xce);
    out.extend_from_slice(&index.to_be_bytes());
    out
}

/// A MessagePack fixstr (under 32 bytes).
fn str_field(out: &mut Vec<u8>, s: &str) {
    let len = u8::try_from(s.len()).expect("short field names and texts");
    out.push(0xa0 | len);
    out.extend_from_slice(s.as_bytes());
}
