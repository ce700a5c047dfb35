//! The two tasks that run each lane: a reader feeding the mux, and a writer draining it and
//! running the lane's timers, **also while a write is blocked** (a peer that stops reading
//! or goes silent is detected by the mux's idle and write-stall timeouts, not by TCP).
//!
//! Either task ending ends the lane: the reader's end closes the lane in the mux, which wakes
//! the writer (it gets [`CLOSE_GRACE`] to finish its write and send a CLOSE frame, then gives
//! up); the writer's end cancels the lane's token, which stops the reader.

use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use velo_mux::{LaneId, LaneState, MAX_TRANSMIT_CHUNKS, TransportEnd};

use crate::io::{self as lane_io, LaneRead, LaneWrite};
use crate::peer::Peer;

/// How long a closing lane's writer may still spend finishing the write in progress, sending
/// the CLOSE frame and closing the transport, before it abandons them. A peer that does not
/// read for that long gets no CLOSE: it will see the transport end instead.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Feeds received bytes to the mux until the lane ends.
pub(crate) async fn run_reader(
    peer: Peer,
    lane: LaneId,
    mut read: Box<dyn LaneRead>,
    read_buffer: usize,
) {
    let token = peer.inner.lanes[usize::from(lane.0)].token.clone();
    let mut buf = BytesMut::with_capacity(read_buffer);
    loop {
        if buf.capacity() - buf.len() < read_buffer / 4 {
            buf.reserve(read_buffer);
        }
        // Cancel safety: `LaneRead::read` loses no bytes when dropped, waiting for room loses
        // nothing, and the token only fires when the lane is being torn down anyway.
        let result = tokio::select! {
            r = async {
                room_for_input(&peer, lane).await;
                lane_io::read(&mut *read, &mut buf).await
            } => r,
            () = token.cancelled() => break,
        };
        match result {
            Ok(0) => {
                peer.with(|st, _| st.mux.handle_lane_lost(lane, TransportEnd::Closed));
                break;
            }
            Err(e) => {
                peer.with(|st, _| st.mux.handle_lane_lost(lane, TransportEnd::read(e)));
                break;
            }
            Ok(_) => {
                if peer
                    .with(|st, now| st.mux.handle_input(now, lane, &mut buf))
                    .is_err()
                {
                    // The mux closed the lane and queued a CLOSE frame; the writer sends it.
                    break;
                }
            }
        }
    }
    peer.pump_ended();
}

/// Waits while the bytes queued for the peer on `lane` are at their limit: input could
/// queue more (refusals, violations), and a peer that does not read must not grow them.
async fn room_for_input(peer: &Peer, lane: LaneId) {
    std::future::poll_fn(|cx| {
        peer.with(|st, _| {
            if st.mux.wants_input(lane) {
                Poll::Ready(())
            } else {
                Peer::register_lane(st, lane, cx.waker());
                Poll::Pending
            }
        })
    })
    .await;
}

/// Writes the mux's batches for `lane`, runs its timers (flush deadline, heartbeat, idle and
/// write-stall timeouts), and closes the transport once the lane is closed.
pub(crate) async fn run_writer(peer: Peer, lane: LaneId, mut write: Box<dyn LaneWrite>) {
    let ctl = &peer.inner.lanes[usize::from(lane.0)];
    let mut chunks = Vec::with_capacity(MAX_TRANSMIT_CHUNKS);
    loop {
        let (deadline, state) = peer.with(|st, now| {
            st.mux.handle_lane_timeout(now, lane);
            while chunks.len() < MAX_TRANSMIT_CHUNKS
                && st.mux.poll_transmit(now, lane, &mut chunks).is_some()
            {}
            (st.mux.lane_timeout(lane), st.mux.lane_state(lane))
        });
        if !chunks.is_empty() {
            let closing = (state != LaneState::Up).then(tokio::time::Instant::now);
            if write_chunks(&peer, lane, &mut *write, &mut chunks, closing).await {
                continue;
            }
            break;
        }
        if state != LaneState::Up {
            break;
        }
        // Cancel safety: a dropped `Notified` loses nothing (`notify_one` keeps a permit), and
        // the sleep is re-armed from the mux's deadline every round.
        tokio::select! {
            () = ctl.notify.notified() => {}
            () = sleep_until(deadline) => {}
            () = ctl.token.cancelled() => {
                // Aborted from outside: the lane ends now, its streams as lost.
                peer.with(|st, _| st.mux.handle_lane_lost(lane, TransportEnd::Aborted));
                break;
            }
        }
    }
    if !ctl.token.is_cancelled() {
        match tokio::time::timeout(CLOSE_GRACE, lane_io::close(&mut *write)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(%lane, error = %e, "closing the lane's transport failed"),
            Err(_) => tracing::debug!(%lane, "closing the lane's transport timed out"),
        }
    }
    ctl.token.cancel();
    tracing::debug!("lane down");
    peer.pump_ended();
}

/// Writes `chunks` while the lane's timers keep running. Returns whether the writer should go
/// on (the chunks were written; a closed lane then still sends its CLOSE frame); `false` once
/// the write failed or was abandoned.
///
/// `closing` is when the lane was seen closed (the chunks then hold its CLOSE frame): the
/// write gets [`CLOSE_GRACE`] from then.
async fn write_chunks(
    peer: &Peer,
    lane: LaneId,
    write: &mut dyn LaneWrite,
    chunks: &mut Vec<Bytes>,
    mut closing: Option<tokio::time::Instant>,
) -> bool {
    let ctl = &peer.inner.lanes[usize::from(lane.0)];
    let done = {
        let mut written = std::pin::pin!(lane_io::write(write, chunks));
        loop {
            let deadline = match closing {
                Some(since) => Some((since + CLOSE_GRACE).into_std()),
                None => peer.with(|st, _| st.mux.lane_timeout(lane)),
            };
            // Cancel safety: dropping the write abandons the rest of the batch, which is the
            // point when the lane is gone or aborted; the other branches lose nothing.
            tokio::select! {
                r = &mut written => break Some(r),
                () = ctl.token.cancelled() => {
                    peer.with(|st, _| st.mux.handle_lane_lost(lane, TransportEnd::Aborted));
                    break None;
                }
                () = sleep_until(deadline) => {
                    if closing.is_some() {
                        tracing::debug!(%lane, "abandoning the write of a closed lane");
                        break None;
                    }
                    // Idle and write-stall timeouts run while the write waits.
                    if lane_closed(peer, lane, |st, now| st.mux.handle_lane_timeout(now, lane)) {
                        closing = Some(tokio::time::Instant::now());
                    }
                }
                () = ctl.notify.notified() => {
                    if closing.is_none() && lane_closed(peer, lane, |_, _| {}) {
                        // The reader ended the lane (the peer closed, or sent garbage).
                        closing = Some(tokio::time::Instant::now());
                    }
                }
            }
        }
    };
    chunks.clear();
    match done {
        Some(Ok(())) => {
            peer.with(|st, now| st.mux.handle_transmitted(now, lane));
            true
        }
        Some(Err(e)) => {
            peer.with(|st, _| st.mux.handle_lane_lost(lane, TransportEnd::write(e)));
            false
        }
        None => false,
    }
}

/// Runs `f` on the locked state, then says whether `lane` is no longer up.
fn lane_closed(
    peer: &Peer,
    lane: LaneId,
    f: impl FnOnce(&mut crate::peer::PeerState, Instant),
) -> bool {
    peer.with(|st, now| {
        f(st, now);
        st.mux.lane_state(lane) != LaneState::Up
    })
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}
