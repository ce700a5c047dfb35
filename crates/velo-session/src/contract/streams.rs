//! Stories of streams over a transport's lanes: spread over every lane, in order at scale and
//! with large items, and ended exactly once when either side dies.

use bytes::Bytes;
use tokio_util::task::TaskTracker;
use velo_mux::{ITEM_BUFFER_KEEP, LaneError, StreamEnd};

use super::{
    Frontend, PROLOGUE, Transport, Worker, eventually, frontend, next_item, open, send_now, take,
    within, worker, worker_settings,
};

/// A connection has four lanes (the default) and spreads streams over all of them; both sides
/// count four lanes.
pub async fn responses_use_four_lanes<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&net, &tracker).await;
    let worker = worker(&net, &tracker);
    let mut senders = Vec::new();
    for t in 0..16 {
        senders.push(open(&worker, &frontend, t).await);
    }
    let peer = worker.endpoint().peers().pop().expect("one connection");
    assert_eq!(
        peer.lane_streams(),
        vec![4, 4, 4, 4],
        "streams run on all four lanes"
    );
    for s in &mut senders {
        send_now(s, b"item").await;
    }
    let mut receivers = Vec::new();
    for _ in 0..16 {
        let mut r = take(&mut inbox).await;
        assert_eq!(next_item(&mut r).await, &b"item"[..]);
        receivers.push(r);
    }
    assert_eq!(worker.endpoint().handshake_stats().lanes_dialed, 4);
    // The frontend counts a lane once attached, just after answering its handshake.
    eventually("four lanes accepted", || {
        frontend.handshake_stats().lanes_accepted == 4
    })
    .await;
    assert_eq!(frontend.handshake_stats().connections_accepted, 4);
}

/// A worker that vanishes mid-stream (its runtime torn down: its tasks and lanes go at once,
/// as when its process dies) ends each of its streams at the frontend as lost, exactly once.
pub async fn a_worker_that_dies_mid_stream_ends_its_streams_as_lost_exactly_once<T: Transport>(
    net: T,
) {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&net, &tracker).await;
    let (addr, id) = (frontend.addr(), frontend.instance());
    let worker_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("the worker's runtime");
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    worker_rt.spawn(async move {
        let worker = worker(&net, &TaskTracker::new());
        let mut streams = Vec::new();
        for t in 0..8 {
            let mut s = worker
                .endpoint()
                .open(addr, id, t, &super::TOKEN, PROLOGUE)
                .await
                .expect("the stream opens");
            send_now(&mut s, b"first").await;
            streams.push(s);
        }
        ready_tx.send(()).expect("the story waits for the worker");
        std::future::pending::<()>().await;
        drop(streams);
    });
    within("the worker ready", ready_rx)
        .await
        .expect("the worker started");
    let mut receivers = Vec::new();
    for _ in 0..8 {
        let mut r = take(&mut inbox).await;
        assert_eq!(next_item(&mut r).await, &b"first"[..]);
        receivers.push(r);
    }
    worker_rt.shutdown_background();
    for mut r in receivers {
        let end = within("the stream's end", r.recv()).await;
        // Lost because the lanes ended, not by the idle timer (nor anything else)...
        assert!(
            matches!(end, Some(Err(StreamEnd::Lost(LaneError::Transport(_))))),
            "{end:?}"
        );
        // ...and only once.
        assert_eq!(within("nothing more", r.recv()).await, None);
    }
}

/// A frontend that aborts ends each of the worker's streams as lost exactly once (not by the
/// idle timer); sends then fail instead of waiting.
pub async fn a_frontend_that_aborts_ends_the_worker_streams_as_lost_exactly_once<T: Transport>(
    net: T,
) {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&net, &tracker).await;
    let worker = worker(&net, &tracker);
    let mut senders = Vec::new();
    for t in 0..8 {
        let mut s = open(&worker, &frontend, t).await;
        send_now(&mut s, b"first").await;
        senders.push(s);
    }
    let mut receivers = Vec::new();
    for _ in 0..8 {
        let mut r = take(&mut inbox).await;
        assert_eq!(next_item(&mut r).await, &b"first"[..]);
        receivers.push(r);
    }
    let peer = worker.endpoint().peers().pop().expect("one connection");
    frontend.abort();
    for s in &senders {
        let end = within("the stream lost", s.closed()).await;
        assert!(
            matches!(&end, StreamEnd::Lost(e) if !matches!(e, LaneError::IdleTimeout(_))),
            "{end:?}"
        );
    }
    within("the connection closed", peer.closed()).await;
    let st = peer.stats();
    assert_eq!(st.streams_lost, 8, "each stream ends once: {st:?}");
    for mut s in senders {
        assert!(within("a send", s.send(b"more")).await.is_err());
    }
}

/// A thousand concurrent streams of a hundred items each arrive complete and in order, each
/// with its prologue and a clean end.
pub async fn a_thousand_streams_of_a_hundred_items_arrive_in_order<T: Transport>(net: T) {
    const STREAMS: u64 = 1000;
    const ITEMS: usize = 100;
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&net, &tracker).await;
    let worker = worker(&net, &tracker);
    let (addr, id) = (frontend.addr(), frontend.instance());
    let endpoint = worker.endpoint().clone();
    let producers = tokio::spawn(async move {
        let mut tasks = Vec::new();
        for t in 0..STREAMS {
            let open = endpoint.open(addr, id, t, &super::TOKEN, PROLOGUE);
            let mut s = open.await.expect("the stream opens");
            tasks.push(tokio::spawn(async move {
                for i in 0..ITEMS {
                    s.send(format!("{t}:{i}").as_bytes()).await.unwrap();
                }
                s.finish(Bytes::new()).await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let mut consumers = Vec::new();
    for _ in 0..STREAMS {
        let incoming = within("a stream", inbox.recv()).await.unwrap();
        let t = incoming.ticket();
        assert_eq!(incoming.prologue(), &Bytes::from_static(PROLOGUE));
        let mut r = incoming.accept();
        consumers.push(tokio::spawn(async move {
            let mut n = 0;
            while let Some(item) = r.recv().await {
                let want = format!("{t}:{n}");
                assert_eq!(item.unwrap(), want.as_bytes(), "stream {t} item {n}");
                n += 1;
            }
            assert_eq!(r.end(), Some(&StreamEnd::Finished));
            n
        }));
    }
    for c in consumers {
        assert_eq!(within("a consumer", c).await.unwrap(), ITEMS);
    }
    within("the producers", producers).await.unwrap();
    let stats = frontend.endpoint().stats();
    assert_eq!(stats.streams_finished, STREAMS);
    assert_eq!(stats.stale_drops, 0);
}

/// Items of 1 MiB among small ones, on one lane, arrive intact and in send order (over UCX
/// the large ones cross by rendezvous, landing after later small ones were handled).
pub async fn large_items_keep_their_order_among_small_ones<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&net, &tracker).await;
    let worker = net.worker(worker_settings(|b| b.lanes(1)), &tracker);
    let mut s = open(&worker, &frontend, 1).await;
    let item = |i: u8| {
        if i.is_multiple_of(3) {
            Bytes::from(vec![i; LARGE_ITEM_BYTES])
        } else {
            Bytes::from(vec![i; 10])
        }
    };
    let producer = tokio::spawn(async move {
        for i in 0..20u8 {
            if i.is_multiple_of(3) {
                s.send_bytes(item(i)).await.unwrap();
            } else {
                s.send(&item(i)).await.unwrap();
            }
            s.flush();
        }
        s.finish(Bytes::new()).await.unwrap();
    });
    let mut r = take(&mut inbox).await;
    for i in 0..20u8 {
        assert_eq!(next_item(&mut r).await, item(i), "item {i}");
    }
    assert_eq!(within("the end", r.recv()).await, None);
    within("the producer", producer).await.unwrap();
    assert_eq!(frontend.endpoint().stats().stale_drops, 0);
}

/// A handle that took a burst of items with its stream's end, and read them all, keeps no more
/// buffer than an empty queue does ([`ITEM_BUFFER_KEEP`]), however long it lives on.
pub async fn a_handle_that_read_a_burst_and_the_end_keeps_little_buffer<T: Transport>(net: T) {
    const ITEMS: usize = 16;
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&net, &tracker).await;
    let worker = worker(&net, &tracker);
    let mut s = open(&worker, &frontend, 1).await;
    let mut r = take(&mut inbox).await;
    let item = [7u8; 1024];
    let producer = tokio::spawn(async move {
        for _ in 0..ITEMS {
            s.send(&item).await.unwrap();
        }
        s.finish(Bytes::new()).await.unwrap();
    });
    // Every item reaches the frontend before the handle first looks: it takes them at once.
    eventually("every item received", || {
        r.peer().stats().payload_bytes_received >= (ITEMS * item.len()) as u64
    })
    .await;
    for _ in 0..ITEMS {
        assert_eq!(next_item(&mut r).await, &item[..]);
    }
    assert_eq!(within("the end", r.recv()).await, None);
    within("the producer", producer).await.unwrap();
    assert!(
        r.buffer_capacity() <= ITEM_BUFFER_KEEP,
        "a handle done reading keeps {} bytes of buffer",
        r.buffer_capacity()
    );
}

/// A large item: 1 MiB, past UCX's eager limit.
const LARGE_ITEM_BYTES: usize = 1 << 20;
