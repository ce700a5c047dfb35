//! Turning a worker's stream into the HTTP answer.
//!
//! Streaming: a pump task per request reads the worker's items as they come (so the worker's
//! engine never waits on this client), shapes each into an SSE event and queues it for the
//! HTTP body, at most [`CLIENT_BUFFER_EVENTS`] ahead of the client; a client that falls further
//! behind, or disconnects, gets its stream killed (the worker's engine sees the kill and frees
//! the slot). A worker error, a lost stream, or a worker removed from discovery whose grace ran
//! out end the answer with an SSE error event (no `[DONE]`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use super::State;
use super::admission::Turn;
use super::dispatch::{CLIENT_DRAIN_TIMEOUT, Dispatched};
use super::metrics::{FrontendMetrics, Outcome};
use crate::openai::{ApiError, Job, Shaper, chunk};
use crate::wire::{CompletionUsage, FinishReason, StreamItem};

/// SSE events queued for a client that reads slower than its tokens arrive; past it the
/// stream is killed.
pub const CLIENT_BUFFER_EVENTS: usize = 1024;

/// Bytes of text a worker may send per token it generated, over a whole answer: ten times
/// the longest token of common vocabularies. More is a broken worker, cut off (a unary answer
/// collects its text: with the request's token limit this bounds it in bytes).
pub const MAX_TEXT_BYTES_PER_TOKEN: usize = 1024;

/// What one request has seen so far.
struct Progress {
    started: Instant,
    last: Option<Instant>,
    /// The tokens the request asked for at most: a worker that sends more is broken, and is
    /// cut off (a unary answer collects its text: this bounds it).
    limit: u32,
    /// Tokens received from the worker.
    tokens: u32,
    /// Tokens handed to the client (counted in `output_tokens_total`).
    delivered: u32,
    /// Text received so far, in bytes.
    text_bytes: usize,
    usage: Option<CompletionUsage>,
    finish: Option<&'static str>,
    complete: bool,
}

impl Progress {
    fn new(started: Instant, limit: u32) -> Self {
        Self {
            started,
            last: None,
            limit,
            tokens: 0,
            delivered: 0,
            text_bytes: 0,
            usage: None,
            finish: None,
            complete: false,
        }
    }

    /// Takes one item: `Ok(Some(text))` for a token, `Ok(None)` for nothing to send, `Err`
    /// for an engine error.
    fn take(&mut self, item: StreamItem, m: &FrontendMetrics) -> Result<Option<String>, ApiError> {
        if item.complete_final {
            self.complete = true;
            return Ok(None);
        }
        let Some(annotated) = item.data else {
            return Ok(None);
        };
        if let Some(message) = annotated.error_message() {
            return Err(engine_error(message));
        }
        let Some(out) = annotated.data else {
            return Ok(None);
        };
        if let Some(FinishReason::Error(message)) = &out.finish_reason {
            return Err(engine_error(message.clone()));
        }
        let now = Instant::now();
        match self.last {
            None => FrontendMetrics::seconds(&m.ttft, now - self.started),
            Some(last) => FrontendMetrics::seconds(&m.itl, now - last),
        }
        self.last = Some(now);
        let n = u32::try_from(out.token_ids.len()).unwrap_or(u32::MAX);
        self.tokens = self.tokens.saturating_add(n);
        if self.tokens > self.limit {
            return Err(ApiError::internal(
                StatusCode::BAD_GATEWAY,
                format!(
                    "the worker sent {} tokens for a request of at most {}",
                    self.tokens, self.limit
                ),
            ));
        }
        self.finish = out.finish_reason.as_ref().and_then(FinishReason::openai);
        if out.completion_usage.is_some() {
            self.usage = out.completion_usage;
        }
        let text = out.text.unwrap_or_default();
        self.text_bytes = self.text_bytes.saturating_add(text.len());
        let allowed = usize::try_from(self.tokens.max(1))
            .unwrap_or(usize::MAX)
            .saturating_mul(MAX_TEXT_BYTES_PER_TOKEN);
        if self.text_bytes > allowed {
            return Err(ApiError::internal(
                StatusCode::BAD_GATEWAY,
                format!(
                    "the worker sent {} bytes of text for {} tokens (at most {MAX_TEXT_BYTES_PER_TOKEN} per token)",
                    self.text_bytes, self.tokens
                ),
            ));
        }
        Ok(Some(text))
    }

    /// Counts every token received so far as handed to the client: call it once their text
    /// is queued for the client (streamed) or in the answer (unary), never before.
    fn delivered(&mut self, m: &FrontendMetrics) {
        let n = self.tokens.saturating_sub(self.delivered);
        m.output_tokens.fetch_add(u64::from(n), Ordering::Relaxed);
        self.delivered = self.tokens;
    }

    fn usage(&self, job: &Job) -> CompletionUsage {
        self.usage
            .unwrap_or_else(|| CompletionUsage::new(job.prompt_tokens, self.tokens))
    }
}

fn engine_error(message: String) -> ApiError {
    ApiError::internal(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("engine error: {message}"),
    )
}

/// A lost stream as the client sees it.
fn lost(e: &response_plane::ResponseError) -> ApiError {
    ApiError::internal(
        StatusCode::BAD_GATEWAY,
        format!("the worker's stream failed: {e}"),
    )
}

/// The stream's next item, or a 504 naming the bound when none came within `item_timeout`
/// (the caller kills the stream). Cancel-safe: `next` keeps an item it has not returned.
async fn next_within(
    stream: &mut response_plane::ResponseStream<StreamItem>,
    item_timeout: std::time::Duration,
) -> Result<Option<Result<StreamItem, response_plane::ResponseError>>, ApiError> {
    tokio::time::timeout(item_timeout, stream.next())
        .await
        .map_err(|_| {
            ApiError::internal(
                StatusCode::GATEWAY_TIMEOUT,
                format!("the worker sent nothing for {item_timeout:?} (item_timeout)"),
            )
        })
}

/// Starts streaming `dispatched` to the client as SSE.
pub fn stream(
    state: &State,
    job: Job,
    id: &str,
    dispatched: Dispatched,
    turn: Turn,
    account: Accounting,
) -> Response {
    let (tx, mut rx) = mpsc::channel::<Bytes>(CLIENT_BUFFER_EVENTS);
    let shaper = Shaper::new(&job, id);
    state.tracker.spawn(pump(
        state.clone(),
        job,
        shaper,
        dispatched,
        (turn, account),
        tx,
    ));
    let body = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|o| o.map(Ok::<_, std::convert::Infallible>))
    });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// How a streamed answer ended.
enum End {
    Complete,
    Failed(ApiError),
    ClientGone,
    SlowClient,
}

async fn pump(
    state: State,
    job: Job,
    mut shaper: Shaper,
    dispatched: Dispatched,
    (_turn, mut account): (Turn, Accounting),
    tx: mpsc::Sender<Bytes>,
) {
    let Dispatched { mut stream, worker } = dispatched;
    let m = &state.metrics;
    let mut progress = Progress::new(account.started, job.output_tokens);
    let end = loop {
        // Cancel safety: `next` on the stream loses no item when another branch wins (the
        // stream keeps it); the others only wait.
        let next = tokio::select! {
            biased;
            () = tx.closed() => break End::ClientGone,
            () = worker.0.gone.cancelled() => {
                break End::Failed(ApiError::internal(StatusCode::BAD_GATEWAY, "the worker left discovery and did not finish in time"));
            }
            next = next_within(&mut stream, state.config.item_timeout) => match next {
                Ok(next) => next,
                Err(e) => break End::Failed(e),
            },
        };
        let item = match next {
            None if progress.complete => break End::Complete,
            None => {
                break End::Failed(ApiError::internal(
                    StatusCode::BAD_GATEWAY,
                    "stream ended before generation completed",
                ));
            }
            Some(Err(e)) => break End::Failed(lost(&e)),
            Some(Ok(item)) => item,
        };
        match progress.take(item, m) {
            Err(e) => break End::Failed(e),
            Ok(None) => {}
            Ok(Some(text)) => match tx.try_send(shaper.token(&text, progress.finish)) {
                Ok(()) => progress.delivered(m),
                Err(mpsc::error::TrySendError::Full(_)) => break End::SlowClient,
                Err(mpsc::error::TrySendError::Closed(_)) => break End::ClientGone,
            },
        }
    };
    account.outcome = conclude(
        end,
        &job,
        &shaper,
        &progress,
        &mut stream,
        &tx,
        &state.metrics,
    )
    .await;
    account.tokens = progress.tokens;
}

/// Ends the answer as `end` says and returns the request's outcome, `None` when its client
/// went away (see [`Accounting::outcome`]): the usage chunk and `[DONE]` after a complete
/// stream (a success only once the client has them queued), an error event after a failed
/// one (the worker's stream is killed), nothing to a client that is gone or too slow (killed
/// too).
async fn conclude(
    end: End,
    job: &Job,
    shaper: &Shaper,
    progress: &Progress,
    stream: &mut response_plane::ResponseStream<StreamItem>,
    tx: &mpsc::Sender<Bytes>,
    m: &FrontendMetrics,
) -> Option<Outcome> {
    match end {
        End::Complete => {
            let usage = shaper.usage(progress.usage(job));
            for b in usage.into_iter().chain([Bytes::from_static(chunk::DONE)]) {
                match tokio::time::timeout(CLIENT_DRAIN_TIMEOUT, tx.send(b)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return None,
                    Err(_) => {
                        m.slow_clients.fetch_add(1, Ordering::Relaxed);
                        return Some(Outcome::Cancelled);
                    }
                }
            }
            Some(Outcome::Success)
        }
        End::Failed(e) => {
            tracing::debug!(error = %e, "stream failed");
            stream.kill();
            let _ = tokio::time::timeout(CLIENT_DRAIN_TIMEOUT, tx.send(Shaper::error(&e))).await;
            Some(Outcome::Internal)
        }
        End::ClientGone => {
            stream.kill();
            None
        }
        End::SlowClient => {
            stream.kill();
            m.slow_clients.fetch_add(1, Ordering::Relaxed);
            Some(Outcome::Cancelled)
        }
    }
}

/// Counts a request in flight from admission on, and when it ends (however: a dropped
/// handler is a client that went away) records its outcome and, if it reached a worker, its
/// duration and sizes.
pub struct Accounting {
    state: State,
    endpoint: crate::openai::Endpoint,
    streaming: bool,
    prompt_tokens: u32,
    started: Instant,
    dispatched: bool,
    /// How it ended. `None` (a request dropped, or ended, before saying so) means its client
    /// went away: it counts as cancelled and as a disconnected client.
    pub outcome: Option<Outcome>,
    /// Tokens received from the worker (the answer's length).
    pub tokens: u32,
}

impl Accounting {
    /// Counts `job` in flight.
    pub fn new(state: &State, job: &Job, started: Instant) -> Self {
        state.metrics.inflight.fetch_add(1, Ordering::Relaxed);
        Self {
            state: state.clone(),
            endpoint: job.endpoint,
            streaming: job.stream,
            prompt_tokens: job.prompt_tokens,
            started,
            dispatched: false,
            outcome: None,
            tokens: 0,
        }
    }

    /// Notes that the request reached a worker: only such requests have a duration, a
    /// prompt and an answer worth the histograms.
    pub fn dispatched(&mut self) {
        self.dispatched = true;
    }
}

impl Drop for Accounting {
    fn drop(&mut self) {
        let m = &self.state.metrics;
        let outcome = self.outcome.unwrap_or_else(|| {
            m.disconnected.fetch_add(1, Ordering::Relaxed);
            Outcome::Cancelled
        });
        m.request(self.endpoint, self.streaming, outcome);
        m.inflight.fetch_sub(1, Ordering::Relaxed);
        if self.dispatched {
            FrontendMetrics::seconds(&m.duration, self.started.elapsed());
            m.isl.observe(f64::from(self.prompt_tokens));
            m.osl.observe(f64::from(self.tokens));
        }
    }
}

/// Collects the whole answer and sends it as one object. A client that disconnects drops this
/// future, and with it the stream (killed).
pub async fn unary(
    state: &State,
    job: Job,
    id: &str,
    dispatched: Dispatched,
    mut account: Accounting,
) -> Response {
    let Dispatched { mut stream, worker } = dispatched;
    let m = &state.metrics;
    let mut progress = Progress::new(account.started, job.output_tokens);
    let mut text = String::new();
    let result = loop {
        let next = tokio::select! {
            biased;
            () = worker.0.gone.cancelled() => {
                stream.kill();
                break Err(ApiError::internal(StatusCode::BAD_GATEWAY, "the worker left discovery and did not finish in time"));
            }
            next = next_within(&mut stream, state.config.item_timeout) => match next {
                Ok(next) => next,
                Err(e) => {
                    stream.kill();
                    break Err(e);
                }
            },
        };
        match next {
            None if progress.complete => break Ok(()),
            None => {
                break Err(ApiError::internal(
                    StatusCode::BAD_GATEWAY,
                    "stream ended before generation completed",
                ));
            }
            Some(Err(e)) => break Err(lost(&e)),
            Some(Ok(item)) => {
                let taken = progress.take(item, m);
                // Kept up to date: a client that leaves drops this future mid-answer.
                account.tokens = progress.tokens;
                match taken {
                    Ok(Some(t)) => text.push_str(&t),
                    Ok(None) => {}
                    Err(e) => break Err(e),
                }
            }
        }
    };
    match result {
        Ok(()) => {
            progress.delivered(m);
            account.outcome = Some(Outcome::Success);
            let shaper = Shaper::new(&job, id);
            let body = shaper.full(&text, progress.finish, progress.usage(&job));
            let mut r = (StatusCode::OK, body).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => {
            account.outcome = Some(Outcome::of_status(e.status.as_u16()));
            e.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use response_plane::{
        Codec, Plane, RegisterOptions, ResponsePlaneConfig, ResponseSender, ResponseStream,
    };
    use runtime_glue::{ResponseService, Role, ServiceConfig};

    use super::*;
    use crate::openai::{Ending, Endpoint};
    use crate::wire::{LLMEngineOutput, OutputType};

    /// Planes that stay up while a test runs.
    struct Planes {
        _frontend: ResponseService,
        _worker: ResponseService,
        _sender: ResponseSender<StreamItem>,
    }

    /// An established stream between two in-process planes on loopback.
    async fn a_stream() -> (Planes, ResponseStream<StreamItem>) {
        let plane = ResponsePlaneConfig::builder()
            .plane(Plane::Velo)
            .host(Some(Ipv4Addr::LOCALHOST.into()))
            .build()
            .unwrap();
        let service = |role| {
            ServiceConfig::builder(role)
                .response_plane(plane.clone())
                .build()
                .unwrap()
        };
        let frontend = ResponseService::start(service(Role::Frontend))
            .await
            .unwrap();
        let worker = ResponseService::start(service(Role::Worker)).await.unwrap();
        let opts = RegisterOptions {
            codec: Codec::Msgpack,
            establish_timeout: Some(Duration::from_secs(30)),
        };
        let (info, pending) = frontend.register::<StreamItem>(opts).unwrap();
        let mut sender = worker.connect::<StreamItem>(&info).await.unwrap();
        sender.send_prologue(Ok(())).await.unwrap();
        let stream = pending.established().await.unwrap();
        let planes = Planes {
            _frontend: frontend,
            _worker: worker,
            _sender: sender,
        };
        (planes, stream)
    }

    fn job() -> Job {
        Job {
            endpoint: Endpoint::Chat,
            model: "m".into(),
            stream: true,
            include_usage: true,
            prompt_tokens: 4,
            output_tokens: 8,
            ending: Ending::Length,
        }
    }

    /// The worker's stream completed, but the client went away before `[DONE]` (and the
    /// usage chunk) reached it: the client did not get its answer, so it is no success.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_complete_stream_whose_client_left_before_done_is_no_success() {
        let (_planes, mut stream) = a_stream().await;
        let job = job();
        let shaper = Shaper::new(&job, "x");
        let mut progress = Progress::new(Instant::now(), job.output_tokens);
        progress.complete = true;
        let (tx, rx) = mpsc::channel(CLIENT_BUFFER_EVENTS);
        drop(rx);
        let m = FrontendMetrics::new("m");
        let outcome = conclude(
            End::Complete,
            &job,
            &shaper,
            &progress,
            &mut stream,
            &tx,
            &m,
        )
        .await;
        assert_ne!(
            outcome,
            Some(Outcome::Success),
            "[DONE] never reached the client"
        );
    }

    fn token(text: &str) -> StreamItem {
        StreamItem::output(LLMEngineOutput {
            token_ids: vec![7],
            tokens: None,
            text: Some(text.to_owned()),
            output_type: OutputType::Text,
            cum_log_probs: None,
            log_probs: None,
            top_logprobs: None,
            finish_reason: None,
            index: None,
            completion_usage: None,
        })
    }

    #[test]
    fn a_worker_that_sends_more_tokens_than_asked_for_is_cut_off() {
        let metrics = FrontendMetrics::new("m");
        let mut progress = Progress::new(Instant::now(), 3);
        for _ in 0..3 {
            assert_eq!(
                progress.take(token("ab"), &metrics).unwrap().as_deref(),
                Some("ab")
            );
        }
        let error = progress
            .take(token("ab"), &metrics)
            .expect_err("a fourth token of three");
        assert_eq!(error.status, StatusCode::BAD_GATEWAY);
    }

    #[test]
    fn a_worker_that_sends_megabytes_of_text_per_token_is_cut_off() {
        let metrics = FrontendMetrics::new("m");
        let mut progress = Progress::new(Instant::now(), 100);
        let long = "x".repeat(MAX_TEXT_BYTES_PER_TOKEN);
        assert!(
            progress.take(token(&long), &metrics).is_ok(),
            "a long token"
        );
        let more = progress.take(token(&"x".repeat(3 * MAX_TEXT_BYTES_PER_TOKEN)), &metrics);
        assert!(
            matches!(&more, Err(e) if e.status == StatusCode::BAD_GATEWAY),
            "3 KiB more for one more token is refused: {:?}",
            more.map(|t| t.map(|t| t.len()))
        );
    }
}
