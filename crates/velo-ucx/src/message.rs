//! How a lane's byte stream travels as UCX active messages.
//!
//! Every `LaneWrite::write` becomes one or more active messages of at most
//! [`MAX_MESSAGE_BYTES`], each with a 9-byte AM header:
//!
//! | offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 8 | seq | `u64` LE: this lane direction's message number, from 0 |
//! | 8 | 1 | kind | `0` data (the payload is lane bytes), `1` fin (orderly end, no payload) |
//!
//! The receiver checks `seq` against the next number it expects when UCX calls its handler
//! (handler order is send order on one endpoint, as measured; a gap or a repeat fails the
//! lane), then restores send order for *completion*, which UCX does not keep: a rendezvous
//! message's payload lands after later eager messages have been handled (see `reorder.rs`).

use bytes::Bytes;

/// The active-message id every lane message uses.
pub(crate) const AM_ID: u32 = 0x56;

/// Length of the AM header, in bytes.
pub(crate) const HEADER_LEN: usize = 9;

/// Largest payload of one active message, in bytes: 4 MiB. Larger writes (a write may carry up
/// to 64 chunks of up to a 32 MiB frame each) are split; a received message above it fails the
/// lane, so a peer cannot make the receiver allocate more than this per message.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// What a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Lane bytes.
    Data,
    /// The sender's orderly end of the lane (after its last data message).
    Fin,
}

/// A message's AM header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) seq: u64,
    pub(crate) kind: Kind,
}

impl Header {
    pub(crate) fn encode(self) -> [u8; HEADER_LEN] {
        let mut h = [0; HEADER_LEN];
        h[..8].copy_from_slice(&self.seq.to_le_bytes());
        h[8] = match self.kind {
            Kind::Data => 0,
            Kind::Fin => 1,
        };
        h
    }

    /// Parses a peer's AM header; `None` when it is not one of ours.
    pub(crate) fn decode(h: &[u8]) -> Option<Self> {
        let (seq, kind) = h.split_first_chunk::<8>()?;
        let kind = match kind {
            [0] => Kind::Data,
            [1] => Kind::Fin,
            _ => return None,
        };
        Some(Self {
            seq: u64::from_le_bytes(*seq),
            kind,
        })
    }
}

/// Splits `chunks` (one write, in order) into messages of at most `max` bytes each, without
/// copying: a chunk larger than the room left is cut into `Bytes` slices. Empty chunks are
/// dropped. Empties `chunks`.
pub(crate) fn split(chunks: &mut Vec<Bytes>, max: usize, out: &mut Vec<Vec<Bytes>>) {
    debug_assert!(max > 0);
    let mut current = Vec::new();
    let mut room = max;
    for mut chunk in chunks.drain(..) {
        while !chunk.is_empty() {
            if room == 0 {
                out.push(std::mem::take(&mut current));
                room = max;
            }
            let take = chunk.len().min(room);
            current.push(chunk.split_to(take));
            room -= take;
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_foreign_ones_are_refused() {
        for h in [
            Header {
                seq: 0,
                kind: Kind::Data,
            },
            Header {
                seq: u64::MAX,
                kind: Kind::Fin,
            },
        ] {
            assert_eq!(Header::decode(&h.encode()), Some(h));
        }
        assert_eq!(Header::decode(&[0; 8]), None);
        assert_eq!(Header::decode(&[0; 10]), None);
        let mut bad = Header {
            seq: 1,
            kind: Kind::Data,
        }
        .encode();
        bad[8] = 2;
        assert_eq!(Header::decode(&bad), None);
    }

    fn check(sizes: &[usize], max: usize, expect: &[&[usize]]) {
        let mut n = 0u8;
        let mut chunks: Vec<Bytes> = sizes
            .iter()
            .map(|&s| {
                Bytes::from(
                    (0..s)
                        .map(|_| {
                            n = n.wrapping_add(1);
                            n
                        })
                        .collect::<Vec<u8>>(),
                )
            })
            .collect();
        let all: Vec<u8> = chunks.iter().flat_map(|c| c.to_vec()).collect();
        let mut out = Vec::new();
        split(&mut chunks, max, &mut out);
        assert!(chunks.is_empty());
        let got: Vec<Vec<usize>> = out
            .iter()
            .map(|m| m.iter().map(Bytes::len).collect())
            .collect();
        let want: Vec<Vec<usize>> = expect.iter().map(|m| m.to_vec()).collect();
        assert_eq!(got, want, "{sizes:?} max {max}");
        let joined: Vec<u8> = out.iter().flatten().flat_map(|c| c.to_vec()).collect();
        assert_eq!(joined, all, "bytes and order are kept");
        assert!(
            out.iter()
                .all(|m| m.iter().map(Bytes::len).sum::<usize>() <= max)
        );
    }

    #[test]
    fn writes_are_split_into_bounded_messages_in_order() {
        check(&[10, 20], 100, &[&[10, 20]]);
        check(&[100], 100, &[&[100]]);
        check(&[60, 60], 100, &[&[60, 40], &[20]]);
        check(&[250], 100, &[&[100], &[100], &[50]]);
        check(&[0, 5, 0], 100, &[&[5]]);
        check(&[], 100, &[]);
        check(&[30, 70, 1], 100, &[&[30, 70], &[1]]);
    }
}
