//! The worker's connection cache: one preparation per frontend instance, shared by
//! concurrent first requests; failures fail fast during a backoff and are retried after it; a
//! new instance (a restarted frontend) is prepared again.

mod common;

use std::time::Duration;

use common::{World, addr, frontend, frontend_config, within};
use velo_session::ConnectError;

const LANES: usize = velo_mux::DEFAULT_LANES as usize;

#[tokio::test(start_paused = true)]
async fn concurrent_first_requests_share_one_preparation() {
    let w = World::new();
    let instance = w.frontend.instance();
    let requests = (0..50).map(|_| w.worker.peer(addr(), instance));
    let peers = within("50 first requests", futures::future::join_all(requests)).await;
    let peers: Vec<_> = peers.into_iter().map(|p| p.expect("prepared")).collect();
    assert_eq!(
        w.connector.dials(),
        LANES,
        "one preparation dials each lane once"
    );
    assert!(
        peers
            .iter()
            .all(|p| p.instance() == instance && p.is_alive())
    );
    // Later requests use the cached connection without dialing.
    let again = within("a later request", w.worker.peer(addr(), instance))
        .await
        .unwrap();
    assert_eq!(again.instance(), instance);
    assert_eq!(w.connector.dials(), LANES);
    assert_eq!(w.worker.peers().len(), 1);
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_preparation_fails_fast_during_its_backoff_then_is_retried() {
    let w = World::new();
    let instance = w.frontend.instance();
    w.connector.set_failing(true);
    let first = within("a failing preparation", w.worker.peer(addr(), instance)).await;
    assert!(matches!(first, Err(ConnectError::Io { .. })), "{first:?}");
    let dials = w.connector.dials();

    // Within the backoff (100 ms after the first failure) requests fail at once, no dial.
    w.connector.set_failing(false);
    let fast = within(
        "a request during the backoff",
        w.worker.peer(addr(), instance),
    )
    .await;
    match fast {
        Err(ConnectError::BackingOff { last, .. }) => {
            assert!(matches!(*last, ConnectError::Io { .. }), "{last:?}");
        }
        other => panic!("expected a fast failure, got {other:?}"),
    }
    assert_eq!(w.connector.dials(), dials, "no dial during the backoff");

    // After it, the next request prepares again, and succeeds.
    tokio::time::advance(Duration::from_millis(150)).await;
    let peer = within(
        "a request after the backoff",
        w.worker.peer(addr(), instance),
    )
    .await
    .expect("the retry succeeds");
    assert!(peer.is_alive());
    assert_eq!(w.connector.dials(), dials + LANES);
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_double_the_backoff() {
    let w = World::new();
    let instance = w.frontend.instance();
    w.connector.set_failing(true);
    let retry_in = |r: Result<velo_session::Peer, ConnectError>| match r {
        Err(ConnectError::BackingOff { retry_in, .. }) => retry_in,
        other => panic!("expected a backoff, got {other:?}"),
    };
    // Failure 1: 100 ms; failure 2: 200 ms; failure 3: 400 ms.
    for expected_ms in [100_u64, 200, 400] {
        let r = within("a failing preparation", w.worker.peer(addr(), instance)).await;
        assert!(matches!(r, Err(ConnectError::Io { .. })), "{r:?}");
        let wait = retry_in(w.worker.peer(addr(), instance).await);
        assert!(
            wait <= Duration::from_millis(expected_ms)
                && wait > Duration::from_millis(expected_ms / 2),
            "backoff after a failure: {wait:?}, expected about {expected_ms} ms"
        );
        tokio::time::advance(wait + Duration::from_millis(1)).await;
    }
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_frontend_restarted_under_a_new_instance_is_prepared_again() {
    let mut w = World::new();
    let old = w.frontend.instance();
    let (tx, _rx) = w.stream(1).await;
    assert_eq!(w.connector.dials(), LANES);

    // The old frontend goes away; its lanes close and the worker's connection dies.
    w.frontend.close();
    let old_peer = tx.peer().clone();
    within("the old connection ending", old_peer.closed()).await;
    assert!(!old_peer.is_alive());
    drop(tx);

    // A new frontend instance (a restart) is reachable; the worker prepares it from scratch.
    let (restarted, mut inbox) = frontend(&w.tracker, frontend_config(|b| b));
    w.connector.serve(&restarted);
    let new = restarted.instance();
    assert_ne!(old, new);
    let mut tx = within(
        "a stream to the restarted frontend",
        w.worker
            .open(addr(), new, 2, &common::TOKEN, common::PROLOGUE),
    )
    .await
    .expect("opened");
    assert_eq!(w.connector.dials(), 2 * LANES);
    let mut rx = within("the OPEN", inbox.recv()).await.unwrap().accept();
    tx.send(b"hello again").await.unwrap();
    assert_eq!(
        within("the item", rx.recv())
            .await
            .unwrap()
            .unwrap()
            .as_ref(),
        b"hello again"
    );
    // The dead connection is forgotten, by the cache too (a frontend that restarts, or moves
    // to another port, must not leave a dead connection behind each time).
    assert_eq!(w.worker.peers().len(), 1);
    assert_eq!(w.worker.cached_connections(), 1);
    restarted.abort();
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_dead_connection_is_replaced_on_the_next_request() {
    let w = World::new();
    let instance = w.frontend.instance();
    let first = within("preparation", w.worker.peer(addr(), instance))
        .await
        .unwrap();
    for lane in w.connector.lanes() {
        lane.sever.cancel();
    }
    within("the connection dying", first.closed()).await;
    let second = within("a new preparation", w.worker.peer(addr(), instance))
        .await
        .unwrap();
    assert!(second.is_alive());
    assert!(!first.is_alive());
    assert_eq!(w.connector.dials(), 2 * LANES);
    w.shut_down().await;
}

/// A frontend, or a proxy in front of it, that completes the handshakes and drops the lanes
/// at once, again and again: the first connection that dies young is replaced at once (as
/// any dead one), but one dying young again counts as a failure, so the next preparation
/// waits for a backoff instead of redialling every lane at the request rate.
#[tokio::test(start_paused = true)]
async fn connections_that_keep_dying_young_are_redialled_after_a_backoff() {
    let w = World::new();
    let instance = w.frontend.instance();
    let sever_all = || {
        for lane in w.connector.lanes() {
            lane.sever.cancel();
        }
    };
    let first = within("preparation", w.worker.peer(addr(), instance))
        .await
        .unwrap();
    sever_all();
    within("the first connection dying", first.closed()).await;
    let second = within("its replacement", w.worker.peer(addr(), instance))
        .await
        .expect("a first young death is replaced at once");
    sever_all();
    within("the second connection dying", second.closed()).await;
    let third = within("a request", w.worker.peer(addr(), instance)).await;
    assert!(
        matches!(third, Err(ConnectError::BackingOff { .. })),
        "a second young death in a row backs off: {third:?}"
    );
    assert_eq!(w.connector.dials(), 2 * LANES, "no dial during the backoff");
    tokio::time::advance(Duration::from_millis(150)).await;
    let fourth = within(
        "a request after the backoff",
        w.worker.peer(addr(), instance),
    )
    .await
    .expect("prepared again after the backoff");
    assert!(fourth.is_alive());
    w.shut_down().await;
}

/// The same with two frontend addresses (a proxy in front of both drops every connection):
/// preparing one must not forget that the other's connection died young, or each would reset
/// the other's count and neither would ever back off.
#[tokio::test(start_paused = true)]
async fn young_deaths_are_counted_per_frontend_whatever_the_others_do() {
    let w = World::new();
    let instance = w.frontend.instance();
    let other: std::net::SocketAddr = "127.0.0.1:10".parse().unwrap();
    w.connector.serve_at(other, &w.frontend);
    let sever_all = || {
        for lane in w.connector.lanes() {
            lane.sever.cancel();
        }
    };
    let both = async || {
        let a = within("a", w.worker.peer(addr(), instance)).await;
        let b = within("b", w.worker.peer(other, instance)).await;
        (a, b)
    };
    let (a, b) = both().await;
    let (a, b) = (a.unwrap(), b.unwrap());
    sever_all();
    within("both dying", async {
        a.closed().await;
        b.closed().await;
    })
    .await;
    // First young deaths: each replaced at once. Preparing `a` also prunes `b`'s dead entry.
    let (a, b) = both().await;
    let (a, b) = (a.expect("replaced at once"), b.expect("replaced at once"));
    sever_all();
    within("both dying again", async {
        a.closed().await;
        b.closed().await;
    })
    .await;
    let (a, b) = both().await;
    assert!(
        matches!(a, Err(ConnectError::BackingOff { .. })),
        "a: {a:?}"
    );
    assert!(
        matches!(b, Err(ConnectError::BackingOff { .. })),
        "b: {b:?}"
    );
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_closed_worker_endpoint_prepares_nothing() {
    let w = World::new();
    w.worker.close();
    let r = w.worker.peer(addr(), w.frontend.instance()).await;
    assert!(matches!(r, Err(ConnectError::ShuttingDown)), "{r:?}");
    assert_eq!(w.connector.dials(), 0);
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn after_a_go_away_new_streams_use_a_fresh_connection_and_old_ones_finish() {
    let mut w = World::new();
    let (mut old_tx, mut old_rx) = w.stream(1).await;
    let old_peer = old_tx.peer().clone();
    w.frontend.go_away();
    common::eventually("the worker hearing of the go-away", || {
        old_peer.is_going_away()
    })
    .await;
    // A new stream goes on a new connection (the frontend is draining, not closed).
    let (mut new_tx, mut new_rx) = w.stream(2).await;
    assert_eq!(w.connector.dials(), 2 * LANES);
    assert!(!new_tx.peer().is_going_away());
    new_tx.send(b"new").await.unwrap();
    assert_eq!(
        within("the new stream's item", new_rx.recv())
            .await
            .unwrap()
            .unwrap()
            .as_ref(),
        b"new"
    );
    // The old connection still carries its open stream to the end.
    old_tx.send(b"old").await.unwrap();
    old_tx.finish(bytes::Bytes::new()).await.unwrap();
    assert_eq!(
        within("the old stream's item", old_rx.recv())
            .await
            .unwrap()
            .unwrap()
            .as_ref(),
        b"old"
    );
    assert!(
        within("the old stream's end", old_rx.recv())
            .await
            .is_none()
    );
    drop(new_tx);
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_preparation_whose_waiters_all_gave_up_still_completes_and_serves_later_requests() {
    let mut w = World::new();
    let instance = w.frontend.instance();
    // The only request gives up while its lanes are being dialed.
    let gave_up =
        tokio::time::timeout(common::DIAL_TIME / 5, w.worker.peer(addr(), instance)).await;
    assert!(
        gave_up.is_err(),
        "the request was meant to give up mid-preparation"
    );
    // The preparation finishes without it, and its lanes run (heartbeats keep them up).
    common::eventually("the abandoned preparation completing", || {
        w.worker.peers().len() == 1
    })
    .await;
    // Time passes timer by timer (a sleep under paused time), so heartbeats flow.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (mut tx, mut rx) = w.stream(1).await;
    assert_eq!(
        w.connector.dials(),
        LANES,
        "the later request used that connection"
    );
    tx.send(b"served").await.unwrap();
    assert_eq!(
        within("the item", rx.recv())
            .await
            .unwrap()
            .unwrap()
            .as_ref(),
        b"served"
    );
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn connections_are_cached_per_instance_and_address() {
    let w = World::new();
    let instance = w.frontend.instance();
    let (a, b): (std::net::SocketAddr, std::net::SocketAddr) =
        (addr(), "127.0.0.2:9".parse().unwrap());
    w.connector.serve_at(b, &w.frontend);
    within("a connection via one address", w.worker.peer(a, instance))
        .await
        .unwrap();
    within("a connection via another", w.worker.peer(b, instance))
        .await
        .unwrap();
    let dialed = w.connector.dialed();
    assert_eq!(dialed.iter().filter(|d| **d == a).count(), LANES);
    assert_eq!(dialed.iter().filter(|d| **d == b).count(), LANES);
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_going_away_connection_closes_once_no_stream_is_left_on_it() {
    // A frontend that says GOAWAY on every connection and never closes one: the worker must
    // not keep each (lanes, tasks, sockets) for good.
    let mut w = World::new();
    let mut old = Vec::new();
    for ticket in 0..5 {
        let (tx, mut rx) = w.stream(ticket).await;
        let peer = tx.peer().clone();
        tx.finish(bytes::Bytes::new()).await.unwrap();
        assert!(within("the stream's end", rx.recv()).await.is_none());
        drop(rx);
        w.frontend.go_away();
        common::eventually("the worker hearing of the go-away", || peer.is_going_away()).await;
        old.push(peer);
    }
    for peer in &old {
        within("an idle going-away connection closing", peer.closed()).await;
    }
    // A going-away connection with a stream still open stays until that stream ends.
    let (mut tx, mut rx) = w.stream(9).await;
    let peer = tx.peer().clone();
    w.frontend.go_away();
    common::eventually("the go-away", || peer.is_going_away()).await;
    assert!(peer.is_alive(), "its stream is still open");
    tx.send(b"late").await.unwrap();
    tx.finish(bytes::Bytes::new()).await.unwrap();
    assert_eq!(
        within("the item", rx.recv())
            .await
            .unwrap()
            .unwrap()
            .as_ref(),
        b"late"
    );
    assert!(within("the end", rx.recv()).await.is_none());
    within(
        "the connection closing after its last stream",
        peer.closed(),
    )
    .await;
    w.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_going_away_connection_closes_only_after_its_last_bytes_are_written() {
    // The last stream finishes while its bytes are still in the writer's hands (the frontend
    // is slow to read): the connection must wait for them, not cut them off.
    let hour = Duration::from_secs(3600);
    let mut w = World::with(
        |b| b.window(60_000).idle_timeout(hour),
        |b| b.lanes(1).idle_timeout(hour),
    );
    let (mut tx, mut rx) = w.stream(1).await;
    let peer = tx.peer().clone();
    w.frontend.go_away();
    common::eventually("the worker hearing of the go-away", || peer.is_going_away()).await;
    let lane = w.connector.lanes()[0].clone();
    lane.frontend_reads.set(false);
    let item = vec![0x5a; 1000];
    const ITEMS: usize = 110; // more than the in-memory lane's 64 KiB
    for _ in 0..ITEMS {
        assert!(
            tx.try_send(&item).unwrap(),
            "credit and room for every item"
        );
    }
    tx.finish(bytes::Bytes::new()).await.unwrap();
    // Longer than the grace a closing lane's write gets.
    tokio::time::sleep(3 * velo_session::CLOSE_GRACE).await;
    lane.frontend_reads.set(true);
    let mut got = 0;
    let end = loop {
        match within("the next item", rx.recv()).await {
            Some(Ok(_)) => got += 1,
            other => break other,
        }
    };
    assert!(
        end.is_none() && got == ITEMS,
        "got {got} of {ITEMS} items, then {end:?}"
    );
    within("the connection closing", peer.closed()).await;
    w.shut_down().await;
}
