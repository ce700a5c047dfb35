//! PACKED: a BATCH body compressed with LZ4 (block format), sent only to a peer whose HELLO
//! announced [`CAP_PACKED`](crate::CAP_PACKED).
//!
//! A response stream's items repeat themselves: MessagePack with field names spells the same
//! keys in every item, and a batch holds items of many streams. LZ4 finds those repeats within
//! one batch at a few hundred MB/s per core, so a lane whose bytes cost packets (a real
//! network's 1,500-byte MTU, not loopback's 64 KiB) sends fewer of them. Each
//! PACKED frame stands alone (no history across frames), so a receiver keeps no state for it
//! and a lost lane loses nothing but its own frames.

use bytes::{Bytes, BytesMut};
use lz4_flex::block::{
    CompressTable, DecompressError, compress_into_with_table, decompress_into,
    get_maximum_output_size,
};

use crate::{FRAME_HEADER_LEN, FrameKind, WireError, frame_header};

/// Length of a PACKED body's prefix: the unpacked (BATCH body) length, `u32` LE.
pub const PACKED_PREFIX_LEN: usize = 4;

/// Shortest PACKED body: the prefix and one byte of block.
const MIN_PACKED_BODY: u32 = 5;

/// Batch bodies shorter than this are never worth packing: a few records of credit or one
/// token's item, which LZ4 cannot shrink by more than its own overhead.
pub const MIN_PACK_LEN: usize = 128;

/// Least spare capacity [`Packer::pack`] reserves when `dst` is short of room.
const RESERVE_STEP: usize = 64 * 1024;

/// Packs batch bodies into PACKED frames, keeping LZ4's hash table between batches (it is
/// cleared for each one: frames stay independent).
#[derive(Default)]
pub struct Packer {
    table: CompressTable,
}

impl std::fmt::Debug for Packer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packer").finish_non_exhaustive()
    }
}

impl Packer {
    /// Appends `body` (a BATCH body) to `dst` as one PACKED frame, header included, when that
    /// is shorter than the BATCH frame would be; otherwise leaves `dst` as it was.
    ///
    /// Returns whether it packed.
    ///
    /// # Panics
    ///
    /// If `body` is 4 GiB or longer (batches are capped far below).
    pub fn pack(&mut self, body: &[u8], dst: &mut BytesMut) -> bool {
        let raw_len = u32::try_from(body.len()).expect("batch bodies are capped below 4 GiB");
        if body.len() < MIN_PACK_LEN {
            return false;
        }
        let start = dst.len();
        let block_at = start + FRAME_HEADER_LEN + PACKED_PREFIX_LEN;
        let need = FRAME_HEADER_LEN + PACKED_PREFIX_LEN + get_maximum_output_size(body.len());
        if dst.capacity() - start < need {
            // In steps of at least 64 KiB, so a buffer split after each frame serves many.
            dst.reserve(need.max(RESERVE_STEP));
        }
        dst.resize(start + need, 0);
        let packed = compress_into_with_table(body, &mut dst[block_at..], &mut self.table);
        let Ok(block_len) = packed else {
            // The output was sized by the library's own bound; never expected.
            dst.truncate(start);
            return false;
        };
        let frame_body = PACKED_PREFIX_LEN + block_len;
        if frame_body >= body.len() {
            dst.truncate(start);
            return false;
        }
        let frame_body_len = u32::try_from(frame_body).expect("shorter than the body");
        dst.truncate(block_at + block_len);
        dst[start..start + FRAME_HEADER_LEN]
            .copy_from_slice(&frame_header(FrameKind::Packed, frame_body_len));
        dst[start + FRAME_HEADER_LEN..block_at].copy_from_slice(&raw_len.to_le_bytes());
        true
    }
}

/// Unpacks a PACKED frame's body into the BATCH body it carries, refusing one that would
/// unpack to more than `max_frame_len` bytes before allocating anything for it.
pub(crate) fn unpack(body: &[u8], max_frame_len: u32) -> Result<Bytes, WireError> {
    let Some((prefix, block)) = body.split_first_chunk::<PACKED_PREFIX_LEN>() else {
        return Err(WireError::BadFrameLength {
            frame: "packed",
            len: u32::try_from(body.len()).unwrap_or(u32::MAX),
            expected: MIN_PACKED_BODY,
        });
    };
    let raw_len = u32::from_le_bytes(*prefix);
    if raw_len > max_frame_len {
        return Err(WireError::FrameTooLarge {
            len: raw_len,
            max: max_frame_len,
        });
    }
    if raw_len == 0 {
        return Err(WireError::EmptyBatch);
    }
    let raw_len = usize::try_from(raw_len).map_err(|_| WireError::FrameTooLarge {
        len: raw_len,
        max: max_frame_len,
    })?;
    let mut raw = vec![0; raw_len];
    match decompress_into(block, &mut raw) {
        Ok(n) if n == raw_len => Ok(Bytes::from(raw)),
        Ok(_) => Err(WireError::BadPacked {
            reason: "its LZ4 block unpacks to fewer bytes than its length prefix says",
        }),
        Err(e) => Err(WireError::BadPacked {
            reason: match e {
                DecompressError::OutputTooSmall { .. } => {
                    "its LZ4 block unpacks to more bytes than its length prefix says"
                }
                DecompressError::OffsetZero | DecompressError::OffsetOutOfBounds => {
                    "its LZ4 block copies from before the start of the unpacked bytes"
                }
                _ => "its LZ4 block ends in the middle of a sequence",
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(records: usize) -> Vec<u8> {
        let mut b = Vec::new();
        for i in 0..records {
            b.extend_from_slice(b"\x02\x07\x01");
            b.push(u8::try_from(i % 128).unwrap_or(0));
            b.extend_from_slice(b"\x2a\x85\xa9token_ids\x91\xce\x00\x01\x02\x03\xa4text\xa4 the");
            b.extend_from_slice(b"\xadcum_log_probs\xcb\xbf\xd0\x00\x00\x00\x00\x00\x00");
        }
        b
    }

    #[test]
    fn a_packed_batch_unpacks_to_the_body_it_was_packed_from() {
        let raw = body(20);
        let mut dst = BytesMut::from(&b"before"[..]);
        assert!(Packer::default().pack(&raw, &mut dst));
        assert_eq!(&dst[..6], b"before");
        let frame = &dst[6..];
        assert_eq!(frame[0], FrameKind::Packed.to_byte());
        let len = u32::from_le_bytes([frame[1], frame[2], frame[3], frame[4]]);
        assert_eq!(len as usize, frame.len() - FRAME_HEADER_LEN);
        assert!(
            frame.len() * 3 < raw.len(),
            "{} packed from {}",
            frame.len(),
            raw.len()
        );
        let got = unpack(&frame[FRAME_HEADER_LEN..], 1 << 20).expect("unpacks");
        assert_eq!(got, raw);
    }

    #[test]
    fn a_decoder_takes_packed_frames_only_once_told_the_peer_may_send_them() {
        let raw = body(20);
        let mut wire = BytesMut::new();
        assert!(Packer::default().pack(&raw, &mut wire));
        let mut strict = crate::FrameDecoder::new(1 << 20);
        assert_eq!(
            strict.decode(&mut wire.clone()),
            Err(WireError::UnexpectedPacked)
        );
        let mut decoder = crate::FrameDecoder::new(1 << 20);
        decoder.accept_packed();
        let batch = crate::Batch::new(Bytes::from(raw)).expect("not empty");
        assert_eq!(
            decoder.decode(&mut wire),
            Ok(Some(crate::Frame::Batch(batch)))
        );
        assert!(wire.is_empty());
    }

    #[test]
    fn bodies_that_do_not_shrink_are_left_alone() {
        let mut dst = BytesMut::from(&b"kept"[..]);
        let short = body(4);
        assert!(!Packer::default().pack(&short[..MIN_PACK_LEN - 1], &mut dst));
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[7]
            })
            .collect();
        assert!(!Packer::default().pack(&noise, &mut dst));
        assert_eq!(&dst[..], b"kept");
    }

    #[test]
    fn an_unpacked_length_over_the_limit_is_refused_before_allocating() {
        let mut frame = (64u32 << 20).to_le_bytes().to_vec();
        frame.push(0);
        assert_eq!(
            unpack(&frame, 1 << 20),
            Err(WireError::FrameTooLarge {
                len: 64 << 20,
                max: 1 << 20
            })
        );
    }

    #[test]
    fn a_block_that_disagrees_with_its_prefix_is_refused() {
        let raw = body(20);
        let mut dst = BytesMut::new();
        assert!(Packer::default().pack(&raw, &mut dst));
        let mut frame = dst[FRAME_HEADER_LEN..].to_vec();
        let n = u32::try_from(raw.len()).unwrap_or(0);
        for (claimed, words) in [(n - 1, "more bytes"), (n + 1, "fewer bytes")] {
            frame[..4].copy_from_slice(&claimed.to_le_bytes());
            let err = unpack(&frame, 1 << 20).expect_err("refused");
            assert!(err.to_string().contains(words), "{claimed}: {err}");
        }
        frame[..4].copy_from_slice(&n.to_le_bytes());
        frame.truncate(frame.len() - 3);
        let err = unpack(&frame, 1 << 20).expect_err("cut");
        assert!(matches!(err, WireError::BadPacked { .. }), "{err}");
        assert_eq!(
            unpack(&[0, 0, 0, 0, 0], 1 << 20),
            Err(WireError::EmptyBatch)
        );
        assert!(matches!(
            unpack(&[1, 0, 0], 1 << 20),
            Err(WireError::BadFrameLength { .. })
        ));
    }
}
