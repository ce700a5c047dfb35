//! Scale on loopback, in a test binary of its own so that its CPU load does not disturb the
//! timing assertions of `loopback.rs` (cargo runs test binaries one after another).

mod common;

use std::time::Instant;

use bytes::Bytes;
use common::*;
use tokio_util::task::TaskTracker;
use velo_mux::StreamEnd;
use velo_wire::Token;

const PROLOGUE: &[u8] = br#"{"error":null}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_streams_of_a_hundred_items_arrive_in_order() {
    const STREAMS: u64 = 1000;
    const ITEMS: usize = 100;
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&tracker).await;
    let worker = worker(&tracker);
    let (addr, id) = (frontend.local_addr(), frontend.instance());
    let started = Instant::now();
    let producers = tokio::spawn({
        let worker = worker.clone();
        async move {
            let mut tasks = Vec::new();
            for t in 0..STREAMS {
                let mut s = worker
                    .endpoint()
                    .open(addr, id, t, &Token([0; 16]), PROLOGUE)
                    .await
                    .unwrap();
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
        }
    });
    let mut consumers = Vec::new();
    for _ in 0..STREAMS {
        let incoming = within("accept", inbox.recv()).await.unwrap();
        let t = incoming.ticket();
        assert_eq!(incoming.prologue(), &Bytes::from_static(PROLOGUE));
        let mut r = incoming.accept();
        consumers.push(tokio::spawn(async move {
            let mut n = 0;
            while let Some(item) = r.recv().await {
                assert_eq!(
                    item.unwrap(),
                    format!("{t}:{n}").as_bytes(),
                    "stream {t} item {n}"
                );
                n += 1;
            }
            assert_eq!(r.end(), Some(&StreamEnd::Finished));
            n
        }));
    }
    for c in consumers {
        assert_eq!(within("consumer", c).await.unwrap(), ITEMS);
    }
    within("producers", producers).await.unwrap();
    eprintln!(
        "{} records in {:?}",
        STREAMS * ITEMS as u64,
        started.elapsed()
    );
    let stats = frontend.endpoint().stats();
    assert_eq!(stats.streams_finished, STREAMS);
    assert_eq!(stats.stale_drops, 0);
}
