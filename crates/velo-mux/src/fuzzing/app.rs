//! The applications on either side of the `mux` fuzz target: a worker engine that opens,
//! sends, finishes and drops streams, and a frontend consumer that reads, stops, cancels and
//! drops them, and accepts or refuses every OPEN as `velo-session`'s acceptor does.

use bytes::Bytes;
use velo_wire::{CancelCode, Token};

use super::ops::Who;
use super::world::{BIG_ITEM, World};
use crate::{MuxEvent, OpenError, Recv, SendError, StreamKey};

/// Prologue of a fuzz stream that is neither empty nor chained.
const PROLOGUE: &[u8] = br#"{"error":null}"#;

/// Most items one `Send` operation sends.
const MAX_SENDS_PER_OP: u8 = 16;

/// Most frontend cancel codes the fuzzer picks from (0..=4 are defined, 5 is not).
const CANCEL_CODES: u8 = 6;

impl World {
    pub(super) fn open(&mut self, prologue: u8) {
        let prologue: Vec<u8> = match prologue {
            0 => Vec::new(),
            255 => vec![b' '; BIG_ITEM],
            _ => PROLOGUE.to_vec(),
        };
        let ticket = self.model.next_ticket();
        match self
            .worker
            .open(self.now, ticket, &Token([7; 16]), &prologue)
        {
            Ok(key) => self.model.opened(key, ticket, prologue),
            Err(
                OpenError::NoLane
                | OpenError::TooManyStreams(_)
                | OpenError::GoingAway(_)
                | OpenError::LaneFull,
            ) => {}
            Err(e) => panic!("open failed for a valid call: {e}"),
        }
    }

    pub(super) fn send(&mut self, stream: u8, n: u8, len: u8) {
        let Some((i, key)) = self.model.worker_stream(stream) else {
            return;
        };
        for _ in 0..n % MAX_SENDS_PER_OP + 1 {
            let payload = self.model.next_item(i, usize::from(len));
            match self.worker.send(self.now, key, &payload) {
                Ok(()) => self.model.sent(i, payload),
                Err(SendError::WouldBlock(_) | SendError::Closed(_)) => break,
                Err(e) => panic!("send failed for a valid call: {e}"),
            }
        }
    }

    pub(super) fn send_big(&mut self, stream: u8) {
        let Some((i, key)) = self.model.worker_stream(stream) else {
            return;
        };
        let payload = self.model.next_item(i, BIG_ITEM);
        match self
            .worker
            .send_bytes(self.now, key, Bytes::from(payload.clone()))
        {
            Ok(()) => self.model.sent(i, payload),
            Err(SendError::WouldBlock(_) | SendError::Closed(_)) => {}
            Err(e) => panic!("send_bytes failed for a valid call: {e}"),
        }
    }

    pub(super) fn finish(&mut self, stream: u8, len: u8) {
        let Some((i, key)) = self.model.worker_stream(stream) else {
            return;
        };
        let payload = match len {
            0 => Vec::new(),
            255 => self.model.next_item(i, BIG_ITEM),
            _ => self.model.next_item(i, usize::from(len)),
        };
        match self
            .worker
            .finish(self.now, key, Bytes::from(payload.clone()))
        {
            Ok(()) => {
                if !payload.is_empty() {
                    self.model.sent(i, payload);
                }
                self.model.worker_ended(i);
            }
            Err(SendError::WouldBlock(_) | SendError::Closed(_)) => {}
            Err(e) => panic!("finish failed for a valid call: {e}"),
        }
    }

    pub(super) fn reset(&mut self, stream: u8) {
        let Some((i, key)) = self.model.worker_stream(stream) else {
            return;
        };
        match self
            .worker
            .reset(self.now, key, velo_wire::ErrorCode(7), "engine failed")
        {
            Ok(()) => self.model.worker_ended(i),
            Err(SendError::Closed(_)) => {}
            Err(e) => panic!("reset failed for a valid call: {e}"),
        }
    }

    /// Frontend: reads up to `max` items or the end of one stream.
    pub(super) fn read(&mut self, stream: u8, max: usize) {
        let Some((i, key)) = self.model.frontend_stream(stream) else {
            return;
        };
        for _ in 0..max {
            match self.frontend.recv(self.now, key) {
                Some(Recv::Item(item)) => self.model.delivered(i, &item),
                Some(Recv::End(end)) => self.model.frontend_end(i, &end),
                None => break,
            }
        }
    }

    pub(super) fn read_all(&mut self, stream: u8) {
        let Some((i, key)) = self.model.frontend_stream(stream) else {
            return;
        };
        self.read_all_of(i, key);
    }

    /// Frontend: `recv_all` on one stream; returns whether anything was read.
    pub(super) fn read_all_of(&mut self, i: usize, key: StreamKey) -> bool {
        let mut items = crate::ItemQueue::new();
        let end = self.frontend.recv_all(self.now, key, &mut items).flatten();
        let read = !items.is_empty() || end.is_some();
        while let Some(item) = items.pop() {
            self.model.delivered(i, item);
        }
        self.frontend.give_queue(items);
        if let Some(end) = end {
            self.model.frontend_end(i, &end);
        }
        read
    }

    pub(super) fn stop(&mut self, stream: u8) {
        if let Some((_, key)) = self.model.frontend_stream(stream) {
            self.frontend.stop(self.now, key);
        }
    }

    pub(super) fn cancel(&mut self, stream: u8, code: u8) {
        if let Some((_, key)) = self.model.frontend_stream(stream) {
            let code = CancelCode(u32::from(code % CANCEL_CODES));
            self.frontend.cancel(self.now, key, code);
        }
    }

    pub(super) fn release(&mut self, who: Who, stream: u8) {
        let now = self.now;
        match who {
            Who::Worker => {
                let Some((i, key)) = self.model.worker_stream(stream) else {
                    return;
                };
                if self.worker.stream_state(key).is_some_and(|s| s.is_live()) {
                    // Dropping a live sender resets the stream: a local end.
                    self.model.worker_ended(i);
                }
                self.worker.release(now, key);
                self.model.worker_released(i);
            }
            Who::Frontend => {
                let Some((i, key)) = self.model.frontend_stream(stream) else {
                    return;
                };
                self.frontend.release(now, key);
                self.model.frontend_released(i);
            }
        }
    }

    /// Drains both sides' events into the model, checking their bound first. Opened streams
    /// are accepted when their ticket is one the worker opened and not yet seen, refused
    /// (CANCEL `refused`, then released) otherwise.
    pub(crate) fn absorb(&mut self) {
        super::bounds::check_event_queue(&self.worker);
        super::bounds::check_event_queue(&self.frontend);
        while let Some(event) = self.worker.poll_event() {
            match event {
                MuxEvent::Closed { stream, .. } => self.model.worker_closed(stream),
                MuxEvent::Accepted(stream) => self.model.worker_accepted(stream),
                _ => {}
            }
        }
        while let Some(event) = self.frontend.poll_event() {
            if let MuxEvent::Opened {
                stream,
                ticket,
                prologue,
                ..
            } = event
            {
                let now = self.now;
                if self.model.accept(stream, ticket, &prologue) {
                    self.frontend.accept_stream(now, stream);
                } else {
                    self.frontend.cancel(now, stream, CancelCode::REFUSED);
                    self.frontend.release(now, stream);
                    super::bounds::check_event_queue(&self.frontend);
                }
            }
        }
    }
}
