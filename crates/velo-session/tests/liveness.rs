//! A lane is declared dead within its bound whatever the peer does: go silent while a write
//! is blocked, stop reading while it keeps heartbeating, or close its side while this side is
//! blocked writing. Paused time over in-memory lanes: bounds are checked in virtual time.

mod common;

use std::time::Duration;

use common::{LaneHandle, World, within};
use velo_mux::{LaneError, StreamEnd};
use velo_session::SendStream;

const IDLE: Duration = velo_mux::DEFAULT_IDLE_TIMEOUT;
const HOUR: Duration = Duration::from_secs(3600);

/// Sends until the lane's pipe and buffer are full, so the worker's writer is blocked
/// mid-write on a peer that does not read.
async fn fill(tx: &mut SendStream) {
    let item = vec![0x42; 1000];
    let mut sent = 0;
    while tx.try_send(&item).expect("the stream is live") {
        sent += 1;
        assert!(sent < 100_000, "the lane never filled");
        tokio::task::yield_now().await;
    }
}

/// A world with one lane, whose frontend announces a window too big to run out of.
async fn one_lane(frontend_idle: Duration) -> (World, SendStream, LaneHandle) {
    let mut w = World::with(
        |b| b.window(60_000).idle_timeout(frontend_idle),
        |b| b.lanes(1),
    );
    let (tx, rx) = w.stream(1).await;
    // The frontend application keeps its stream; whether it reads does not matter here.
    std::mem::forget(rx);
    let lane = w.connector.lanes()[0].clone();
    (w, tx, lane)
}

#[tokio::test(start_paused = true)]
async fn a_worker_blocked_writing_to_a_wedged_frontend_times_the_lane_out() {
    let (w, mut tx, lane) = one_lane(IDLE).await;
    lane.wedge_frontend();
    fill(&mut tx).await;
    let start = tokio::time::Instant::now();
    let end = within("the worker noticing the silent frontend", tx.closed()).await;
    assert!(
        matches!(end, StreamEnd::Lost(LaneError::IdleTimeout(d)) if d == IDLE),
        "{end:?}"
    );
    assert!(
        start.elapsed() <= IDLE,
        "detected after {:?}",
        start.elapsed()
    );
    let peer = tx.peer().clone();
    within("the lane's tasks ending", peer.closed()).await;
    drop(tx);
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_write_stalled_for_the_idle_timeout_closes_the_lane_though_the_peer_heartbeats() {
    // The frontend stops reading but its heartbeats keep coming (and it never times out on
    // its own): only the stalled write says the lane is dead.
    let (w, mut tx, lane) = one_lane(HOUR).await;
    lane.frontend_reads.set(false);
    fill(&mut tx).await;
    let start = tokio::time::Instant::now();
    let end = within("the worker noticing the stalled write", tx.closed()).await;
    assert!(
        matches!(end, StreamEnd::Lost(LaneError::WriteStalled(d)) if d == IDLE),
        "{end:?}"
    );
    assert!(
        start.elapsed() <= IDLE,
        "detected after {:?}",
        start.elapsed()
    );
    let peer = tx.peer().clone();
    within("the lane's tasks ending", peer.closed()).await;
    drop(tx);
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_ends_ends_its_writer_though_the_writer_is_blocked() {
    let (w, mut tx, lane) = one_lane(HOUR).await;
    lane.frontend_reads.set(false);
    fill(&mut tx).await;
    // The frontend closes its side (a FIN) while the worker's writer waits on it.
    lane.worker_eof.cancel();
    let end = within("the stream hearing of the lost lane", tx.closed()).await;
    assert!(matches!(end, StreamEnd::Lost(_)), "{end:?}");
    let peer = tx.peer().clone();
    within("the blocked writer ending with its reader", peer.closed()).await;
    assert!(!peer.is_alive());
    drop(tx);
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_hello_asking_for_millisecond_heartbeats_is_refused() {
    let w = World::new();
    let mut hello = velo_mux::MuxConfig::builder(velo_mux::Side::Worker)
        .build()
        .unwrap()
        .hello(0, velo_session::new_instance_id(), w.frontend.instance());
    hello.idle_timeout_ms = 1;
    let err = w.frontend.answer(&hello).unwrap_err();
    assert_eq!(err.close_code(), velo_wire::CloseCode::BAD_HANDSHAKE);
    assert!(
        err.to_string().contains("idle_timeout_ms 1"),
        "the refusal names the value: {err}"
    );
    w.shut_down().await;
}
