//! BATCH: a frame carrying records of many streams.

use bytes::{BufMut, Bytes};

use crate::{Record, WireError};

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

    /// The records, decoded lazily.
    pub fn records(&self) -> Records<'_> {
        Records {
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
        if let Some(r) = crate::record::decode_data_fast(self.body, &mut self.pos) {
            return Some(Ok(r));
        }
        let r = Record::decode(self.body, &mut self.pos);
        self.failed = r.is_err();
        Some(r)
    }
}
