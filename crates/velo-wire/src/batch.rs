//! BATCH: a frame carrying records of many streams.

use bytes::{BufMut, Bytes};

use crate::{Record, StreamId, WireError};

/// A received batch frame body.
///
/// Construction only checks that the body is not empty; records are validated as they are
/// iterated, so a receiver decodes each byte once. Iteration stops at the first error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    body: Bytes,
}

impl Batch {
    /// Wraps a received body.
    ///
    /// # Errors
    ///
    /// [`WireError::EmptyBatch`] if `body` is empty.
    pub fn new(body: Bytes) -> Result<Self, WireError> {
        if body.is_empty() {
            return Err(WireError::EmptyBatch);
        }
        Ok(Self { body })
    }

    /// Builds a batch from records (for tests and tools; the mux encodes in place instead).
    ///
    /// # Panics
    ///
    /// If `records` is empty.
    pub fn from_records(records: &[Record]) -> Self {
        assert!(!records.is_empty(), "a batch carries at least one record");
        let mut body = Vec::with_capacity(records.iter().map(Record::encoded_len).sum());
        for r in records {
            r.encode(&mut body);
        }
        Self {
            body: Bytes::from(body),
        }
    }

    /// The raw body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The records, decoded lazily; payloads are zero-copy slices of the body.
    pub fn records(&self) -> Records<'_> {
        self.records_copying_below(0)
    }

    /// The records, decoded lazily; a `Data` or `Final` payload shorter than `limit` bytes is
    /// copied into an allocation of its own (so it does not keep the body alive), longer ones
    /// are slices of the body.
    ///
    /// Copying while decoding costs one allocation per small payload; slicing first and
    /// copying afterwards would also touch the body's shared reference count twice.
    pub fn records_copying_below(&self, limit: usize) -> Records<'_> {
        Records {
            body: &self.body,
            pos: 0,
            failed: false,
            copy_below: limit,
        }
    }

    /// The records, decoded lazily, with each DATA payload left in the body: a receiver that
    /// copies payloads where it keeps them (the mux, into each stream's own buffer) touches
    /// no shared reference count per record. Other records are decoded as by
    /// [`records`](Self::records).
    pub fn record_views(&self) -> RecordViews<'_> {
        RecordViews {
            body: &self.body,
            pos: 0,
            failed: false,
        }
    }

    /// Appends the body to `dst`.
    pub fn encode_body(&self, dst: &mut impl BufMut) {
        dst.put_slice(&self.body);
    }
}

/// Iterator over a batch's records; yields `Err` at most once, then ends.
#[derive(Debug)]
pub struct Records<'a> {
    body: &'a Bytes,
    pos: usize,
    failed: bool,
    /// Payloads shorter than this are copied, not sliced.
    copy_below: usize,
}

impl Records<'_> {
    /// Byte offset of the next record within the batch body.
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl Iterator for Records<'_> {
    type Item = Result<Record, WireError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.body.len() {
            return None;
        }
        // Nearly every record is a DATA record with small fields: decode those inline.
        if let Some(r) = crate::record::decode_data_fast(self.body, &mut self.pos, self.copy_below)
        {
            return Some(Ok(r));
        }
        let r = Record::decode(self.body, &mut self.pos);
        self.failed = r.is_err();
        Some(r.map(|r| r.owning_payload_below(self.copy_below)))
    }
}

/// A record as [`Batch::record_views`] yields it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordView<'a> {
    /// A DATA record whose payload is still in the batch body.
    Data {
        /// The opener's stream id.
        stream: StreamId,
        /// The item's sequence number.
        seq: u32,
        /// The item, borrowed from the body.
        payload: &'a [u8],
    },
    /// Any other record (a DATA record with a field too wide for the inline decoder among
    /// them), as [`Batch::records`] decodes it.
    Decoded(Record),
}

/// Iterator over a batch's records as views; yields `Err` at most once, then ends.
#[derive(Debug)]
pub struct RecordViews<'a> {
    body: &'a Bytes,
    pos: usize,
    failed: bool,
}

impl<'a> Iterator for RecordViews<'a> {
    type Item = Result<RecordView<'a>, WireError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.body.len() {
            return None;
        }
        let body: &'a Bytes = self.body;
        if let Some((stream, seq, range)) = crate::record::data_view_fast(body, &mut self.pos)
            && let Some(payload) = body.get(range)
        {
            return Some(Ok(RecordView::Data {
                stream,
                seq,
                payload,
            }));
        }
        let r = Record::decode(body, &mut self.pos);
        self.failed = r.is_err();
        Some(r.map(RecordView::Decoded))
    }
}
