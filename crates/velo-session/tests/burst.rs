//! A connection's per-stream tables follow its live streams: after a burst of streams that
//! all waited (each registered its wakers), releasing them gives the memory back.

mod common;

use common::World;
use futures::FutureExt;

#[tokio::test(start_paused = true)]
async fn a_bursts_waker_table_is_given_back_when_its_streams_are_released() {
    let mut w = World::new();
    let mut streams = Vec::new();
    for ticket in 0..2_000 {
        let (tx, mut rx) = w.stream(ticket).await;
        // The frontend's reader waits for an item: its waker goes into the table.
        assert!(rx.recv().now_or_never().is_none());
        streams.push((tx, rx));
    }
    let peer = w.frontend.peers().pop().expect("one connection");
    let peak = peer.waker_capacity();
    assert!(peak >= 2_000, "the burst registered {peak} waker slots");
    drop(streams);
    common::eventually("the streams released", || {
        peer.lane_streams().iter().sum::<u32>() == 0
    })
    .await;
    let kept = peer.waker_capacity();
    assert!(
        kept <= 128,
        "the waker table keeps {kept} slots after the burst (peak {peak})"
    );
    w.shut_down().await;
}
