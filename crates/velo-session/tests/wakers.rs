//! Stream handles sleep until something they wait for happens, and wake when it does: credit
//! for a blocked send, data for a pending read, room in a full lane, a stop, a cancel, a lost
//! lane. Every test runs under paused time over in-memory lanes; "still pending" means a
//! whole bound of virtual time passed with every task run to idle.

mod common;

use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use bytes::Bytes;
use common::{World, eventually, still_pending, within};
use velo_mux::StreamEnd;
use velo_session::StreamError;
use velo_wire::CancelCode;

const WINDOW: u32 = 4;

fn small_window() -> World {
    World::with(|b| b.window(WINDOW), |b| b)
}

#[tokio::test(start_paused = true)]
async fn a_send_blocked_on_credit_wakes_when_the_frontend_reads() {
    let mut w = small_window();
    let (mut tx, mut rx) = w.stream(1).await;
    for i in 0..WINDOW {
        tx.send(format!("item {i}").as_bytes()).await.unwrap();
    }
    // The waiting send runs in its own task, so only a wake-up can make it go on.
    let mut blocked = pin!(tokio::spawn(async move {
        tx.send(b"one too many").await.map(|()| tx)
    }));
    still_pending("a send beyond the window", blocked.as_mut()).await;

    // Reading returns credit, which must wake the blocked send.
    for _ in 0..WINDOW {
        within("an item", rx.recv()).await.unwrap().unwrap();
    }
    let _tx = within("the blocked send", blocked).await.unwrap().unwrap();
    assert_eq!(
        within("the last item", rx.recv()).await.unwrap().unwrap(),
        Bytes::from_static(b"one too many")
    );
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_pending_read_wakes_when_an_item_arrives() {
    let mut w = World::new();
    let (mut tx, mut rx) = w.stream(1).await;
    let mut read = pin!(tokio::spawn(async move { rx.recv().await }));
    still_pending("a read with nothing sent", read.as_mut()).await;
    tx.send(b"first").await.unwrap();
    let got = within("the item", read).await.unwrap().unwrap().unwrap();
    assert_eq!(got, Bytes::from_static(b"first"));
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn items_that_arrive_while_a_reader_is_away_follow_those_handed_to_it_in_order() {
    // A waiting handle is handed the items its lane reader receives (without the
    // connection's lock); items that arrive before it comes back wait in the connection's
    // mux. Read together, they keep their order, and the end comes after them.
    let mut w = World::new();
    let (mut tx, mut rx) = w.stream(1).await;
    {
        let mut read = pin!(rx.recv());
        still_pending("a read with nothing sent", read.as_mut()).await;
    }
    // The handle is registered as waiting: the first item is handed over...
    tx.send(b"first").await.unwrap();
    let peer = rx.peer().clone();
    eventually("the first item arriving", || {
        peer.stats().payload_bytes_received >= 5
    })
    .await;
    // ...and the next ones arrive while nobody waits.
    tx.send(b"second").await.unwrap();
    tx.finish(Bytes::from_static(b"third")).await.unwrap();
    eventually("every item arriving", || {
        peer.stats().payload_bytes_received >= 16
    })
    .await;
    for want in [&b"first"[..], b"second", b"third"] {
        let got = within("an item", rx.recv()).await.unwrap().unwrap();
        assert_eq!(got, Bytes::from_static(want));
    }
    assert!(within("the end", rx.recv()).await.is_none(), "a clean end");
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_pending_read_wakes_when_the_stream_finishes() {
    let mut w = World::new();
    let (tx, mut rx) = w.stream(1).await;
    let mut read = pin!(tokio::spawn(async move {
        let last = rx.recv().await;
        (last, rx.recv().await)
    }));
    still_pending("a read with nothing sent", read.as_mut()).await;
    tx.finish(Bytes::from_static(b"last")).await.unwrap();
    let (last, end) = within("the last item", read).await.unwrap();
    assert_eq!(last.unwrap().unwrap(), Bytes::from_static(b"last"));
    assert!(end.is_none(), "a clean end");
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_stop_wakes_every_watcher_and_the_stream_goes_on() {
    let mut w = World::new();
    let (mut tx, mut rx) = w.stream(1).await;
    let watchers: Vec<_> = (0..3)
        .map(|_| {
            let watch = tx.watch();
            tokio::spawn(async move { watch.stopped().await })
        })
        .collect();
    {
        let mut first = pin!(tx.stopped());
        still_pending("a stop watch before any stop", first.as_mut()).await;
        rx.stop();
        within("the stop reaching the engine", first).await;
    }
    for watcher in watchers {
        within("every other watcher", watcher).await.unwrap();
    }
    assert!(tx.is_stop_requested());
    // Graceful: what the worker still sends is delivered.
    tx.send(b"after stop").await.unwrap();
    let got = within("an item after stop", rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, Bytes::from_static(b"after stop"));
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancel_wakes_a_blocked_send_and_the_closed_watchers() {
    let mut w = small_window();
    let (mut tx, mut rx) = w.stream(1).await;
    let watch = tx.watch();
    let closed = tokio::spawn(async move { watch.closed().await });
    for _ in 0..WINDOW {
        tx.send(b"x").await.unwrap();
    }
    let mut blocked = pin!(tx.send(b"blocked"));
    still_pending("a send beyond the window", blocked.as_mut()).await;

    rx.cancel(CancelCode::CANCELLED);
    let err = within("the blocked send", blocked).await.unwrap_err();
    assert_eq!(
        err,
        StreamError::Closed(StreamEnd::Cancelled(CancelCode::CANCELLED))
    );
    assert_eq!(
        within("the closed watcher", closed).await.unwrap(),
        StreamEnd::Cancelled(CancelCode::CANCELLED)
    );
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_send_blocked_on_a_full_lane_wakes_when_the_peer_reads_again() {
    // One lane, a small lane buffer, a large window: the lane fills before credit runs out.
    // A long idle timeout: the frontend that stops reading here must not time the lane out
    // while the test checks that the send waits.
    let hour = Duration::from_secs(3600);
    let mut w = World::with(
        |b| b.window(60_000).idle_timeout(hour),
        |b| b.lanes(1).max_buffered_bytes(64 * 1024).idle_timeout(hour),
    );
    let (mut tx, mut rx) = w.stream(1).await;
    let lane = w.connector.lanes()[0].clone();
    lane.frontend_reads.set(false);

    let item = vec![0x5a; 900];
    let mut sent = 0_u32;
    let blocked = loop {
        match tx.try_send(&item) {
            Ok(true) => sent += 1,
            Ok(false) => break true,
            Err(e) => panic!("send failed: {e}"),
        }
        if sent > 10_000 {
            break false;
        }
        // Let the writer move what it can into the pipe before the next try.
        tokio::task::yield_now().await;
    };
    assert!(blocked, "the lane never filled after {sent} items");
    let mut waiting = pin!(tokio::spawn(
        async move { tx.send(&item).await.map(|()| tx) }
    ));
    still_pending("a send into a full lane", waiting.as_mut()).await;

    lane.frontend_reads.set(true);
    let _tx = within("the send once the lane drains", waiting)
        .await
        .unwrap()
        .unwrap();
    for _ in 0..=sent {
        within("every item", rx.recv()).await.unwrap().unwrap();
    }
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_lane_wakes_a_pending_read_a_blocked_send_and_the_closed_watchers() {
    let mut w = World::with(|b| b.window(WINDOW), |b| b.lanes(1));
    let (mut tx, mut rx) = w.stream(1).await;
    let watch = tx.watch();
    let closed = tokio::spawn(async move { watch.closed().await });
    let stopped = {
        let watch = tx.watch();
        tokio::spawn(async move { watch.stopped().await })
    };
    for _ in 0..WINDOW {
        tx.send(b"x").await.unwrap();
    }
    for _ in 0..WINDOW {
        within("an item", rx.recv()).await.unwrap().unwrap();
    }
    // Credit is back in flight; fill the window again so the next send blocks.
    let mut n = 0;
    while tx.try_send(b"y").unwrap() {
        n += 1;
        assert!(n <= 2 * WINDOW, "credit never ran out");
    }
    // The sender is kept (not released) until the watchers have seen the end.
    let send = tokio::spawn(async move { (tx.send(b"blocked").await, tx) });
    let read = tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Some(Ok(_)) => continue,
                other => return other,
            }
        }
    });
    w.connector.lanes()[0].sever.cancel();
    let (tx_result, _tx) = within("the worker hearing of the lost lane", send)
        .await
        .unwrap();
    let rx_result = within("the frontend hearing of the lost lane", read)
        .await
        .unwrap();
    assert!(
        matches!(tx_result, Err(StreamError::Closed(StreamEnd::Lost(_)))),
        "{tx_result:?}"
    );
    assert!(
        matches!(rx_result, Some(Err(StreamEnd::Lost(_)))),
        "{rx_result:?}"
    );
    assert!(matches!(
        within("the closed watcher", closed).await.unwrap(),
        StreamEnd::Lost(_)
    ));
    within("the stop watcher (a lost stream stops)", stopped)
        .await
        .unwrap();
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_finished_streams_watcher_never_touches_the_stream_that_reuses_its_slot() {
    let mut w = World::with(|b| b.window(WINDOW), |b| b.lanes(1));
    // Stream 1 finishes; the engine still holds its watch (a StreamContext) and polls it.
    let (tx1, mut rx1) = w.stream(1).await;
    let old_watch = tx1.watch();
    tx1.finish(Bytes::new()).await.unwrap();
    assert!(within("stream 1's end", rx1.recv()).await.is_none());
    // Stream 2 takes the freed slot (slots are reused last-in first-out).
    let (mut tx2, mut rx2) = w.stream(2).await;
    for _ in 0..WINDOW {
        tx2.send(b"x").await.unwrap();
    }
    let mut blocked = pin!(tokio::spawn(
        async move { tx2.send(b"y").await.map(|()| tx2) }
    ));
    still_pending("stream 2's send beyond its window", blocked.as_mut()).await;
    // The old watch is polled again: it must not register over stream 2's wakers.
    let mut stale_stop = pin!(old_watch.stopped());
    still_pending("a finished stream's stop watch", stale_stop.as_mut()).await;
    let mut stale_close = pin!(old_watch.closed());
    still_pending("a finished stream's close watch", stale_close.as_mut()).await;
    // Credit for stream 2 must still wake its send.
    for _ in 0..WINDOW {
        within("an item of stream 2", rx2.recv())
            .await
            .unwrap()
            .unwrap();
    }
    let _tx2 = within("stream 2's blocked send", blocked)
        .await
        .unwrap()
        .unwrap();
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_watcher_still_hears_of_a_lost_stream_after_its_sender_is_gone() {
    let mut w = World::with(|b| b, |b| b.lanes(1));
    let (tx, _rx) = w.stream(1).await;
    let watch = tx.watch();
    w.connector.lanes()[0].sever.cancel();
    eventually("the worker hearing of the lost lane", || {
        watch.remote_end().is_some()
    })
    .await;
    // The engine drops its sender first; its context is polled only afterwards.
    drop(tx);
    assert!(matches!(
        within("the close watcher", watch.closed()).await,
        StreamEnd::Lost(_)
    ));
    within("the stop watcher", watch.stopped()).await;
    assert!(matches!(watch.remote_end(), Some(StreamEnd::Lost(_))));
    w.shut_down().await;
}

/// A waker that only counts who holds it.
struct Held;

impl Wake for Held {
    fn wake(self: Arc<Self>) {}
}

#[tokio::test(start_paused = true)]
async fn a_dead_lane_keeps_no_waker_of_the_opens_that_waited_for_room() {
    let hour = Duration::from_secs(3600);
    let mut w = World::with(
        |b| b.window(60_000).idle_timeout(hour),
        |b| b.lanes(2).max_buffered_bytes(64 * 1024).idle_timeout(hour),
    );
    let (mut tx0, _rx0) = w.stream(1).await; // lane 0
    let (_tx1, mut rx1) = w.stream(2).await; // lane 1
    let peer = tx0.peer().clone();
    // Lane 1 dies for good; lane 0 keeps the connection usable.
    w.connector.lanes()[1].sever.cancel();
    let end = within("lane 1's stream ending", rx1.recv()).await;
    assert!(matches!(end, Some(Err(StreamEnd::Lost(_)))), "{end:?}");
    assert!(peer.is_usable());
    // The frontend stops reading lane 0, which fills.
    let lane0 = w.connector.lanes()[0].clone();
    lane0.frontend_reads.set(false);
    let item = vec![0x5a; 900];
    let mut sent = 0;
    while tx0.try_send(&item).unwrap() {
        sent += 1;
        assert!(sent < 100_000, "lane 0 fills");
        tokio::task::yield_now().await;
    }
    // 100 requests with a large prologue wait for room, then give up (each its own task).
    let prologue = vec![b' '; 2000];
    let tasks: Vec<Arc<Held>> = (0..100).map(|_| Arc::new(Held)).collect();
    for task in &tasks {
        let waker = Waker::from(Arc::clone(task));
        let mut cx = Context::from_waker(&waker);
        let mut open = pin!(velo_session::open_when_room(
            &peer,
            7,
            &common::TOKEN,
            &prologue
        ));
        assert!(open.as_mut().poll(&mut cx).is_pending(), "no lane has room");
    }
    // Lane 0 drains and lets its waiters go; the dead lane must hold none of them.
    lane0.frontend_reads.set(true);
    eventually("lane 0 draining", || peer.buffered_bytes() == 0).await;
    eventually("every waiting open's waker let go", || {
        tasks.iter().all(|t| Arc::strong_count(t) == 1)
    })
    .await;
    drop(tx0);
    w.shut_down().await;
}
