//! What only UCX shows, on real loopback endpoints (UCX_TLS=tcp over lo); the stories every
//! transport shares are the contract suite (`contract.rs`). Every wait is bounded.

#![cfg(feature = "ucx")]

mod common;

use bytes::Bytes;
use common::Ucx;
use tokio_util::task::TaskTracker;
use velo_mux::StreamEnd;
use velo_session::contract::{
    self, PROLOGUE, RawPeer, Worker, eventually, handshaken_by_hand, next_item, take, within,
};
use velo_ucx::{ProgressEngine, UcxConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_items_cross_by_rendezvous() {
    // The contract checks that large items keep their order; this, that they take the path
    // whose order UCX does not keep (their payload lands after later eager messages).
    let (net, tracker) = (Ucx::default(), TaskTracker::new());
    let (frontend, mut inbox) = contract::frontend(&net, &tracker).await;
    let worker = contract::worker(&net, &tracker);
    let mut s = contract::open(&worker, &frontend, 1).await;
    let big = Bytes::from(vec![7; 1 << 20]);
    within("a send", s.send_bytes(big.clone())).await.unwrap();
    s.flush();
    let mut r = take(&mut inbox).await;
    assert_eq!(next_item(&mut r).await, big);
    let st = frontend.transport().stats();
    assert!(st.rendezvous_received > 0, "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_closed_by_the_peer_ends_every_stream_on_it_once() {
    // A worker-side peer that handshakes by hand and then force-closes its endpoint: the
    // frontend's streams on that lane end as lost, each exactly once, and UCX counts the
    // endpoint error.
    let (net, tracker) = (Ucx::default(), TaskTracker::new());
    let (frontend, mut inbox) = contract::frontend(&net, &tracker).await;
    let mut lane = handshaken_by_hand(&net, &frontend).await;
    // Two streams opened by hand, one DATA each.
    let mut batch = Vec::new();
    for slot in 0..2u8 {
        batch.extend_from_slice(&[0x01, slot, 0x00, 0x01]); // OPEN slot g0, ticket 1
        batch.extend_from_slice(&[0; 16]); // token
        batch.push(u8::try_from(PROLOGUE.len()).unwrap());
        batch.extend_from_slice(PROLOGUE);
        batch.extend_from_slice(&[0x02, slot, 0x00, 0x00, 0x01, b'x']); // DATA seq 0, "x"
    }
    let mut frame = vec![0x02];
    frame.extend_from_slice(&u32::try_from(batch.len()).unwrap().to_le_bytes());
    frame.extend_from_slice(&batch);
    lane.write(&frame).await.unwrap();
    let mut receivers = Vec::new();
    for _ in 0..2 {
        let mut r = take(&mut inbox).await;
        assert_eq!(next_item(&mut r).await, &b"x"[..]);
        receivers.push(r);
    }
    drop(lane); // every endpoint of the raw peer is force-closed
    for mut r in receivers {
        let end = within("the end", r.recv())
            .await
            .expect("an end is reported");
        assert!(matches!(end, Err(StreamEnd::Lost(_))), "{end:?}");
        assert_eq!(within("then nothing", r.recv()).await, None);
    }
    // The driver may fail the lane (a send failing) before it counts the endpoint error.
    eventually("an endpoint error is counted", || {
        frontend.transport().stats().endpoint_errors >= 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_thread_engine_carries_streams_too() {
    let net = Ucx {
        cfg: UcxConfig::loopback()
            .to_builder()
            .engine(ProgressEngine::Thread)
            .build()
            .unwrap(),
    };
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = contract::frontend(&net, &tracker).await;
    let worker = contract::worker(&net, &tracker);
    let mut s = contract::open(&worker, &frontend, 1).await;
    let producer = tokio::spawn(async move {
        for i in 0..1000u32 {
            s.send(&i.to_le_bytes()).await.unwrap();
        }
        s.finish(Bytes::new()).await.unwrap();
    });
    let mut r = take(&mut inbox).await;
    for i in 0..1000u32 {
        assert_eq!(next_item(&mut r).await, &i.to_le_bytes()[..]);
    }
    assert_eq!(within("the end", r.recv()).await, None);
    within("the producer", producer).await.unwrap();
    within("shutdown", frontend.shutdown()).await;
    worker.close();
    tracker.close();
    within("the progress threads end", tracker.wait()).await;
}
