//! MessagePack items decoded by a reader over one slice that makes exactly the visits
//! `rmp_serde` makes, with less work per visit, and hands everything else to `rmp_serde`.
//!
//! Why not `rmp_serde` alone: at plane saturation its decoding of the bench's item (a named
//! map of five fields) was a third of the frontend's CPU samples (`cargo xtask profile`), and
//! most of that was its general `any_inner` path, which every number and field goes through,
//! and UTF-8 checks of the field names (together 24% of the samples). This reader differs in
//! two ways only:
//!
//! - a struct's key whose bytes equal one of its field names is handed to the visitor as that
//!   field name's own `&'static str`: the same text, valid UTF-8 by construction, unchecked;
//! - each `deserialize_*` reads its marker straight from the slice.
//!
//! It decodes an item only where it made the visits `rmp_serde` would have made: anything it
//! does not mirror (enums, extension types, 128-bit integers, `bin` read as a sequence,
//! nesting deeper than [`MAX_DEPTH`]) and **any error at all**, even one a `Deserialize`
//! implementation caught and recovered from (an untagged enum's refused variants), sends the
//! item to `rmp_serde`, whose value or
//! error is then the answer. The `prologue` fuzz target checks that the two agree on every
//! input the fast reader accepts.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};

/// Deepest nesting of arrays and maps the fast reader follows; deeper items go to `rmp_serde`
/// (which allows 1,024).
pub(crate) const MAX_DEPTH: u16 = 64;

thread_local! {
    /// Errors raised by fast readers on this thread, so a decode can tell whether one was
    /// raised and then swallowed by the item's `Deserialize`.
    static MISSES: Cell<u64> = const { Cell::new(0) };
}

#[inline]
fn misses() -> u64 {
    MISSES.with(Cell::get)
}

/// Decodes one item: the fast reader, or `rmp_serde` where the fast reader does not decode it.
pub(crate) fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, rmp_serde::decode::Error> {
    match fast(bytes) {
        Some(item) => Ok(item),
        None => rmp_serde::from_slice(bytes),
    }
}

/// The fast reader alone: `None` where the item is for `rmp_serde` to decode (or refuse).
pub(crate) fn fast<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let before = misses();
    let mut reader = Reader {
        input: bytes,
        depth: MAX_DEPTH,
        key_fields: &[],
        key_hint: 0,
    };
    let item = T::deserialize(&mut reader).ok()?;
    (misses() == before).then_some(item)
}

/// Why the fast reader stopped; never shown to a caller, who gets `rmp_serde`'s answer.
#[derive(Debug)]
pub(crate) struct Miss;

impl Miss {
    #[cold]
    fn new() -> Self {
        MISSES.with(|m| m.set(m.get().wrapping_add(1)));
        Self
    }
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not decoded by the fast MessagePack reader")
    }
}

impl std::error::Error for Miss {}

impl de::Error for Miss {
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        Self::new()
    }
}

// MessagePack markers (https://github.com/msgpack/msgpack/blob/master/spec.md#formats).
const NIL: u8 = 0xc0;
const FALSE: u8 = 0xc2;
const TRUE: u8 = 0xc3;
const BIN8: u8 = 0xc4;
const BIN16: u8 = 0xc5;
const BIN32: u8 = 0xc6;
const F32: u8 = 0xca;
const F64: u8 = 0xcb;
const U8: u8 = 0xcc;
const U16: u8 = 0xcd;
const U32: u8 = 0xce;
const U64: u8 = 0xcf;
const I8: u8 = 0xd0;
const I16: u8 = 0xd1;
const I32: u8 = 0xd2;
const I64: u8 = 0xd3;
const STR8: u8 = 0xd9;
const STR16: u8 = 0xda;
const STR32: u8 = 0xdb;
const ARRAY16: u8 = 0xdc;
const ARRAY32: u8 = 0xdd;
const MAP16: u8 = 0xde;
const MAP32: u8 = 0xdf;
const FIXARRAY_EMPTY: u8 = 0x90;

struct Reader<'de> {
    input: &'de [u8],
    /// Nesting levels left before the item goes to `rmp_serde`.
    depth: u16,
    /// The field names of the struct whose next key is being read (empty otherwise).
    key_fields: &'static [&'static str],
    /// Which of `key_fields` to try first: keys usually come in the fields' order.
    key_hint: usize,
}

impl<'de> Reader<'de> {
    #[inline]
    fn peek(&self) -> Result<u8, Miss> {
        self.input.first().copied().ok_or_else(Miss::new)
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'de [u8], Miss> {
        let Some((taken, rest)) = self.input.split_at_checked(n) else {
            return Err(Miss::new());
        };
        self.input = rest;
        Ok(taken)
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Miss> {
        self.take(N)?.try_into().map_err(|_| Miss::new())
    }

    #[inline]
    fn byte(&mut self) -> Result<u8, Miss> {
        self.array::<1>().map(|[b]| b)
    }

    /// The length after a marker whose length is in the next `N` bytes.
    #[inline]
    fn len<const N: usize>(&mut self) -> Result<usize, Miss> {
        let raw = self.array::<N>()?;
        let len = raw.iter().fold(0u64, |n, &b| (n << 8) | u64::from(b));
        usize::try_from(len).map_err(|_| Miss::new())
    }

    /// A nil, boolean or number, visited as `rmp_serde`'s `any_num` visits it.
    fn number<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value, Miss> {
        let marker = self.byte()?;
        match marker {
            0x00..=0x7f => visitor.visit_u8(marker),
            0xe0..=0xff => visitor.visit_i8(i8::from_be_bytes([marker])),
            NIL => visitor.visit_unit(),
            FALSE => visitor.visit_bool(false),
            TRUE => visitor.visit_bool(true),
            U8 => visitor.visit_u8(self.byte()?),
            U16 => visitor.visit_u16(u16::from_be_bytes(self.array()?)),
            U32 => visitor.visit_u32(u32::from_be_bytes(self.array()?)),
            U64 => visitor.visit_u64(u64::from_be_bytes(self.array()?)),
            I8 => visitor.visit_i8(i8::from_be_bytes(self.array()?)),
            I16 => visitor.visit_i16(i16::from_be_bytes(self.array()?)),
            I32 => visitor.visit_i32(i32::from_be_bytes(self.array()?)),
            I64 => visitor.visit_i64(i64::from_be_bytes(self.array()?)),
            F32 => visitor.visit_f32(f32::from_be_bytes(self.array()?)),
            F64 => visitor.visit_f64(f64::from_be_bytes(self.array()?)),
            _ => Err(Miss::new()),
        }
    }

    /// Any value, visited as `rmp_serde`'s `any_inner` visits it; `bin` is visited as bytes
    /// only where `rmp_serde` would (`allow_bytes`), and a map's keys are matched against
    /// `fields` (a struct's field names, or none).
    fn any<V: Visitor<'de>>(
        &mut self,
        visitor: V,
        allow_bytes: bool,
        fields: &'static [&'static str],
    ) -> Result<V::Value, Miss> {
        let key_fields = std::mem::take(&mut self.key_fields);
        let marker = self.peek()?;
        match marker {
            0x00..=0x7f | 0xe0..=0xff | NIL | FALSE | TRUE | F32..=I64 => self.number(visitor),
            0xa0..=0xbf | STR8..=STR32 => {
                let len = self.skip_marker_len(marker)?;
                let bytes = self.take(len)?;
                if let Some(field) = field_named(key_fields, self.key_hint, bytes) {
                    return visitor.visit_borrowed_str(field);
                }
                match std::str::from_utf8(bytes) {
                    Ok(s) => visitor.visit_borrowed_str(s),
                    Err(_) => visitor.visit_borrowed_bytes(bytes),
                }
            }
            0x90..=0x9f | ARRAY16 | ARRAY32 => {
                let len = self.skip_marker_len(marker)?;
                self.nested(|r| {
                    let mut seq = Seq { r, left: len };
                    let value = visitor.visit_seq(&mut seq)?;
                    if seq.left == 0 {
                        Ok(value)
                    } else {
                        Err(Miss::new())
                    }
                })
            }
            0x80..=0x8f | MAP16 | MAP32 => {
                let len = self.skip_marker_len(marker)?;
                self.nested(|r| {
                    let mut map = Map {
                        r,
                        left: len,
                        fields,
                        read: 0,
                    };
                    let value = visitor.visit_map(&mut map)?;
                    if map.left == 0 {
                        Ok(value)
                    } else {
                        Err(Miss::new())
                    }
                })
            }
            BIN8..=BIN32 if allow_bytes => {
                let len = self.skip_marker_len(marker)?;
                visitor.visit_borrowed_bytes(self.take(len)?)
            }
            _ => Err(Miss::new()),
        }
    }

    /// Consumes a string, array, map or bin marker and its length field; returns the length.
    #[inline]
    fn skip_marker_len(&mut self, marker: u8) -> Result<usize, Miss> {
        self.byte()?;
        match marker {
            0xa0..=0xbf => Ok(usize::from(marker & 0x1f)),
            0x80..=0x9f => Ok(usize::from(marker & 0x0f)),
            STR8 | BIN8 => self.len::<1>(),
            STR16 | BIN16 | ARRAY16 | MAP16 => self.len::<2>(),
            STR32 | BIN32 | ARRAY32 | MAP32 => self.len::<4>(),
            _ => Err(Miss::new()),
        }
    }

    #[inline]
    fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, Miss>) -> Result<T, Miss> {
        self.depth = self.depth.checked_sub(1).ok_or_else(Miss::new)?;
        let value = f(self);
        self.depth += 1;
        value
    }
}

/// The field of `fields` spelled `bytes`, trying `fields[hint]` first.
#[inline]
fn field_named(fields: &'static [&'static str], hint: usize, bytes: &[u8]) -> Option<&'static str> {
    let spelled = |f: &str| same_short(f.as_bytes(), bytes);
    if let Some(&field) = fields.get(hint)
        && spelled(field)
    {
        return Some(field);
    }
    fields.iter().find(|f| spelled(f)).copied()
}

/// Whether `a` and `b` are the same bytes, compared eight at a time: field names are short,
/// and a call to `memcmp` costs more than the comparison (byte by byte, it was a third of the
/// reader's own time at saturation).
#[inline]
fn same_short(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut a8, mut b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let words = (&mut a8).zip(&mut b8).all(|(x, y)| word(x) == word(y));
    words
        && a8
            .remainder()
            .iter()
            .zip(b8.remainder())
            .all(|(x, y)| x == y)
}

/// Eight bytes as one word.
#[inline]
fn word(b: &[u8]) -> u64 {
    <[u8; 8]>::try_from(b).map_or(0, u64::from_ne_bytes)
}

struct Seq<'a, 'de> {
    r: &'a mut Reader<'de>,
    left: usize,
}

impl<'de> de::SeqAccess<'de> for Seq<'_, 'de> {
    type Error = Miss;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Miss> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.r).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

struct Map<'a, 'de> {
    r: &'a mut Reader<'de>,
    left: usize,
    fields: &'static [&'static str],
    /// Keys read so far.
    read: usize,
}

impl<'de> de::MapAccess<'de> for Map<'_, 'de> {
    type Error = Miss;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Miss> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        self.r.key_fields = self.fields;
        self.r.key_hint = self.read;
        self.read += 1;
        let key = seed.deserialize(&mut *self.r);
        self.r.key_fields = &[];
        key.map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Miss> {
        seed.deserialize(&mut *self.r)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

/// `deserialize_*` methods that `rmp_serde` answers with `any_num`.
macro_rules! numbers {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Miss> {
            self.number(visitor)
        }
    )*};
}

/// `deserialize_*` methods that `rmp_serde` forwards to `deserialize_any`.
macro_rules! anys {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Miss> {
            self.any(visitor, true, &[])
        }
    )*};
}

impl<'de> de::Deserializer<'de> for &mut Reader<'de> {
    type Error = Miss;

    numbers! {
        deserialize_bool deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_f32 deserialize_f64
    }

    anys! {
        deserialize_any deserialize_bytes deserialize_byte_buf deserialize_unit deserialize_map
        deserialize_identifier deserialize_str deserialize_string deserialize_char
        deserialize_ignored_any
    }

    fn is_human_readable(&self) -> bool {
        false
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Miss> {
        if self.peek()? == NIL {
            self.byte()?;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Miss> {
        self.any(visitor, false, &[])
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Miss> {
        self.any(visitor, false, &[])
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Miss> {
        self.any(visitor, false, &[])
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Miss> {
        self.any(visitor, false, fields)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Miss> {
        if matches!(self.peek()?, NIL | FIXARRAY_EMPTY) {
            self.byte()?;
            visitor.visit_unit()
        } else {
            self.any(visitor, true, &[])
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Miss> {
        if name == rmp_serde::MSGPACK_EXT_STRUCT_NAME {
            return Err(Miss::new());
        }
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Miss> {
        Err(Miss::new())
    }

    fn deserialize_i128<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Miss> {
        Err(Miss::new())
    }

    fn deserialize_u128<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Miss> {
        Err(Miss::new())
    }
}

#[cfg(test)]
mod tests;
