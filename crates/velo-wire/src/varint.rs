//! Canonical unsigned LEB128 varints.
//!
//! Seven value bits per byte, least significant group first, high bit set on every byte but the
//! last. Decoding rejects non-minimal encodings so every value has exactly one encoding and a
//! decoded frame re-encodes to the bytes it came from.

use bytes::BufMut;

use crate::WireError;

/// Longest encoding of a `u32`, in bytes.
pub(crate) const MAX_LEN_U32: usize = 5;
/// Longest encoding of a `u64`, in bytes.
pub(crate) const MAX_LEN_U64: usize = 10;

/// Bytes needed to encode `v`.
#[inline]
pub(crate) const fn len_u64(v: u64) -> usize {
    // 1 + floor(bits / 7), with bits = 64 - leading_zeros, and 0 taking one byte.
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Bytes needed to encode `v`.
#[inline]
pub(crate) const fn len_u32(v: u32) -> usize {
    len_u64(v as u64)
}

/// Writes `v` at the start of `out`, returning the number of bytes written.
///
/// `out` must hold at least [`MAX_LEN_U64`] bytes (callers pass fixed-size stack arrays).
#[inline]
pub(crate) fn write_u64(out: &mut [u8], mut v: u64) -> usize {
    let mut n = 0;
    for slot in out.iter_mut() {
        n += 1;
        if v < 0x80 {
            // Truncation is the point: `v` fits in seven bits here.
            *slot = (v & 0x7f) as u8;
            return n;
        }
        *slot = ((v & 0x7f) as u8) | 0x80;
        v >>= 7;
    }
    unreachable!("varint scratch buffers are MAX_LEN_U64 bytes long")
}

/// Appends `v` to `dst`.
#[inline]
pub(crate) fn put_u64(dst: &mut impl BufMut, v: u64) {
    let mut scratch = [0u8; MAX_LEN_U64];
    let n = write_u64(&mut scratch, v);
    dst.put_slice(&scratch[..n]);
}

/// Reads a canonical varint of at most `bits` bits from `src` at `*pos`, advancing `*pos`.
///
/// Returns `Ok(None)` when `src` ends before the varint does; the caller turns that into the
/// right `Truncated` error for its record.
#[inline]
pub(crate) fn get(
    src: &[u8],
    pos: &mut usize,
    bits: u32,
    field: &'static str,
) -> Result<Option<u64>, WireError> {
    let Some(&first) = src.get(*pos) else {
        return Ok(None);
    };
    if first < 0x80 {
        *pos += 1;
        return Ok(Some(u64::from(first)));
    }
    // Two bytes (values 128..16384: slot ids and lengths of busy connections). A zero second
    // byte would be non-canonical: the slow path rejects it.
    if let Some(&second) = src.get(*pos + 1)
        && second < 0x80
        && second != 0
        && bits >= 14
    {
        *pos += 2;
        return Ok(Some(u64::from(first & 0x7f) | (u64::from(second) << 7)));
    }
    get_slow(src, pos, bits, field)
}

#[cold]
fn get_slow(
    src: &[u8],
    pos: &mut usize,
    bits: u32,
    field: &'static str,
) -> Result<Option<u64>, WireError> {
    let max_len = bits.div_ceil(7) as usize;
    let mut value: u64 = 0;
    for (i, shift) in (0..max_len).zip((0u32..).step_by(7)) {
        let Some(&byte) = src.get(*pos + i) else {
            return Ok(None);
        };
        let group = u64::from(byte & 0x7f);
        // Bits of this group that land above the field width overflow it.
        if shift + 7 > bits && (group >> (bits - shift)) != 0 {
            return Err(WireError::VarintOverflow { field, bits });
        }
        value |= group << shift;
        if byte & 0x80 == 0 {
            // A final zero group after the first byte means a shorter encoding existed.
            if byte == 0 && i > 0 {
                return Err(WireError::NonCanonicalVarint { field });
            }
            *pos += i + 1;
            return Ok(Some(value));
        }
    }
    Err(WireError::VarintOverflow { field, bits })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        put_u64(&mut out, v);
        out
    }

    fn check(bytes: &[u8], bits: u32, expect: Result<Option<u64>, WireError>) {
        let mut pos = 0;
        let got = get(bytes, &mut pos, bits, "test");
        assert_eq!(got, expect, "decoding {bytes:02x?}");
        if let Ok(Some(v)) = got {
            assert_eq!(pos, bytes.len(), "consumed all of {bytes:02x?}");
            assert_eq!(encode(v), bytes, "re-encodes canonically");
        }
    }

    #[test]
    fn small_values_take_one_byte() {
        check(&[0x00], 32, Ok(Some(0)));
        check(&[0x7f], 32, Ok(Some(127)));
        assert_eq!(len_u32(0), 1);
        assert_eq!(len_u32(127), 1);
        assert_eq!(len_u32(128), 2);
    }

    #[test]
    fn multi_byte_values_round_trip() {
        check(&[0x80, 0x01], 32, Ok(Some(128)));
        check(
            &[0xff, 0xff, 0xff, 0xff, 0x0f],
            32,
            Ok(Some(u64::from(u32::MAX))),
        );
        let max = encode(u64::MAX);
        assert_eq!(max.len(), MAX_LEN_U64);
        check(&max, 64, Ok(Some(u64::MAX)));
        for v in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            1 << 21,
            1 << 28,
            u64::from(u32::MAX),
        ] {
            assert_eq!(encode(v).len(), len_u64(v), "len of {v}");
        }
    }

    #[test]
    fn overlong_encodings_are_rejected() {
        check(
            &[0x80, 0x00],
            32,
            Err(WireError::NonCanonicalVarint { field: "test" }),
        );
        check(
            &[0xff, 0x80, 0x00],
            32,
            Err(WireError::NonCanonicalVarint { field: "test" }),
        );
    }

    #[test]
    fn values_wider_than_the_field_are_rejected() {
        // 2^32 needs a fifth group of 0x10, beyond the four bits a u32 has left.
        check(
            &[0x80, 0x80, 0x80, 0x80, 0x10],
            32,
            Err(WireError::VarintOverflow {
                field: "test",
                bits: 32,
            }),
        );
        // Six bytes never fit a u32.
        check(
            &[0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
            32,
            Err(WireError::VarintOverflow {
                field: "test",
                bits: 32,
            }),
        );
        let mut eleven = vec![0xffu8; 10];
        eleven.push(0x01);
        check(
            &eleven,
            64,
            Err(WireError::VarintOverflow {
                field: "test",
                bits: 64,
            }),
        );
    }

    #[test]
    fn truncated_varints_ask_for_more() {
        check(&[], 32, Ok(None));
        check(&[0x80], 32, Ok(None));
        check(&[0xff, 0xff], 64, Ok(None));
    }
}
