//! What the `mux` fuzz target knows about each stream, and the checks it makes against it:
//! every item arrives at most once, in order and intact; each side sees a stream end at most
//! once; a stream that finished delivered everything.
//!
//! Records injected by the fuzzer (peer bytes the worker never sent) *taint* what they may
//! reach: a structured record taints the stream it names, frame or raw bytes taint every
//! stream. Content checks skip tainted streams; the end and bound checks never do.

use std::collections::BTreeMap;

use velo_wire::StreamId;

use crate::{Mux, StreamEnd, StreamKey};

/// One stream, as both applications saw it.
#[derive(Debug, Default)]
pub(crate) struct StreamModel {
    /// The worker's key while it holds the stream.
    pub(crate) worker: Option<StreamKey>,
    /// The frontend's key while it holds the stream.
    pub(crate) frontend: Option<StreamKey>,
    pub(crate) ticket: u64,
    pub(crate) prologue: Vec<u8>,
    /// Items the worker's mux took, in order.
    pub(crate) sent: Vec<Vec<u8>>,
    /// Items the frontend read.
    pub(crate) delivered: usize,
    /// Ends seen by the frontend application (at most one).
    pub(crate) frontend_ends: u32,
    /// The end the frontend application read.
    pub(crate) frontend_end: Option<StreamEnd>,
    /// Ends on the worker side: its own finish or reset, or a `Closed` event (at most one).
    pub(crate) worker_ends: u32,
    /// The worker ended it itself (finish, reset, release while live).
    pub(crate) self_ended: bool,
    /// Whether that end was delivered, as the worker was told (`Accepted` or `Closed` after
    /// its own end): at most once.
    pub(crate) delivery_told: u32,
    /// `Accepted` events for it: at most one.
    pub(crate) accepted_told: u32,
    /// The frontend was given the stream once (its OPEN was accepted).
    pub(crate) accepted: bool,
    /// Injected records may have reached it: content checks are off.
    pub(crate) tainted: bool,
}

/// Every stream of a fuzz run, by index in opening order.
#[derive(Debug, Default)]
pub(crate) struct Model {
    pub(crate) streams: Vec<StreamModel>,
    by_worker_key: BTreeMap<StreamKey, usize>,
    by_ticket: BTreeMap<u64, usize>,
    /// Frame or raw bytes were injected: every stream is tainted, now and later.
    pub(crate) all_tainted: bool,
    last_ticket: u64,
}

impl Model {
    /// A fresh ticket (never 0: injected OPENs carry 0).
    pub(crate) fn next_ticket(&mut self) -> u64 {
        self.last_ticket += 1;
        self.last_ticket
    }

    pub(crate) fn opened(&mut self, key: StreamKey, ticket: u64, prologue: Vec<u8>) {
        let i = self.streams.len();
        self.streams.push(StreamModel {
            worker: Some(key),
            ticket,
            prologue,
            tainted: self.all_tainted,
            ..StreamModel::default()
        });
        self.by_worker_key.insert(key, i);
        self.by_ticket.insert(ticket, i);
    }

    /// The stream the fuzzer names by `pick`, among those the worker holds.
    pub(crate) fn worker_stream(&self, pick: u8) -> Option<(usize, StreamKey)> {
        let held: Vec<(usize, StreamKey)> = self
            .streams
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.worker.map(|k| (i, k)))
            .collect();
        held.get(usize::from(pick) % held.len().max(1)).copied()
    }

    /// The stream the fuzzer names by `pick`, among those the frontend holds.
    pub(crate) fn frontend_stream(&self, pick: u8) -> Option<(usize, StreamKey)> {
        let held: Vec<(usize, StreamKey)> = self
            .streams
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.frontend.map(|k| (i, k)))
            .collect();
        held.get(usize::from(pick) % held.len().max(1)).copied()
    }

    /// The wire id of the stream `pick` names among those the worker holds.
    pub(crate) fn wire_id(&self, pick: u8, worker: &Mux) -> Option<(usize, StreamId)> {
        let (i, key) = self.worker_stream(pick)?;
        Some((i, worker.stream_wire_id(key)?))
    }

    /// Item number `n` of stream `i`, about `len` bytes: unique, so a misdelivery shows.
    pub(crate) fn next_item(&self, i: usize, len: usize) -> Vec<u8> {
        let s = &self.streams[i];
        let mut item = format!("{}:{}:", s.ticket, s.sent.len()).into_bytes();
        item.resize(item.len().max(len), b'x');
        item
    }

    pub(crate) fn sent(&mut self, i: usize, item: Vec<u8>) {
        self.streams[i].sent.push(item);
    }

    pub(crate) fn taint(&mut self, i: usize) {
        self.streams[i].tainted = true;
    }

    pub(crate) fn taint_all(&mut self) {
        self.all_tainted = true;
        for s in &mut self.streams {
            s.tainted = true;
        }
    }

    /// The frontend application got an OPEN: whether it keeps the stream.
    pub(crate) fn accept(&mut self, key: StreamKey, ticket: u64, prologue: &[u8]) -> bool {
        let Some(&i) = self.by_ticket.get(&ticket) else {
            return false;
        };
        let s = &mut self.streams[i];
        if s.accepted {
            return false;
        }
        if !s.tainted {
            assert_eq!(
                s.prologue, prologue,
                "stream {i}: the prologue changed on the way"
            );
        }
        s.accepted = true;
        s.frontend = Some(key);
        true
    }

    /// The frontend application read an item.
    pub(crate) fn delivered(&mut self, i: usize, item: &[u8]) {
        let s = &mut self.streams[i];
        assert!(
            s.frontend_ends == 0,
            "stream {i}: an item was read after the stream's end"
        );
        if !s.tainted {
            let expected = s.sent.get(s.delivered).unwrap_or_else(|| {
                panic!(
                    "stream {i}: item {} read, but only {} sent",
                    s.delivered,
                    s.sent.len()
                )
            });
            assert!(
                expected.as_slice() == item,
                "stream {i}: item {} is not what was sent",
                s.delivered
            );
        }
        s.delivered += 1;
    }

    /// The frontend application read the end.
    pub(crate) fn frontend_end(&mut self, i: usize, end: &StreamEnd) {
        let s = &mut self.streams[i];
        s.frontend_ends += 1;
        assert!(
            s.frontend_ends == 1,
            "stream {i}: a second end ({end}) was read"
        );
        if *end == StreamEnd::Finished && !s.tainted {
            assert_eq!(
                s.delivered,
                s.sent.len(),
                "stream {i}: finished with items missing"
            );
        }
        s.frontend_end = Some(end.clone());
    }

    /// The worker ended the stream itself (finish, reset, or release of a live stream).
    pub(crate) fn worker_ended(&mut self, i: usize) {
        let s = &mut self.streams[i];
        s.worker_ends += 1;
        s.self_ended = true;
        assert!(s.worker_ends == 1, "stream {i}: ended twice on the worker");
    }

    /// The worker's mux reported the stream closed by the frontend or its lane: its end, or,
    /// for a stream it had ended itself, that the end was not delivered (at most once, and
    /// never after `Accepted`).
    pub(crate) fn worker_closed(&mut self, key: StreamKey) {
        let i = self.worker_index(key, "Closed");
        let s = &mut self.streams[i];
        if s.self_ended {
            s.delivery_told += 1;
            assert!(
                s.delivery_told == 1,
                "stream {i}: told twice whether its end was delivered"
            );
            return;
        }
        s.worker_ends += 1;
        assert!(s.worker_ends == 1, "stream {i}: ended twice on the worker");
    }

    /// The worker's mux said the frontend took the stream: at most once, and for a stream
    /// the worker had ended, instead of a `Closed` saying its end was not delivered.
    pub(crate) fn worker_accepted(&mut self, key: StreamKey) {
        let i = self.worker_index(key, "Accepted");
        let s = &mut self.streams[i];
        s.accepted_told += 1;
        assert!(s.accepted_told == 1, "stream {i}: accepted twice");
        if s.self_ended {
            s.delivery_told += 1;
            assert!(
                s.delivery_told == 1,
                "stream {i}: told twice whether its end was delivered"
            );
        }
    }

    fn worker_index(&self, key: StreamKey, event: &str) -> usize {
        *self
            .by_worker_key
            .get(&key)
            .unwrap_or_else(|| panic!("{event} for {key:?}, which the worker does not hold"))
    }

    pub(crate) fn worker_released(&mut self, i: usize) {
        if let Some(key) = self.streams[i].worker.take() {
            self.by_worker_key.remove(&key);
        }
    }

    pub(crate) fn frontend_released(&mut self, i: usize) {
        self.streams[i].frontend = None;
    }
}
