//! The adapter between velo-bench's mock engines (Dynamo's mocker timing model) and the
//! response plane: a request off the request plane opens its response stream, and every
//! token the engine emits goes out as a Dynamo `NetworkStreamWrapper<Annotated<LLMEngineOutput>>`,
//! the last one with its finish reason and usage, then the `complete_final` marker.
//!
//! The engine frees a request's slot when a send fails (the frontend killed the stream: its
//! client went away) or after the last token; [`WorkerStats::running`] counts the slots held.
//! A request's sink also keeps the request's frame as the request plane delivered it, which
//! holds the request's place among the worker's `max_requests` ([`crate::work::serve`]): the
//! place is given back with the slot, or at once when the request is refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use bytes::Bytes;
use response_plane::{ResponseSender, WorkerPlane};
use velo_bench::adapter::{BenchSink, BenchWorker};
use velo_bench::item::EngineOutput;
use velo_bench::reqplane::Request;

use crate::wire::{CompletionUsage, FinishReason, LLMEngineOutput, OutputType, StreamItem};
use crate::work::{WireEnding, WorkRequest};

/// What a worker's engines are doing, counted as it happens.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Requests holding an engine slot (queued or generating) right now.
    pub running: AtomicU64,
    /// Requests whose stream opened.
    pub admitted: AtomicU64,
    /// Requests that generated every token and ended cleanly.
    pub completed: AtomicU64,
    /// Requests the frontend killed (its client went away), seen by the engine.
    pub cancelled: AtomicU64,
    /// Requests that could not be served (bad request, stream setup failed).
    pub refused: AtomicU64,
}

impl WorkerStats {
    /// A snapshot: (running, admitted, completed, cancelled, refused).
    pub fn snapshot(&self) -> [u64; 5] {
        [
            self.running.load(Ordering::Acquire),
            self.admitted.load(Ordering::Relaxed),
            self.completed.load(Ordering::Relaxed),
            self.cancelled.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        ]
    }
}

/// The plane side of a worker's engines.
pub struct ServeEngine {
    plane: WorkerPlane,
    stats: Arc<WorkerStats>,
    next_engine: AtomicU32,
}

impl ServeEngine {
    /// Engines that answer on `plane`, counting into `stats`.
    pub fn new(plane: WorkerPlane, stats: Arc<WorkerStats>) -> Self {
        Self {
            plane,
            stats,
            next_engine: AtomicU32::new(0),
        }
    }

    async fn open_request(&self, raw: Bytes) -> Result<(Request, ServeSink), String> {
        let work = WorkRequest::decode(&raw).map_err(|e| format!("bad request: {e}"))?;
        let mut sender = self
            .plane
            .connect::<StreamItem>(&work.info)
            .await
            .map_err(|e| e.to_string())?;
        sender
            .send_prologue(Ok(()))
            .await
            .map_err(|e| e.to_string())?;
        let request = Request {
            id: work.id,
            // Engines take requests in turn.
            worker: self.next_engine.fetch_add(1, Ordering::Relaxed),
            isl: work.prompt_tokens,
            osl: work.output_tokens.max(1),
            info: String::new(),
        };
        self.stats.admitted.fetch_add(1, Ordering::Relaxed);
        let sink = ServeSink {
            sender,
            ending: work.ending,
            prompt_tokens: work.prompt_tokens,
            generated: 0,
            stats: self.stats.clone(),
            _slot: Slot::take(&self.stats),
            _request: raw,
        };
        Ok((request, sink))
    }
}

impl BenchWorker for ServeEngine {
    type Sink = ServeSink;

    async fn open(&self, request: Bytes) -> Result<(Request, ServeSink), String> {
        let r = self.open_request(request).await;
        if r.is_err() {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn flush(&self) {
        self.plane.flush();
    }
}

/// One request's response stream, as the engine writes it.
pub struct ServeSink {
    sender: ResponseSender<StreamItem>,
    ending: WireEnding,
    prompt_tokens: u32,
    generated: u32,
    stats: Arc<WorkerStats>,
    _slot: Slot,
    /// The request as read: holding it holds the request's place on the request plane.
    _request: Bytes,
}

impl ServeSink {
    fn output(&self, item: &EngineOutput) -> LLMEngineOutput {
        let finish_reason = item.finish_reason.as_ref().map(|_| match self.ending {
            WireEnding::Eos => FinishReason::EoS,
            WireEnding::Length => FinishReason::Length,
        });
        let completion_usage = finish_reason
            .is_some()
            .then(|| CompletionUsage::new(self.prompt_tokens, self.generated));
        LLMEngineOutput {
            token_ids: item.token_ids.clone(),
            tokens: None,
            text: item.text.clone(),
            output_type: OutputType::Text,
            cum_log_probs: item.cum_log_probs,
            log_probs: None,
            top_logprobs: None,
            finish_reason,
            index: Some(0),
            completion_usage,
        }
    }
}

impl BenchSink for ServeSink {
    async fn send(&mut self, item: &EngineOutput) -> Result<(), String> {
        self.generated = self.generated.saturating_add(1);
        let out = StreamItem::output(self.output(item));
        self.sender.send(&out).await.map_err(|e| {
            if e.is_cancelled() {
                self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            e.to_string()
        })
    }

    async fn finish(self) -> Result<(), String> {
        let Self {
            mut sender,
            stats,
            _slot,
            _request,
            ..
        } = self;
        sender
            .send(&StreamItem::complete_final())
            .await
            .map_err(|e| e.to_string())?;
        sender.finish().await.map_err(|e| e.to_string())?;
        stats.completed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// An engine slot held: counted in [`WorkerStats::running`] until dropped (the engine drops a
/// request's sink when it is done with it, finished or failed).
struct Slot(Arc<WorkerStats>);

impl Slot {
    fn take(stats: &Arc<WorkerStats>) -> Self {
        stats.running.fetch_add(1, Ordering::AcqRel);
        Self(stats.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}
