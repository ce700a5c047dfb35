//! Getting a request to a worker: pick the least loaded worker, register the response stream,
//! tie it to that worker (worker association), send the request, wait for the prologue. A
//! failure before the prologue that another worker may not share (the worker left discovery,
//! its connection was lost, it gave the request up) is retried on another worker, at most
//! `max_attempts` times in all; nothing has reached the client yet.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use response_plane::{Codec, RegisterOptions, ResponseError, ResponseStream};

use super::State;
use super::pool::Assigned;
use crate::openai::{ApiError, Job};
use crate::wire::StreamItem;
use crate::work::WorkRequest;

/// A request on its way: its stream, and the worker generating it.
pub struct Dispatched {
    /// The worker's answer.
    pub stream: ResponseStream<StreamItem>,
    /// The worker (counted as busy with this request until dropped).
    pub worker: Assigned,
}

/// Sends `job` (request number `id`) to a worker and waits for its prologue: at most
/// `max_attempts` workers, and `establish_timeout` in all (each attempt gets what is left).
///
/// # Errors
///
/// 503 (with `Retry-After`) when no worker is available, every attempt failed in a way a
/// retry might cure, or no worker answered in time; 502 when the worker was at fault (a
/// refusal, a malformed answer); 500 otherwise.
pub async fn dispatch(state: &State, job: &Job, id: u64) -> Result<Dispatched, ApiError> {
    let within = state.config.establish_timeout;
    let deadline = tokio::time::Instant::now() + within;
    let mut tried = Vec::new();
    let mut causes: Vec<String> = Vec::new();
    for n in 0..state.config.max_attempts {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        let Some(worker) = state.pool.pick(&tried) else {
            break;
        };
        if n > 0 {
            state.metrics.migrations.fetch_add(1, Ordering::Relaxed);
        }
        tried.push(worker.0.id);
        match attempt(state, job, id, &worker, left).await {
            Ok(stream) => return Ok(Dispatched { stream, worker }),
            Err(e) if e.is_retryable() => {
                tracing::debug!(worker = format!("{:x}", worker.0.id), error = %e, "retrying on another worker");
                causes.push(format!("worker {:x}: {e}", worker.0.id));
            }
            Err(e) => return Err(failed(&e)),
        }
    }
    if causes.is_empty() {
        return Err(ApiError::overloaded("no worker is available; retry later"));
    }
    let timed_out = tokio::time::Instant::now() >= deadline;
    let why = if timed_out {
        format!("no worker answered within {within:?} (establish_timeout)")
    } else {
        "no worker could take the request".to_owned()
    };
    Err(ApiError::overloaded(format!(
        "{why}: {}",
        causes.join("; ")
    )))
}

/// One try on `worker`, within `left`: register the stream, send the request, wait for the
/// prologue.
async fn attempt(
    state: &State,
    job: &Job,
    id: u64,
    worker: &Assigned,
    left: Duration,
) -> Result<ResponseStream<StreamItem>, ResponseError> {
    let opts = RegisterOptions {
        codec: Codec::Msgpack,
        establish_timeout: Some(left),
    };
    let (info, pending) = state.service.register::<StreamItem>(opts)?;
    // A worker removed within the last 5 s fails here, before the request is sent.
    pending.associate(worker.0.id)?;
    let request = WorkRequest {
        id,
        prompt_tokens: job.prompt_tokens,
        output_tokens: job.output_tokens,
        ending: job.ending.into(),
        info,
    };
    // A worker that stops reading fills its queue: the send and the answer share `left`.
    let answered = async {
        match worker.0.channel.send(&request).await {
            Ok(()) => pending.established().await,
            Err(_) => Err(ResponseError::Disconnected(
                response_plane::Disconnect::Closed,
            )),
        }
    };
    match tokio::time::timeout(left, answered).await {
        Ok(answer) => answer,
        Err(_) => Err(ResponseError::ResponseTimeout { after: left }),
    }
}

/// A failure that retrying elsewhere will not cure, as an HTTP error.
fn failed(e: &ResponseError) -> ApiError {
    match e {
        ResponseError::Overloaded { .. } | ResponseError::Closed => {
            ApiError::overloaded(format!("the response plane cannot take the request: {e}"))
        }
        ResponseError::Refused { .. } | ResponseError::PlaneMismatch { .. } => ApiError::internal(
            StatusCode::BAD_GATEWAY,
            format!("the worker refused the request: {e}"),
        ),
        // A malformed prologue, an item it could not decode, the worker's own error.
        e if e.is_remote() => ApiError::internal(
            StatusCode::BAD_GATEWAY,
            format!("the worker's answer failed: {e}"),
        ),
        _ => ApiError::internal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// How long a client may leave the end of its answer unread before it is dropped.
pub const CLIENT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use response_plane::ProtocolViolation;

    use super::*;

    /// A worker that answers with a malformed prologue is at fault: the client gets a 502
    /// (bad gateway), not a 500 that blames this server.
    #[test]
    fn a_malformed_answer_from_the_worker_is_a_502() {
        let e = ResponseError::Protocol(ProtocolViolation::DataAfterFinal);
        let answer = failed(&e);
        assert_eq!(answer.status, StatusCode::BAD_GATEWAY, "{}", answer.message);
    }
}
