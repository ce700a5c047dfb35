//! Admission: at most `max_in_flight` requests are served at once; up to `max_queued` more
//! wait (each at most `queue_timeout`) for a turn; past that a request is refused at once with
//! 503 and `Retry-After`, never queued without bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::openai::ApiError;

/// Admission limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Requests served at once.
    pub max_in_flight: usize,
    /// Requests waiting for a turn.
    pub max_queued: usize,
    /// Longest wait for a turn.
    pub queue_timeout: Duration,
}

/// The admission gate.
#[derive(Debug)]
pub struct Admission {
    limits: AdmissionLimits,
    slots: Arc<Semaphore>,
    queued: AtomicUsize,
}

/// A request's turn: held while it is served.
#[derive(Debug)]
pub struct Turn(#[allow(dead_code)] OwnedSemaphorePermit);

impl Admission {
    /// A gate with `limits`.
    pub fn new(limits: AdmissionLimits) -> Self {
        Self {
            limits,
            slots: Arc::new(Semaphore::new(limits.max_in_flight)),
            queued: AtomicUsize::new(0),
        }
    }

    /// Requests waiting right now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Requests being served right now.
    pub fn in_flight(&self) -> usize {
        self.limits.max_in_flight - self.slots.available_permits()
    }

    /// Waits for a turn.
    ///
    /// # Errors
    ///
    /// 503 when the queue is full or the wait times out.
    pub async fn enter(&self) -> Result<Turn, ApiError> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(Turn(p));
        }
        let waiting = self.queued.fetch_add(1, Ordering::AcqRel);
        let _leave = Leave(&self.queued);
        if waiting >= self.limits.max_queued {
            return Err(ApiError::overloaded(format!(
                "the service is at capacity ({} requests in flight, {} queued); retry later",
                self.limits.max_in_flight, self.limits.max_queued
            )));
        }
        match tokio::time::timeout(
            self.limits.queue_timeout,
            self.slots.clone().acquire_owned(),
        )
        .await
        {
            Ok(Ok(p)) => Ok(Turn(p)),
            // The semaphore is never closed; a timeout is overload.
            _ => Err(ApiError::overloaded(format!(
                "no capacity within {:?}; retry later",
                self.limits.queue_timeout
            ))),
        }
    }
}

struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn past_the_queue_a_request_is_refused_at_once_and_a_waiter_times_out() {
        let gate = Arc::new(Admission::new(AdmissionLimits {
            max_in_flight: 1,
            max_queued: 1,
            queue_timeout: Duration::from_secs(2),
        }));
        let held = gate.enter().await.unwrap();
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.enter().await.map(|_| ()) }
        });
        // Bounded: the waiter queues on its first poll.
        for _ in 0..1000 {
            if gate.queued() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.queued(), 1);
        let refused = gate.enter().await.unwrap_err();
        assert_eq!(refused.status.as_u16(), 503);
        let timed_out = waiter.await.unwrap().unwrap_err();
        assert_eq!(timed_out.status.as_u16(), 503);
        drop(held);
        assert!(gate.enter().await.is_ok());
    }
}
