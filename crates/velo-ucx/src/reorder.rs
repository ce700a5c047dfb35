//! A lane's receive order: messages complete out of order, bytes leave in send order.
//!
//! UCX calls the active-message handler in send order on one endpoint, but a rendezvous
//! message's payload lands only when its `ucp_am_recv_data_nbx` completes, after the handlers
//! of later (eager) messages have run. So every message takes a slot in a FIFO when its handler
//! runs, and bytes leave only from the head:
//!
//! ```text
//!   handler order:   seq 7 (eager, ready)  seq 8 (rndv, waiting)  seq 9 (eager, ready)  fin 10
//!   FIFO:            [delivered at once]   [Waiting(1 MiB)]       [Ready(..)]           [Fin]
//!   seq 8 completes: -> bytes of 8, then 9, then the end of the lane, in that order
//! ```
//!
//! Pure state: no I/O and no UCX; the driver feeds it and moves the delivered bytes on.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

/// Messages a lane holds at most behind one whose payload has not landed, whatever their
/// size: the lane's byte bound alone would let a peer queue millions of empty or one-byte
/// messages (each a slot and an allocation) behind a rendezvous it never lets complete.
pub(crate) const MAX_HELD: usize = 65_536;

/// Why a lane's receive order broke: always the peer's fault (or a UCX ordering change), and
/// fatal to the lane.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReorderError {
    /// A message's number is not the next one (a gap, a repeat or a reordered handler).
    #[error("active message {got} arrived where {expected} was due")]
    OutOfOrder {
        /// The number due.
        expected: u64,
        /// The number that arrived.
        got: u64,
    },
    /// A message arrived after the peer ended the lane.
    #[error("active message {seq} arrived after the peer's end of the lane")]
    AfterFin {
        /// The late message.
        seq: u64,
    },
    /// A message is larger than any sender may send.
    #[error("active message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The peer sent more messages behind one still waiting for its payload than a lane
    /// holds.
    #[error("more than {max} active messages held behind a rendezvous still in flight")]
    TooManyHeld {
        /// The limit ([`MAX_HELD`]).
        max: usize,
    },
    /// A completion names a message that is not waiting.
    #[error("completion for active message {seq}, which is not waiting for its payload")]
    NotWaiting {
        /// The message.
        seq: u64,
    },
}

/// The receive FIFO of one lane.
#[derive(Debug)]
pub(crate) struct Reorder {
    /// The number the next handler call must carry.
    next_seq: u64,
    /// The number of `slots[0]`.
    head_seq: u64,
    slots: VecDeque<Slot>,
    /// Bytes held in `slots` (a waiting slot counts its announced length).
    queued: usize,
    /// Slots still waiting for their payload.
    waiting: usize,
    /// Whether a fin arrived (no message may follow it).
    fin_arrived: bool,
    /// Largest message accepted.
    max_message: usize,
}

#[derive(Debug)]
enum Slot {
    Waiting(usize),
    Ready(Bytes),
    Fin,
}

impl Reorder {
    pub(crate) fn new(max_message: usize) -> Self {
        Self {
            next_seq: 0,
            head_seq: 0,
            slots: VecDeque::new(),
            queued: 0,
            waiting: 0,
            fin_arrived: false,
            max_message,
        }
    }

    /// Bytes that arrived (or were announced) and wait behind an incomplete message.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued
    }

    /// Messages whose payload is still on its way.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting
    }

    /// An eager message `seq` whose payload is `data`: appended to `out` at once when nothing
    /// waits before it, otherwise queued (copied). Returns whether the lane's end was reached.
    pub(crate) fn on_eager(
        &mut self,
        seq: u64,
        data: &[u8],
        out: &mut BytesMut,
    ) -> Result<bool, ReorderError> {
        self.arrive(seq, data.len())?;
        if self.slots.is_empty() {
            self.head_seq = seq + 1;
            out.extend_from_slice(data);
            return Ok(false);
        }
        self.queued += data.len();
        self.slots
            .push_back(Slot::Ready(Bytes::copy_from_slice(data)));
        Ok(false)
    }

    /// A rendezvous message `seq` of `len` bytes whose payload is being fetched: it holds its
    /// place until [`on_complete`](Self::on_complete).
    pub(crate) fn on_rndv(&mut self, seq: u64, len: usize) -> Result<(), ReorderError> {
        self.arrive(seq, len)?;
        self.queued += len;
        self.waiting += 1;
        self.slots.push_back(Slot::Waiting(len));
        Ok(())
    }

    /// The peer's end of the lane, message `seq`. Returns whether the end was reached (nothing
    /// waits before it).
    pub(crate) fn on_fin(&mut self, seq: u64) -> Result<bool, ReorderError> {
        self.arrive(seq, 0)?;
        self.fin_arrived = true;
        if self.slots.is_empty() {
            self.head_seq = seq + 1;
            return Ok(true);
        }
        self.slots.push_back(Slot::Fin);
        Ok(false)
    }

    /// The payload of waiting message `seq` landed: moves every ready slot at the head to
    /// `out`. Returns whether the lane's end was reached.
    pub(crate) fn on_complete(
        &mut self,
        seq: u64,
        data: Bytes,
        out: &mut BytesMut,
    ) -> Result<bool, ReorderError> {
        let slot = seq
            .checked_sub(self.head_seq)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.slots.get_mut(i));
        let Some(slot @ Slot::Waiting(_)) = slot else {
            return Err(ReorderError::NotWaiting { seq });
        };
        let Slot::Waiting(announced) = std::mem::replace(slot, Slot::Ready(Bytes::new())) else {
            unreachable!("matched as waiting above");
        };
        // A short payload counts for what arrived; the announced length was reserved.
        self.queued = self.queued - announced + data.len();
        self.waiting -= 1;
        *slot = Slot::Ready(data);
        Ok(self.drain(out))
    }

    fn arrive(&mut self, seq: u64, len: usize) -> Result<(), ReorderError> {
        if self.fin_arrived {
            return Err(ReorderError::AfterFin { seq });
        }
        if seq != self.next_seq {
            return Err(ReorderError::OutOfOrder {
                expected: self.next_seq,
                got: seq,
            });
        }
        if len > self.max_message {
            return Err(ReorderError::TooLarge {
                len,
                max: self.max_message,
            });
        }
        // Only a message that would take a slot counts: with none held it passes at once.
        if self.slots.len() >= MAX_HELD {
            return Err(ReorderError::TooManyHeld { max: MAX_HELD });
        }
        self.next_seq += 1;
        Ok(())
    }

    fn drain(&mut self, out: &mut BytesMut) -> bool {
        while let Some(front) = self.slots.front() {
            match front {
                Slot::Waiting(_) => return false,
                Slot::Fin => {
                    self.slots.pop_front();
                    self.head_seq += 1;
                    return true;
                }
                Slot::Ready(b) => {
                    self.queued -= b.len();
                    out.extend_from_slice(b);
                    self.slots.pop_front();
                    self.head_seq += 1;
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 1 << 20;

    #[test]
    fn eager_messages_in_order_pass_straight_through() {
        let mut r = Reorder::new(MAX);
        let mut out = BytesMut::new();
        assert_eq!(r.on_eager(0, b"ab", &mut out), Ok(false));
        assert_eq!(r.on_eager(1, b"cd", &mut out), Ok(false));
        assert_eq!(&out[..], b"abcd");
        assert_eq!(r.queued_bytes(), 0);
        assert_eq!(r.on_fin(2), Ok(true));
    }

    #[test]
    fn a_late_rendezvous_payload_holds_back_what_follows_it() {
        let mut r = Reorder::new(MAX);
        let mut out = BytesMut::new();
        r.on_eager(0, b"a", &mut out).unwrap();
        r.on_rndv(1, 3).unwrap();
        r.on_eager(2, b"c", &mut out).unwrap();
        r.on_rndv(3, 2).unwrap();
        assert_eq!(r.on_fin(4), Ok(false));
        assert_eq!(&out[..], b"a", "nothing passes the waiting message");
        assert_eq!(r.queued_bytes(), 6);
        assert_eq!(r.waiting(), 2);
        // The second payload lands first: still held back.
        assert_eq!(
            r.on_complete(3, Bytes::from_static(b"dd"), &mut out),
            Ok(false)
        );
        assert_eq!(&out[..], b"a");
        assert_eq!(
            r.on_complete(1, Bytes::from_static(b"bbb"), &mut out),
            Ok(true)
        );
        assert_eq!(&out[..], b"abbbcdd");
        assert_eq!(r.queued_bytes(), 0);
        assert_eq!(r.waiting(), 0);
    }

    #[test]
    fn gaps_repeats_and_late_messages_break_the_lane() {
        let mut out = BytesMut::new();
        let mut r = Reorder::new(MAX);
        assert_eq!(
            r.on_eager(1, b"x", &mut out),
            Err(ReorderError::OutOfOrder {
                expected: 0,
                got: 1
            })
        );
        let mut r = Reorder::new(MAX);
        r.on_eager(0, b"x", &mut out).unwrap();
        assert_eq!(
            r.on_rndv(0, 5),
            Err(ReorderError::OutOfOrder {
                expected: 1,
                got: 0
            })
        );
        let mut r = Reorder::new(MAX);
        r.on_fin(0).unwrap();
        assert_eq!(
            r.on_eager(1, b"x", &mut out),
            Err(ReorderError::AfterFin { seq: 1 })
        );
        let mut r = Reorder::new(4);
        assert_eq!(
            r.on_rndv(0, 5),
            Err(ReorderError::TooLarge { len: 5, max: 4 })
        );
        let mut r = Reorder::new(MAX);
        r.on_eager(0, b"x", &mut out).unwrap();
        assert_eq!(
            r.on_complete(0, Bytes::new(), &mut out),
            Err(ReorderError::NotWaiting { seq: 0 })
        );
        assert_eq!(
            r.on_complete(9, Bytes::new(), &mut out),
            Err(ReorderError::NotWaiting { seq: 9 })
        );
    }

    /// A peer that queues empty messages behind a rendezvous it never lets complete holds no
    /// bytes, but every message is a slot: past [`MAX_HELD`] the lane breaks instead of the
    /// FIFO growing without bound.
    #[test]
    fn messages_held_behind_a_rendezvous_are_bounded_in_number_not_only_in_bytes() {
        let mut r = Reorder::new(MAX);
        let mut out = BytesMut::new();
        r.on_rndv(0, 8).unwrap();
        let max = u64::try_from(MAX_HELD).unwrap();
        let mut seq = 1;
        let outcome = loop {
            match r.on_eager(seq, b"", &mut out) {
                Ok(_) if seq <= 2 * max => seq += 1,
                other => break other,
            }
        };
        assert_eq!(outcome, Err(ReorderError::TooManyHeld { max: MAX_HELD }));
        assert_eq!(seq, max, "the rendezvous and MAX_HELD - 1 more");
        assert_eq!(r.queued_bytes(), 8);
        assert_eq!(r.waiting(), 1);
    }

    #[test]
    fn a_short_payload_counts_what_arrived() {
        let mut r = Reorder::new(MAX);
        let mut out = BytesMut::new();
        r.on_rndv(0, 10).unwrap();
        r.on_rndv(1, 10).unwrap();
        r.on_complete(1, Bytes::from_static(b"xyz"), &mut out)
            .unwrap();
        assert_eq!(r.queued_bytes(), 13);
        r.on_complete(0, Bytes::from_static(b"ab"), &mut out)
            .unwrap();
        assert_eq!(&out[..], b"abxyz");
        assert_eq!(r.queued_bytes(), 0);
    }
}
