//! Lane tasks: a lane that ends on either side ends both sides' tasks for it and only its own
//! streams; `abort` ends every task at once, even a writer blocked on a peer that stopped
//! reading; `close` sends CLOSE and ends the connection on both sides.

mod common;

use common::{World, within};
use velo_mux::{LaneError, StreamEnd};

#[tokio::test(start_paused = true)]
async fn a_severed_lane_ends_its_streams_on_both_sides_and_spares_the_others() {
    let mut w = World::with(|b| b, |b| b.lanes(2));
    // Least-loaded placement: the first stream on lane 0, the second on lane 1.
    let (mut tx0, mut rx0) = w.stream(1).await;
    let (mut tx1, mut rx1) = w.stream(2).await;
    let peer = tx0.peer().clone();
    assert_eq!(peer.lane_streams(), vec![1, 1]);

    w.connector.lanes()[0].sever.cancel();
    let end = within("the frontend hearing of it", rx0.recv()).await;
    assert!(matches!(end, Some(Err(StreamEnd::Lost(_)))), "{end:?}");
    let closed = within("the worker hearing of it", tx0.closed()).await;
    assert!(matches!(closed, StreamEnd::Lost(_)), "{closed:?}");
    assert!(tx0.send(b"x").await.is_err());

    // The other lane is untouched.
    tx1.send(b"still here").await.unwrap();
    assert_eq!(
        within("an item on the other lane", rx1.recv())
            .await
            .unwrap()
            .unwrap()
            .as_ref(),
        b"still here"
    );
    assert!(peer.is_alive());
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn when_every_lane_is_severed_both_sides_end_every_lane_task() {
    let mut w = World::new();
    let (tx, _rx) = w.stream(1).await;
    let worker_peer = tx.peer().clone();
    let frontend_peer = w.frontend.peers().pop().expect("one connection");
    let severed = tokio::time::Instant::now();
    for lane in w.connector.lanes() {
        lane.sever.cancel();
    }
    within("the worker's lane tasks ending", worker_peer.closed()).await;
    within("the frontend's lane tasks ending", frontend_peer.closed()).await;
    // Torn down at once, not at the lanes' next timer: under paused time the clock only
    // moves when every task is idle, so no virtual time passed.
    assert_eq!(severed.elapsed(), std::time::Duration::ZERO);
    assert!(!worker_peer.is_alive());
    assert!(
        w.frontend.peers().is_empty(),
        "a dead connection is not listed"
    );
    drop(tx);
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_closes_ends_the_frontend_side_with_its_close_code() {
    let mut w = World::new();
    let (_tx, mut rx) = w.stream(1).await;
    let frontend_peer = w.frontend.peers().pop().expect("one connection");
    w.worker.close();
    let end = within("the frontend hearing of the close", rx.recv()).await;
    match end {
        Some(Err(StreamEnd::Lost(LaneError::PeerClosed { code, .. }))) => {
            assert_eq!(code, common::SHUTTING_DOWN);
        }
        other => panic!("expected the worker's CLOSE, got {other:?}"),
    }
    within("the frontend's lane tasks ending", frontend_peer.closed()).await;
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_frontend_that_closes_ends_the_worker_side_with_its_close_code() {
    let mut w = World::new();
    let (tx, _rx) = w.stream(1).await;
    let worker_peer = tx.peer().clone();
    w.frontend.close();
    match within("the worker hearing of the close", tx.closed()).await {
        StreamEnd::Lost(LaneError::PeerClosed { code, .. }) => {
            assert_eq!(code, common::SHUTTING_DOWN);
        }
        other => panic!("expected the frontend's CLOSE, got {other:?}"),
    }
    within("the worker's lane tasks ending", worker_peer.closed()).await;
    assert!(!worker_peer.is_alive());
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn abort_ends_every_task_even_a_writer_blocked_on_a_peer_that_stopped_reading() {
    let mut w = World::with(|b| b.window(60_000), |b| b.lanes(1));
    let (mut tx, _rx) = w.stream(1).await;
    w.connector.lanes()[0].frontend_reads.set(false);
    // Fill the pipe and the lane buffer: the worker's writer blocks mid-write.
    let item = vec![1_u8; 1000];
    let mut n = 0;
    while tx.try_send(&item).unwrap() {
        n += 1;
        assert!(n < 100_000, "the lane never filled");
        tokio::task::yield_now().await;
    }
    drop(tx);
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn dropping_every_handle_leaves_no_stream_state_behind() {
    let mut w = World::new();
    let mut peers = Vec::new();
    for ticket in 0..10 {
        let (tx, rx) = w.stream(ticket).await;
        peers.push(tx.peer().clone());
        if ticket % 2 == 0 {
            tx.finish(bytes::Bytes::new()).await.unwrap();
        }
        drop(rx);
    }
    let worker_peer = peers.pop().unwrap();
    let frontend_peer = w.frontend.peers().pop().unwrap();
    common::eventually("both sides releasing every stream", || {
        worker_peer.stats().streams_active() == 0 && frontend_peer.stats().streams_active() == 0
    })
    .await;
    w.shut_down().await;
}
