//! Fuzz entry point of velo-ucx, shared by `fuzz/` (cargo-fuzz) and the corpus replay test
//! (`tests/fuzz_replay.rs`). Behind the private `__fuzz` feature; not an API. Needs no UCX:
//! it drives the pure parts a peer reaches, the AM header and the receive FIFO.
//!
//! [`ucx_messages`] is the `ucx_message` target. The input is a sequence of what a peer's
//! endpoint can make the driver see: active messages (a header, raw or well-formed with a
//! sequence number near the expected one, and an eager payload or a rendezvous announcement)
//! and rendezvous completions (for any message, with a payload of any length). A reference
//! model checks, after every step, that the bytes released are exactly the accepted payloads
//! in send order up to the first one still waiting, that the bytes held are what the model
//! holds, and that the lane's end comes once, after everything before it. It also checks
//! that the header parser accepts only what the encoder writes, and that the sender's split
//! keeps every byte, in order, in messages within the limit.

use bytes::{Bytes, BytesMut};

use crate::message::{self, HEADER_LEN, Header, Kind};
use crate::reorder::Reorder;

/// Per-message limits the fuzzer picks from: tiny, so oversized messages are easy to reach,
/// and the real one.
const LIMITS: [usize; 3] = [16, 300, message::MAX_MESSAGE_BYTES];

/// Longest payload or announcement the fuzzer makes, in bytes.
const MAX_FUZZ_LEN: usize = 1024;

/// Operations run per input at most.
const MAX_STEPS: usize = 512;

/// Runs the message sequence `data` encodes (its first byte picks the message limit).
///
/// # Panics
///
/// When the FIFO releases other bytes than the model, holds a different count, reports the
/// end at the wrong time, or the header parser or splitter breaks its contract.
pub fn ucx_messages(data: &[u8]) {
    let mut input = Input(data);
    let max = LIMITS[usize::from(input.u8()) % LIMITS.len()];
    check_split(&mut input, max);
    let mut lane = Lane {
        rx: Reorder::new(max),
        model: Model::default(),
        out: BytesMut::new(),
        max,
    };
    for _ in 0..MAX_STEPS {
        if input.0.is_empty() {
            break;
        }
        let ended = match input.u8() % 4 {
            0 => lane.raw_header(&mut input),
            1 | 2 => lane.message(&mut input),
            _ => lane.complete(&mut input),
        };
        lane.check();
        if ended {
            break;
        }
    }
}

/// The receive side of one lane, as the driver runs it, with its model.
struct Lane {
    rx: Reorder,
    model: Model,
    out: BytesMut,
    max: usize,
}

/// What the FIFO should have done: every accepted message in order, with its payload once
/// it is known.
#[derive(Default)]
struct Model {
    messages: Vec<(Kind, Slot)>,
    failed: bool,
    ended: bool,
}

/// A message's payload in the model.
enum Slot {
    Known(Bytes),
    /// A rendezvous payload of this announced length is on its way.
    Waiting(usize),
}

impl Lane {
    /// Arbitrary header bytes: parsed as the driver parses them. Returns whether the lane is
    /// over (a foreign header fails it).
    fn raw_header(&mut self, input: &mut Input<'_>) -> bool {
        let len = usize::from(input.u8()) % (2 * HEADER_LEN);
        let header = input.take(len);
        let Some(h) = Header::decode(header) else {
            return true;
        };
        assert_eq!(
            h.encode(),
            header,
            "a parsed header re-encodes to its bytes"
        );
        let payload = input.payload(MAX_FUZZ_LEN);
        self.receive(h, Body::Eager(payload))
    }

    /// A well-formed header whose number is the expected one or near it, with an eager
    /// payload or a rendezvous announcement. Returns whether the lane is over.
    fn message(&mut self, input: &mut Input<'_>) -> bool {
        let selector = input.u8();
        let expected = u64::try_from(self.model.messages.len()).unwrap_or(u64::MAX);
        let seq = match selector >> 4 {
            0 => expected.wrapping_sub(1),
            1 => expected + 1,
            2 => u64::MAX,
            _ => expected,
        };
        let kind = if selector & 1 == 1 && selector & 2 == 2 {
            Kind::Fin
        } else {
            Kind::Data
        };
        let body = if selector & 4 == 0 {
            Body::Eager(input.payload(MAX_FUZZ_LEN))
        } else {
            Body::Rndv(usize::from(input.u16()) % (2 * MAX_FUZZ_LEN))
        };
        self.receive(Header { seq, kind }, body)
    }

    /// Feeds one message to the FIFO and the model alike. Returns whether the lane is over.
    fn receive(&mut self, h: Header, body: Body) -> bool {
        let expected = u64::try_from(self.model.messages.len()).unwrap_or(u64::MAX);
        let result = match (h.kind, &body) {
            (Kind::Fin, _) => self.rx.on_fin(h.seq),
            (Kind::Data, Body::Eager(b)) => self.rx.on_eager(h.seq, b, &mut self.out),
            (Kind::Data, Body::Rndv(len)) => self.rx.on_rndv(h.seq, *len).map(|()| false),
        };
        let len = match &body {
            Body::Eager(b) if h.kind == Kind::Data => b.len(),
            Body::Rndv(len) if h.kind == Kind::Data => *len,
            _ => 0,
        };
        let valid = !self.model.fin_arrived() && h.seq == expected && len <= self.max;
        assert_eq!(valid, result.is_ok(), "{h:?} ({len} bytes): {result:?}");
        let Ok(ended) = result else {
            self.model.failed = true;
            return true;
        };
        let payload = match body {
            _ if h.kind == Kind::Fin => Slot::Known(Bytes::new()),
            Body::Eager(b) => Slot::Known(b),
            Body::Rndv(len) => Slot::Waiting(len),
        };
        self.model.messages.push((h.kind, payload));
        self.settled(ended)
    }

    /// A rendezvous completion for message `seq` (any number; usually a waiting one) with a
    /// payload of any length. Returns whether the lane is over.
    fn complete(&mut self, input: &mut Input<'_>) -> bool {
        let pick = usize::from(input.u8());
        let waiting: Vec<usize> = self.model.waiting();
        let seq = match waiting.get(pick % waiting.len().max(1)) {
            Some(&i) if pick < 0xf0 => i,
            _ => usize::from(input.u8()),
        };
        let payload = input.payload(MAX_FUZZ_LEN);
        let seq64 = u64::try_from(seq).unwrap_or(u64::MAX);
        let result = self.rx.on_complete(seq64, payload.clone(), &mut self.out);
        assert_eq!(
            waiting.contains(&seq),
            result.is_ok(),
            "completion of {seq}: {result:?}"
        );
        let Ok(ended) = result else {
            self.model.failed = true;
            return true;
        };
        self.model.messages[seq].1 = Slot::Known(payload);
        self.settled(ended)
    }

    /// The FIFO said whether the lane's end was reached: the model must agree.
    fn settled(&mut self, ended: bool) -> bool {
        assert_eq!(
            ended,
            self.model.end_reached(),
            "the end was reported wrongly"
        );
        assert!(!self.model.ended, "the end was reported twice");
        self.model.ended = ended;
        ended
    }

    /// Released bytes, held bytes and waiting messages agree with the model.
    fn check(&self) {
        if self.model.failed {
            return;
        }
        let (released, held, waiting) = self.model.expected();
        assert!(
            self.out[..] == released[..],
            "released bytes differ from the model"
        );
        assert_eq!(
            self.rx.queued_bytes(),
            held,
            "held bytes differ from the model"
        );
        assert_eq!(
            self.rx.waiting(),
            waiting,
            "waiting messages differ from the model"
        );
    }
}

impl Model {
    fn fin_arrived(&self) -> bool {
        self.messages.iter().any(|(k, _)| *k == Kind::Fin)
    }

    fn waiting(&self) -> Vec<usize> {
        (0..self.messages.len())
            .filter(|&i| matches!(self.messages[i].1, Slot::Waiting(_)))
            .collect()
    }

    /// Whether everything up to and including the fin has its payload.
    fn end_reached(&self) -> bool {
        let mut all_known = true;
        for (kind, slot) in &self.messages {
            all_known &= matches!(slot, Slot::Known(_));
            if *kind == Kind::Fin {
                return all_known;
            }
        }
        false
    }

    /// Bytes released (payloads before the first waiting message), bytes held behind it
    /// (payloads, and the announced length of waiting ones), and waiting messages.
    fn expected(&self) -> (Vec<u8>, usize, usize) {
        let mut released = Vec::new();
        let (mut blocked, mut held, mut waiting) = (false, 0, 0);
        for (_, slot) in &self.messages {
            match slot {
                Slot::Known(p) if !blocked => released.extend_from_slice(p),
                Slot::Known(p) => held += p.len(),
                Slot::Waiting(len) => {
                    blocked = true;
                    held += len;
                    waiting += 1;
                }
            }
        }
        (released, held, waiting)
    }
}

/// What follows a header.
enum Body {
    Eager(Bytes),
    /// A rendezvous announcement of this many bytes.
    Rndv(usize),
}

/// The sender's split of one write: every byte kept, in order, in messages within `max`.
fn check_split(input: &mut Input<'_>, max: usize) {
    let chunks = usize::from(input.u8() % 8);
    let mut write: Vec<Bytes> = (0..chunks).map(|_| input.payload(MAX_FUZZ_LEN)).collect();
    let all: Vec<u8> = write.iter().flat_map(|c| c.to_vec()).collect();
    let mut messages = Vec::new();
    message::split(&mut write, max, &mut messages);
    assert!(write.is_empty(), "split leaves the write empty");
    for m in &messages {
        let len: usize = m.iter().map(Bytes::len).sum();
        assert!(
            len > 0 && len <= max,
            "a message of {len} bytes, limit {max}"
        );
    }
    let joined: Vec<u8> = messages.iter().flatten().flat_map(|c| c.to_vec()).collect();
    assert!(joined == all, "split lost or reordered bytes");
}

/// The fuzzer's bytes, read in order; past the end every read is zero.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn u8(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }

    /// A length (two bytes, below `max`), then that many bytes.
    fn payload(&mut self, max: usize) -> Bytes {
        let len = usize::from(self.u16()) % (max + 1);
        Bytes::copy_from_slice(self.take(len))
    }
}
