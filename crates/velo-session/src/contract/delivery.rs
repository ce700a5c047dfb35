//! Stories of whether a worker's finish tells the truth: it succeeds only once the frontend
//! took the stream (so the frontend reports its end whatever happens next), and fails when
//! the frontend died or refused the stream first, instead of leaving a request that will
//! never be answered looking served.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;
use velo_mux::StreamEnd;
use velo_wire::CancelCode;

use super::{Frontend, Transport, Worker, frontend, open, send_now, take, within, worker};
use crate::{SendStream, StreamError};

/// Starts `s.finish(last)` and runs it until its FINAL is queued, so what follows happens
/// after the finish, whatever the scheduler does; the rest (waiting for the frontend's
/// answer) runs in a task.
async fn finish_started(s: SendStream, last: &'static [u8]) -> JoinHandle<Result<(), StreamError>> {
    let mut finish: Pin<Box<_>> = Box::pin(s.finish(bytes::Bytes::from_static(last)));
    let first = std::future::poll_fn(|cx| Poll::Ready(finish.as_mut().poll(cx))).await;
    assert!(
        first.is_pending(),
        "a finish waits for the frontend's answer: {first:?}"
    );
    tokio::spawn(finish)
}

/// A worker that finishes before the frontend took the stream learns the end was not
/// delivered when the frontend dies holding it unanswered.
pub async fn a_finish_the_frontend_never_took_fails_when_the_frontend_dies<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&net, &tracker).await;
    let worker = worker(&net, &tracker);
    let mut s = open(&worker, &frontend, 1).await;
    send_now(&mut s, b"only").await;
    let finish = finish_started(s, b"").await;
    // The stream reached the frontend, which has not answered it yet...
    let unanswered = within("the stream arriving", inbox.recv()).await;
    assert!(unanswered.is_some());
    // ...when the frontend dies.
    frontend.abort();
    let r = within("the finish", finish).await.expect("the task");
    assert!(
        matches!(r, Err(StreamError::Undelivered(StreamEnd::Lost(_)))),
        "{r:?}"
    );
    drop(unanswered);
}

/// A finish succeeds once the frontend has taken the stream, and fails when it refuses it.
pub async fn a_finish_succeeds_once_taken_and_fails_when_refused<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&net, &tracker).await;
    let worker = worker(&net, &tracker);
    let taken = open(&worker, &frontend, 1).await;
    let finish = finish_started(taken, b"last").await;
    let mut r = take(&mut inbox).await;
    assert_eq!(
        within("the finish", finish).await.expect("the task"),
        Ok(())
    );
    assert_eq!(
        within("the item", r.recv()).await,
        Some(Ok(bytes::Bytes::from_static(b"last")))
    );

    let refused = open(&worker, &frontend, 2).await;
    let finish = finish_started(refused, b"").await;
    let incoming = within("the stream arriving", inbox.recv())
        .await
        .expect("the inbox is open");
    incoming.refuse(CancelCode::REFUSED);
    let r = within("the finish", finish).await.expect("the task");
    assert_eq!(
        r,
        Err(StreamError::Undelivered(StreamEnd::Cancelled(
            CancelCode::REFUSED
        )))
    );
    drop(frontend);
}

/// A worker that drops a stream the frontend never took, and then loses the stream's lane,
/// announces the loss on a new connection: the frontend gets the same registration again
/// with an empty prologue (abandoned) and an error end, so its request ends instead of
/// waiting for a stream that is gone.
pub async fn a_stream_lost_before_the_frontend_took_it_is_announced_again<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&net, &tracker).await;
    let worker = worker(&net, &tracker);
    let mut s = open(&worker, &frontend, 7).await;
    send_now(&mut s, b"half").await;
    drop(s);
    let first = within("the stream arriving", inbox.recv())
        .await
        .expect("the inbox is open");
    assert_eq!((first.ticket(), first.prologue().is_empty()), (7, false));
    // The frontend has not answered when the worker's connection dies.
    let peer = worker.endpoint().peers().pop().expect("one connection");
    peer.close(velo_wire::CloseCode::NORMAL, "the test cuts the connection");
    let again = within("the announcement", inbox.recv())
        .await
        .expect("the inbox is open");
    assert_eq!(again.ticket(), 7);
    assert_eq!(again.token(), first.token());
    assert!(again.prologue().is_empty(), "announced as abandoned");
    let mut r = again.accept();
    assert!(
        matches!(within("the end", r.recv()).await, Some(Err(_))),
        "an error end"
    );
    drop((first, frontend));
}
