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

/// Sends `job` (request number `id`) to a worker and waits for its prologue.
///
/// # Errors
///
/// 503 (with `Retry-After`) when no worker is available or every attempt failed in a way a
/// retry might cure; 500 or 502 otherwise.
pub async fn dispatch(state: &State, job: &Job, id: u64) -> Result<Dispatched, ApiError> {
    let mut tried = Vec::new();
    let mut last: Option<ResponseError> = None;
    for _ in 0..state.config.max_attempts {
        let Some(worker) = state.pool.pick(&tried) else {
            break;
        };
        tried.push(worker.0.id);
        match attempt(state, job, id, &worker).await {
            Ok(stream) => return Ok(Dispatched { stream, worker }),
            Err(e) if e.is_retryable() => {
                tracing::debug!(worker = format!("{:x}", worker.0.id), error = %e, "retrying on another worker");
                state.metrics.migrations.fetch_add(1, Ordering::Relaxed);
                last = Some(e);
            }
            Err(e) => return Err(failed(&e)),
        }
    }
    Err(match last {
        None => ApiError::overloaded("no worker is available; retry later"),
        Some(e) => ApiError::overloaded(format!("no worker could take the request: {e}")),
    })
}

async fn attempt(
    state: &State,
    job: &Job,
    id: u64,
    worker: &Assigned,
) -> Result<ResponseStream<StreamItem>, ResponseError> {
    let opts = RegisterOptions {
        codec: Codec::Msgpack,
        establish_timeout: Some(state.config.establish_timeout),
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
    // A worker that stops reading fills its queue: the send waits at most the establish
    // timeout, as the answer would.
    let after = state.config.establish_timeout;
    match tokio::time::timeout(after, worker.0.channel.send(&request)).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => {
            return Err(ResponseError::Disconnected(
                response_plane::Disconnect::Closed,
            ));
        }
        Err(_) => return Err(ResponseError::ResponseTimeout { after }),
    }
    pending.established().await
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
        _ => ApiError::internal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// How long a client may leave the end of its answer unread before it is dropped.
pub const CLIENT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
