//! Whatever a peer sends, what this side holds for it stays within its configured bounds.

mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{MemNet, addr, frontend_config, frontend_with, within, worker_config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::task::TaskTracker;
use velo_wire::{Batch, Frame, Record, StreamId, Token};

/// Refuses every stream (dropping an incoming stream refuses it).
struct RefuseAll;

impl velo_session::Acceptor for RefuseAll {
    fn accept(&self, incoming: velo_session::IncomingStream) {
        drop(incoming);
    }
}

/// A batch of `n` OPENs with tickets nobody registered (each is refused with a CANCEL).
fn refused_opens(first_slot: u32, n: u32) -> Bytes {
    let records: Vec<Record> = (first_slot..first_slot + n)
        .map(|slot| Record::Open {
            stream: StreamId::new(slot % 60_000, slot / 60_000 + 1),
            ticket: u64::from(slot),
            token: Token([0; 16]),
            prologue: Bytes::from_static(br#"{"error":null}"#),
        })
        .collect();
    let mut buf = BytesMut::new();
    Frame::Batch(Batch::from_records(&records)).encode(&mut buf);
    buf.freeze()
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_floods_refused_opens_and_never_reads_cannot_grow_the_queue() {
    const LIMIT: usize = 64 * 1024;
    let tracker = TaskTracker::new();
    // Every stream is refused: each OPEN costs the frontend a CANCEL. The churn limit would
    // close the lane long before (velo-mux's tests/churn.rs): lifted here, so the queue's
    // own bound is what this story checks.
    let unlimited = velo_mux::ChurnLimit {
        burst: u32::MAX,
        per_second: u32::MAX,
    };
    let endpoint = frontend_with(
        &tracker,
        frontend_config(|b| b.max_buffered_bytes(LIMIT).churn_limit(unlimited)),
        std::sync::Arc::new(RefuseAll),
    );
    let net = MemNet::new();
    net.serve(&endpoint);
    let (mut raw, _lane) = net.raw(addr());
    handshake(&mut raw, &endpoint).await;
    // Write OPENs until the frontend stops taking them (it stops reading), at most 8 MiB.
    let mut written = 0;
    let mut slot = 0;
    while written < 8 << 20 {
        let batch = refused_opens(slot, 500);
        slot += 500;
        match tokio::time::timeout(Duration::from_secs(1), raw.write_all(&batch)).await {
            Ok(Ok(())) => written += batch.len(),
            Ok(Err(e)) => panic!("the frontend closed the lane: {e}"),
            Err(_) => break, // it stopped reading
        }
    }
    let peer = endpoint.peers().pop().expect("the hostile connection");
    let queued = peer.buffered_bytes();
    // One read's worth of refusals may land past the limit before the reader stops.
    assert!(
        queued <= LIMIT + velo_session::DEFAULT_READ_BUFFER,
        "{queued} bytes queued for a peer that does not read (limit {LIMIT}) after it \
         wrote {written} bytes"
    );
    assert!(
        written < 8 << 20,
        "the frontend kept reading all {written} bytes"
    );
    endpoint.abort();
    tracker.close();
    within("every task ending", tracker.wait()).await;
}

/// Sends a worker's HELLO for a one-lane connection and reads the frontend's answer.
async fn handshake(raw: &mut tokio::io::DuplexStream, frontend: &velo_session::FrontendEndpoint) {
    let hello = worker_config(|b| b.lanes(1)).hello(
        0,
        velo_session::new_instance_id(),
        frontend.instance(),
    );
    let mut out = BytesMut::new();
    Frame::Hello(hello).encode(&mut out);
    raw.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    let mut decoder = velo_wire::FrameDecoder::new(velo_wire::MIN_MAX_FRAME_LEN);
    let answer = within("the frontend's answer", async {
        loop {
            if let Some(frame) = decoder.decode(&mut buf).unwrap() {
                return frame;
            }
            assert!(raw.read_buf(&mut buf).await.unwrap() > 0, "the lane ended");
        }
    })
    .await;
    assert!(matches!(answer, Frame::Hello(_)), "{answer:?}");
}
