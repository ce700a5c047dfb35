//! Records: what a batch frame carries, one per stream event.

use std::ops::Range;

use bytes::{BufMut, Bytes};

use crate::varint::{self, MAX_LEN_U32, MAX_LEN_U64};
use crate::{CancelCode, ErrorCode, GoAwayCode, StreamId, Token, WireError};

/// One record inside a batch frame.
///
/// Records flow in two directions. The opener of a stream (the worker) sends `Open`, `Data`,
/// `Final` and `Error`; the acceptor (the frontend) answers with `Accept`, `Stop`, `Cancel`
/// and `Credit`. All of them name the stream by the opener's [`StreamId`]. `Heartbeat` and
/// `GoAway` concern the whole lane or connection and flow both ways.
///
/// Payloads are [`Bytes`] slices of the received batch (decoding copies nothing), unless the
/// batch is read with [`Batch::records_copying_below`](crate::Batch::records_copying_below).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Opens a stream and carries its prologue.
    Open {
        /// The new stream's id, chosen by the opener.
        stream: StreamId,
        /// The acceptor's registration key, copied from the stream's address.
        ticket: u64,
        /// The secret from the stream's address; the acceptor refuses the open if it differs.
        token: Token,
        /// The prologue: JSON bytes, opaque to this layer.
        prologue: Bytes,
    },
    /// One item of the stream.
    Data {
        /// The stream.
        stream: StreamId,
        /// Index of this item among the stream's `Data` records, from 0.
        seq: u32,
        /// The encoded item.
        payload: Bytes,
    },
    /// The clean end of a stream, with an optional last item.
    Final {
        /// The stream.
        stream: StreamId,
        /// Number of `Data` records sent before this one.
        seq: u32,
        /// The last item, or empty.
        payload: Bytes,
    },
    /// The abnormal end of a stream, sent by its opener.
    Error {
        /// The stream.
        stream: StreamId,
        /// An application-defined error code.
        code: ErrorCode,
        /// A human-readable message.
        message: String,
    },
    /// The acceptor took the stream: from now on it reports the stream's end to its reader
    /// whatever happens to the lane. Every `Open` is answered by `Accept` or `Cancel`.
    Accept {
        /// The stream.
        stream: StreamId,
    },
    /// The acceptor asks the opener to finish soon (graceful cancellation).
    Stop {
        /// The stream.
        stream: StreamId,
    },
    /// The acceptor drops the stream (hard cancellation or refusal).
    Cancel {
        /// The stream.
        stream: StreamId,
        /// Why.
        code: CancelCode,
    },
    /// The acceptor lets the opener send `grant` more records on the stream.
    Credit {
        /// The stream.
        stream: StreamId,
        /// Additional records allowed, at least 1.
        grant: u32,
    },
    /// Proof of life when there is nothing else to send.
    Heartbeat,
    /// The sender accepts no new streams; existing ones may finish.
    GoAway {
        /// Why; [`GoAwayCode::DRAIN`] is an orderly drain.
        code: GoAwayCode,
    },
}

/// Record kind bytes.
pub(crate) mod kind {
    pub(crate) const OPEN: u8 = 0x01;
    pub(crate) const DATA: u8 = 0x02;
    pub(crate) const FINAL: u8 = 0x03;
    pub(crate) const ERROR: u8 = 0x04;
    pub(crate) const STOP: u8 = 0x05;
    pub(crate) const CANCEL: u8 = 0x06;
    pub(crate) const CREDIT: u8 = 0x07;
    pub(crate) const HEARTBEAT: u8 = 0x08;
    pub(crate) const GOAWAY: u8 = 0x09;
    pub(crate) const ACCEPT: u8 = 0x0a;
}

/// Which of the two payload-carrying record kinds to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataKind {
    /// [`Record::Data`].
    Data,
    /// [`Record::Final`].
    Final,
}

/// Longest header of a `Data` or `Final` record, in bytes: kind, slot, generation, seq, length.
pub const MAX_DATA_HEADER_LEN: usize = 1 + 4 * MAX_LEN_U32;

/// Encodes the header of a `Data` or `Final` record whose payload of `payload_len` bytes
/// follows separately (copied or chained by the caller). Returns the header length.
///
/// This is the zero-copy path: a sender writes the header into its batch buffer and then
/// either copies a small payload after it or chains a large one as its own buffer.
#[inline]
pub fn encode_data_header(
    dst: &mut impl BufMut,
    kind: DataKind,
    stream: StreamId,
    seq: u32,
    payload_len: u32,
) -> usize {
    let mut h = [0u8; MAX_DATA_HEADER_LEN + 1];
    h[0] = match kind {
        DataKind::Data => kind::DATA,
        DataKind::Final => kind::FINAL,
    };
    let mut n = 1;
    n += varint::write_u64(&mut h[n..], u64::from(stream.slot()));
    n += varint::write_u64(&mut h[n..], u64::from(stream.generation()));
    n += varint::write_u64(&mut h[n..], u64::from(seq));
    n += varint::write_u64(&mut h[n..], u64::from(payload_len));
    dst.put_slice(&h[..n]);
    n
}

/// Length of a `Data` or `Final` record header.
#[inline]
pub fn data_header_len(stream: StreamId, seq: u32, payload_len: u32) -> usize {
    1 + varint::len_u32(stream.slot())
        + varint::len_u32(stream.generation())
        + varint::len_u32(seq)
        + varint::len_u32(payload_len)
}

/// Encodes an `Open` record whose prologue is borrowed (the mux's hot path; same bytes as
/// [`Record::encode`] of the equivalent [`Record::Open`]).
///
/// # Panics
///
/// If the prologue is 4 GiB or longer.
pub fn encode_open(
    dst: &mut impl BufMut,
    stream: StreamId,
    ticket: u64,
    token: &Token,
    prologue: &[u8],
) {
    let mut h = [0u8; 1 + 2 * MAX_LEN_U32 + MAX_LEN_U64 + 16 + MAX_LEN_U32];
    h[0] = kind::OPEN;
    let mut n = 1 + write_stream(&mut h[1..], stream);
    n += varint::write_u64(&mut h[n..], ticket);
    h[n..n + 16].copy_from_slice(&token.0);
    n += 16;
    n += varint::write_u64(&mut h[n..], u64::from(len_u32(prologue)));
    dst.put_slice(&h[..n]);
    dst.put_slice(prologue);
}

/// Length of an `Open` record with a prologue of `prologue_len` bytes.
pub fn open_len(stream: StreamId, ticket: u64, prologue_len: u32) -> usize {
    1 + varint::len_u32(stream.slot())
        + varint::len_u32(stream.generation())
        + varint::len_u64(ticket)
        + 16
        + varint::len_u32(prologue_len)
        + prologue_len as usize
}

impl Record {
    /// This record with a `Data` or `Final` payload shorter than `limit` bytes copied into an
    /// allocation of its own; other records unchanged.
    pub(crate) fn owning_payload_below(self, limit: usize) -> Self {
        match self {
            Self::Data {
                stream,
                seq,
                payload,
            } if payload.len() < limit => Self::Data {
                stream,
                seq,
                payload: Bytes::copy_from_slice(&payload),
            },
            Self::Final {
                stream,
                seq,
                payload,
            } if payload.len() < limit => Self::Final {
                stream,
                seq,
                payload: Bytes::copy_from_slice(&payload),
            },
            other => other,
        }
    }

    /// The stream this record concerns, if any.
    pub fn stream(&self) -> Option<StreamId> {
        match self {
            Self::Open { stream, .. }
            | Self::Data { stream, .. }
            | Self::Final { stream, .. }
            | Self::Error { stream, .. }
            | Self::Accept { stream }
            | Self::Stop { stream }
            | Self::Cancel { stream, .. }
            | Self::Credit { stream, .. } => Some(*stream),
            Self::Heartbeat | Self::GoAway { .. } => None,
        }
    }

    /// A short lower-case name for the record's kind.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Open { .. } => "open",
            Self::Data { .. } => "data",
            Self::Final { .. } => "final",
            Self::Error { .. } => "error",
            Self::Accept { .. } => "accept",
            Self::Stop { .. } => "stop",
            Self::Cancel { .. } => "cancel",
            Self::Credit { .. } => "credit",
            Self::Heartbeat => "heartbeat",
            Self::GoAway { .. } => "goaway",
        }
    }

    /// Appends the record's canonical encoding to `dst`.
    ///
    /// # Panics
    ///
    /// If a payload, prologue or message is 4 GiB or longer; frames are capped far below that,
    /// so callers check their own record limits first.
    pub fn encode(&self, dst: &mut impl BufMut) {
        match self {
            Self::Open {
                stream,
                ticket,
                token,
                prologue,
            } => {
                encode_open(dst, *stream, *ticket, token, prologue);
            }
            Self::Data {
                stream,
                seq,
                payload,
            } => {
                encode_data_header(dst, DataKind::Data, *stream, *seq, len_u32(payload));
                dst.put_slice(payload);
            }
            Self::Final {
                stream,
                seq,
                payload,
            } => {
                encode_data_header(dst, DataKind::Final, *stream, *seq, len_u32(payload));
                dst.put_slice(payload);
            }
            Self::Error {
                stream,
                code,
                message,
            } => {
                put_stream_header(dst, kind::ERROR, *stream);
                varint::put_u64(dst, u64::from(code.0));
                varint::put_u64(dst, u64::from(len_u32(message.as_bytes())));
                dst.put_slice(message.as_bytes());
            }
            Self::Accept { stream } => put_stream_header(dst, kind::ACCEPT, *stream),
            Self::Stop { stream } => put_stream_header(dst, kind::STOP, *stream),
            Self::Cancel { stream, code } => {
                put_stream_header(dst, kind::CANCEL, *stream);
                varint::put_u64(dst, u64::from(code.0));
            }
            Self::Credit { stream, grant } => {
                put_stream_header(dst, kind::CREDIT, *stream);
                varint::put_u64(dst, u64::from(*grant));
            }
            Self::Heartbeat => dst.put_u8(kind::HEARTBEAT),
            Self::GoAway { code } => {
                dst.put_u8(kind::GOAWAY);
                varint::put_u64(dst, u64::from(code.0));
            }
        }
    }

    /// Length of the record's encoding, in bytes.
    pub fn encoded_len(&self) -> usize {
        let stream_len = |s: &StreamId| varint::len_u32(s.slot()) + varint::len_u32(s.generation());
        let blob = |b: &[u8]| varint::len_u32(len_u32(b)) + b.len();
        match self {
            Self::Open {
                stream,
                ticket,
                prologue,
                ..
            } => 1 + stream_len(stream) + varint::len_u64(*ticket) + 16 + blob(prologue),
            Self::Data {
                stream,
                seq,
                payload,
            }
            | Self::Final {
                stream,
                seq,
                payload,
            } => data_header_len(*stream, *seq, len_u32(payload)) + payload.len(),
            Self::Error {
                stream,
                code,
                message,
            } => 1 + stream_len(stream) + varint::len_u32(code.0) + blob(message.as_bytes()),
            Self::Accept { stream } | Self::Stop { stream } => 1 + stream_len(stream),
            Self::Cancel { stream, code } => 1 + stream_len(stream) + varint::len_u32(code.0),
            Self::Credit { stream, grant } => 1 + stream_len(stream) + varint::len_u32(*grant),
            Self::Heartbeat => 1,
            Self::GoAway { code } => 1 + varint::len_u32(code.0),
        }
    }

    /// Decodes the record starting at `*pos` in `body`, advancing `*pos` past it.
    pub(crate) fn decode(body: &Bytes, pos: &mut usize) -> Result<Self, WireError> {
        let Some(&k) = body.get(*pos) else {
            return Err(WireError::Truncated {
                record: "record",
                field: "kind",
            });
        };
        let mut c = Cursor {
            buf: body,
            pos: *pos + 1,
            record: "record",
        };
        let record = match k {
            kind::DATA | kind::FINAL => c.data(body, k)?,
            kind::CREDIT => c.credit()?,
            kind::OPEN => c.open(body)?,
            kind::ERROR => c.error(body)?,
            kind::STOP => {
                c.record = "stop";
                Self::Stop {
                    stream: c.stream()?,
                }
            }
            kind::ACCEPT => {
                c.record = "accept";
                Self::Accept {
                    stream: c.stream()?,
                }
            }
            kind::CANCEL => {
                c.record = "cancel";
                let stream = c.stream()?;
                let code = CancelCode(c.u32("code")?);
                Self::Cancel { stream, code }
            }
            kind::HEARTBEAT => Self::Heartbeat,
            kind::GOAWAY => {
                c.record = "goaway";
                Self::GoAway {
                    code: GoAwayCode(c.u32("code")?),
                }
            }
            other => return Err(WireError::UnknownRecord { kind: other }),
        };
        *pos = c.pos;
        Ok(record)
    }
}

/// The body of each record kind that has more than a field or two.
impl Cursor<'_> {
    fn data(&mut self, body: &Bytes, k: u8) -> Result<Record, WireError> {
        self.record = if k == kind::DATA { "data" } else { "final" };
        let stream = self.stream()?;
        let seq = self.u32("seq")?;
        let payload = self.blob(body, "payload")?;
        Ok(if k == kind::DATA {
            Record::Data {
                stream,
                seq,
                payload,
            }
        } else {
            Record::Final {
                stream,
                seq,
                payload,
            }
        })
    }

    fn credit(&mut self) -> Result<Record, WireError> {
        self.record = "credit";
        let stream = self.stream()?;
        let grant = self.u32("grant")?;
        if grant == 0 {
            return Err(WireError::InvalidField {
                field: "credit grant",
                reason: "must be at least 1",
            });
        }
        Ok(Record::Credit { stream, grant })
    }

    fn open(&mut self, body: &Bytes) -> Result<Record, WireError> {
        self.record = "open";
        let stream = self.stream()?;
        let ticket = self.u64("ticket")?;
        let token = Token(self.array16("token")?);
        let prologue = self.blob(body, "prologue")?;
        Ok(Record::Open {
            stream,
            ticket,
            token,
            prologue,
        })
    }

    fn error(&mut self, body: &Bytes) -> Result<Record, WireError> {
        self.record = "error";
        let stream = self.stream()?;
        let code = ErrorCode(self.u32("code")?);
        let message = self.blob(body, "message")?;
        let message = std::str::from_utf8(&message)
            .map_err(|_| WireError::InvalidUtf8 {
                field: "error message",
            })?
            .to_owned();
        Ok(Record::Error {
            stream,
            code,
            message,
        })
    }
}

/// Decodes a DATA record whose varints all fit one or two bytes, or returns `None` (without
/// moving `pos`) so the general decoder handles it, errors included. Same results as
/// [`Record::decode`] for every input it accepts; the round-trip and malformed tests cover both.
#[inline(always)]
pub(crate) fn decode_data_fast(body: &Bytes, pos: &mut usize, copy_below: usize) -> Option<Record> {
    let (stream, seq, range) = data_view_fast(body, pos)?;
    let payload = if range.len() < copy_below {
        Bytes::copy_from_slice(body.get(range)?)
    } else {
        body.slice(range)
    };
    Some(Record::Data {
        stream,
        seq,
        payload,
    })
}

/// As [`decode_data_fast`], but the payload is left where it is: its range in `b`.
#[inline(always)]
pub(crate) fn data_view_fast(b: &[u8], pos: &mut usize) -> Option<(StreamId, u32, Range<usize>)> {
    let mut p = *pos;
    if *b.get(p)? != kind::DATA {
        return None;
    }
    p += 1;
    let slot = small_varint(b, &mut p)?;
    let generation = small_varint(b, &mut p)?;
    let seq = small_varint(b, &mut p)?;
    let len = small_varint(b, &mut p)? as usize;
    let end = p + len;
    if end > b.len() {
        return None;
    }
    *pos = end;
    Some((StreamId::new(slot, generation), seq, p..end))
}

/// A canonical one- or two-byte varint, else `None`.
#[inline(always)]
fn small_varint(b: &[u8], p: &mut usize) -> Option<u32> {
    let first = *b.get(*p)?;
    if first < 0x80 {
        *p += 1;
        return Some(u32::from(first));
    }
    let second = *b.get(*p + 1)?;
    if second >= 0x80 || second == 0 {
        return None;
    }
    *p += 2;
    Some(u32::from(first & 0x7f) | (u32::from(second) << 7))
}

fn len_u32(b: &[u8]) -> u32 {
    u32::try_from(b.len()).expect("record fields are checked against frame limits far below 4 GiB")
}

fn write_stream(out: &mut [u8], stream: StreamId) -> usize {
    let n = varint::write_u64(out, u64::from(stream.slot()));
    n + varint::write_u64(&mut out[n..], u64::from(stream.generation()))
}

fn put_stream_header(dst: &mut impl BufMut, k: u8, stream: StreamId) {
    let mut h = [0u8; 1 + 2 * MAX_LEN_U64];
    h[0] = k;
    let n = 1 + write_stream(&mut h[1..], stream);
    dst.put_slice(&h[..n]);
}

/// A bounds-checked reader over one record's fields.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    record: &'static str,
}

impl Cursor<'_> {
    #[inline]
    fn varint(&mut self, bits: u32, field: &'static str) -> Result<u64, WireError> {
        match varint::get(self.buf, &mut self.pos, bits, field)? {
            Some(v) => Ok(v),
            None => Err(WireError::Truncated {
                record: self.record,
                field,
            }),
        }
    }

    #[inline]
    fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        let v = self.varint(32, field)?;
        // `varint` enforced the width; the conversion cannot fail.
        u32::try_from(v).map_err(|_| WireError::VarintOverflow { field, bits: 32 })
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        self.varint(64, field)
    }

    #[inline]
    fn stream(&mut self) -> Result<StreamId, WireError> {
        let slot = self.u32("stream slot")?;
        let generation = self.u32("stream generation")?;
        Ok(StreamId::new(slot, generation))
    }

    fn array16(&mut self, field: &'static str) -> Result<[u8; 16], WireError> {
        let end = self.pos.checked_add(16);
        let bytes = end.and_then(|end| self.buf.get(self.pos..end));
        let Some(arr) = bytes.and_then(|b| <[u8; 16]>::try_from(b).ok()) else {
            return Err(WireError::Truncated {
                record: self.record,
                field,
            });
        };
        self.pos += 16;
        Ok(arr)
    }

    /// A length-prefixed byte string, returned as a zero-copy slice of `whole`.
    #[inline]
    fn blob(&mut self, whole: &Bytes, field: &'static str) -> Result<Bytes, WireError> {
        let len = self.u32(field)?;
        let start = self.pos;
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| start.checked_add(len));
        match end {
            Some(end) if end <= self.buf.len() => {
                self.pos = end;
                Ok(whole.slice(start..end))
            }
            _ => Err(WireError::Truncated {
                record: self.record,
                field,
            }),
        }
    }
}
