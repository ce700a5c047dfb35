//! Where a receiver copies small payloads out of the buffers they arrived in.

use bytes::{Bytes, BytesMut};

/// Bytes of each chunk a [`PayloadArena`] copies payloads into: 4 KiB.
pub const ARENA_CHUNK: usize = 4 * 1024;
/// Payloads longer than this get an allocation of their own: 512 bytes, so a chunk holds at
/// least eight of them and a token-sized one (50-150 bytes) shares it with dozens.
pub const ARENA_MAX_PAYLOAD: usize = 512;

/// Copies small payloads into shared chunks of [`ARENA_CHUNK`] bytes: one allocation per chunk
/// instead of one per payload.
///
/// A payload keeps its chunk alive until it is dropped, so a live payload holds at most
/// [`ARENA_CHUNK`] bytes, whatever else was copied beside it: less than a payload just under a
/// receiver's copy limit holds on its own, and far less than the receive buffer it was
/// copied out of.
#[derive(Debug, Default)]
pub struct PayloadArena {
    chunk: BytesMut,
}

impl PayloadArena {
    /// An arena with no chunk yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// `src`, copied: into the current chunk (a new one when it lacks room) when it is at
    /// most [`ARENA_MAX_PAYLOAD`] bytes, else into an allocation of its own.
    pub fn copy(&mut self, src: &[u8]) -> Bytes {
        if src.len() > ARENA_MAX_PAYLOAD {
            return Bytes::copy_from_slice(src);
        }
        if self.chunk.capacity() - self.chunk.len() < src.len() {
            // The old chunk lives on in the payloads copied into it, and only in them.
            self.chunk = BytesMut::with_capacity(ARENA_CHUNK);
        }
        self.chunk.extend_from_slice(src);
        self.chunk.split().freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_payloads_share_a_chunk_and_come_back_intact() {
        let mut arena = PayloadArena::new();
        let a = arena.copy(b"first token");
        let b = arena.copy(b"second");
        assert_eq!((&a[..], &b[..]), (&b"first token"[..], &b"second"[..]));
        // Adjacent in one chunk: `b` starts where `a` ends.
        assert_eq!(a.as_ptr().wrapping_add(a.len()), b.as_ptr());
    }

    #[test]
    fn a_full_chunk_is_left_to_its_payloads_and_a_new_one_starts() {
        let mut arena = PayloadArena::new();
        let item = [7u8; 100];
        let copies: Vec<Bytes> = (0..100).map(|_| arena.copy(&item)).collect();
        assert!(copies.iter().all(|c| c[..] == item[..]));
        let chunks = copies
            .windows(2)
            .filter(|w| w[0].as_ptr().wrapping_add(100) != w[1].as_ptr())
            .count()
            + 1;
        // 40 payloads of 100 bytes fit a 4 KiB chunk: 100 of them take 3 chunks.
        assert_eq!(chunks, 3);
    }

    #[test]
    fn a_payload_past_the_limit_gets_an_allocation_of_its_own() {
        let mut arena = PayloadArena::new();
        let small = arena.copy(b"x");
        let big = arena.copy(&[1u8; ARENA_MAX_PAYLOAD + 1]);
        let next = arena.copy(b"y");
        assert_eq!(big.len(), ARENA_MAX_PAYLOAD + 1);
        assert_eq!(
            small.as_ptr().wrapping_add(1),
            next.as_ptr(),
            "the chunk goes on"
        );
    }
}
