//! The operations the `mux` fuzz target runs, decoded from the fuzzer's bytes.
//!
//! Each operation is a kind byte followed by its arguments; an input that runs out ends the
//! sequence (missing argument bytes read as zero). So every byte string is a valid sequence,
//! and a mutation of one byte changes one operation or one argument.

/// Which mux an operation acts on (or which one sends, for bytes on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Who {
    Worker,
    Frontend,
}

/// One step of a fuzz run: an application call, a transport event, time, or peer bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// Worker: open a stream; the prologue length code picks empty, small or chained.
    Open { prologue: u8 },
    /// Worker: send `n` items of about `len` bytes.
    Send { stream: u8, n: u8, len: u8 },
    /// Worker: send one item large enough to be chained.
    SendBig { stream: u8 },
    /// Worker: finish with a last item (length code as for `Send`, 0 empty).
    Finish { stream: u8, len: u8 },
    /// Worker: reset (ERROR).
    Reset { stream: u8 },
    /// Frontend: read up to `n` items (`recv`).
    Read { stream: u8, n: u8 },
    /// Frontend: read everything at once (`recv_all`).
    ReadAll { stream: u8 },
    /// Frontend: graceful stop.
    Stop { stream: u8 },
    /// Frontend: cancel with a code.
    Cancel { stream: u8, code: u8 },
    /// Let go of a stream on one side.
    Release { who: Who, stream: u8 },
    /// The engine's once-per-pass flush hint.
    FlushHint { who: Who },
    /// GOAWAY from one side.
    GoAway { who: Who, code: u8 },
    /// One `poll_transmit` of a lane's writer; the write completes at once.
    Transmit { who: Who, lane: u8 },
    /// Up to `max` bytes (0: all) of what `who` sent on a lane reach the other side.
    Deliver { who: Who, lane: u8, max: u16 },
    /// Every writer transmits everything, and everything in flight is delivered.
    Pump,
    /// Virtual time moves on; both sides run their timers.
    Advance { ms: u8 },
    /// One side closes a lane (shutdown): CLOSE frame, streams lost.
    Close { who: Who, lane: u8 },
    /// The lane's transport dies under both sides; bytes in flight are lost.
    KillLane { lane: u8 },
    /// A fresh connection for a lane that is not up on both sides.
    LaneUp { lane: u8 },
    /// A BATCH frame with an arbitrary body from `who`, at a frame boundary.
    InjectFrame { who: Who, lane: u8, body: Vec<u8> },
    /// One well-formed record from `who` naming a known stream (or a stale id).
    InjectRecord {
        who: Who,
        lane: u8,
        kind: u8,
        stream: u8,
        value: u32,
    },
    /// Arbitrary bytes from `who`, after what is in flight (framing may break).
    InjectRaw { who: Who, lane: u8, bytes: Vec<u8> },
    /// Run until both sides are idle and everything was read, then check nothing is stuck.
    Settle,
}

/// Operation kinds (the kind byte is taken modulo this).
const KINDS: u8 = 24;

/// Longest injected body or raw byte string, in bytes.
pub(crate) const MAX_INJECT: usize = 255;

/// Reads the fuzzer's bytes in order; past the end every read is zero.
pub(crate) struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub(crate) fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn who(&mut self) -> Who {
        if self.u8() & 1 == 0 {
            Who::Worker
        } else {
            Who::Frontend
        }
    }

    /// A length byte, then that many bytes (fewer if the input ends).
    fn bytes(&mut self) -> Vec<u8> {
        let len = usize::from(self.u8()).min(MAX_INJECT).min(self.data.len());
        let (bytes, rest) = self.data.split_at(len);
        self.data = rest;
        bytes.to_vec()
    }

    /// The next operation, or `None` when the input is used up.
    pub(crate) fn op(&mut self) -> Option<Op> {
        if self.is_empty() {
            return None;
        }
        let op = match self.u8() % KINDS {
            0 | 1 => Op::Open {
                prologue: self.u8(),
            },
            2 | 3 => Op::Send {
                stream: self.u8(),
                n: self.u8(),
                len: self.u8(),
            },
            4 => Op::SendBig { stream: self.u8() },
            5 => Op::Finish {
                stream: self.u8(),
                len: self.u8(),
            },
            6 => Op::Reset { stream: self.u8() },
            7 => Op::Read {
                stream: self.u8(),
                n: self.u8(),
            },
            8 => Op::ReadAll { stream: self.u8() },
            9 => Op::Stop { stream: self.u8() },
            10 => Op::Cancel {
                stream: self.u8(),
                code: self.u8(),
            },
            11 => Op::Release {
                who: self.who(),
                stream: self.u8(),
            },
            12 => Op::FlushHint { who: self.who() },
            13 => Op::GoAway {
                who: self.who(),
                code: self.u8(),
            },
            14 => Op::Transmit {
                who: self.who(),
                lane: self.u8(),
            },
            15 => Op::Deliver {
                who: self.who(),
                lane: self.u8(),
                max: self.u16(),
            },
            16 => Op::Pump,
            17 => Op::Advance { ms: self.u8() },
            18 => Op::Close {
                who: self.who(),
                lane: self.u8(),
            },
            19 => Op::KillLane { lane: self.u8() },
            20 => Op::LaneUp { lane: self.u8() },
            21 => self.inject(),
            22 => Op::InjectRaw {
                who: self.who(),
                lane: self.u8(),
                bytes: self.bytes(),
            },
            _ => Op::Settle,
        };
        Some(op)
    }

    /// An injection: a structured record (even selector) or a raw batch body (odd).
    fn inject(&mut self) -> Op {
        let selector = self.u8();
        let who = if selector & 2 == 0 {
            Who::Worker
        } else {
            Who::Frontend
        };
        let lane = self.u8();
        if selector & 1 == 0 {
            Op::InjectRecord {
                who,
                lane,
                kind: self.u8(),
                stream: self.u8(),
                value: self.u32(),
            }
        } else {
            Op::InjectFrame {
                who,
                lane,
                body: self.bytes(),
            }
        }
    }
}
