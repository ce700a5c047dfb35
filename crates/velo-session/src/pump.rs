//! The two tasks that run each lane: a reader feeding the mux, and a writer draining it and
//! running the lane's timers.

use std::time::Instant;

use bytes::BytesMut;
use velo_mux::{LaneId, LaneState, MAX_TRANSMIT_CHUNKS};

use crate::io::{LaneRead, LaneWrite};
use crate::peer::Peer;

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
        // Cancel safety: `LaneRead::read` loses no bytes when dropped, and the token only
        // fires when the lane is being torn down anyway.
        let result = tokio::select! {
            r = read.read(&mut buf) => r,
            () = token.cancelled() => break,
        };
        match result {
            Ok(0) => {
                peer.with(|st, _| st.mux.handle_lane_lost(lane, "peer closed the connection"));
                break;
            }
            Err(e) => {
                peer.with(|st, _| st.mux.handle_lane_lost(lane, format!("read failed: {e}")));
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

/// Writes the mux's batches for `lane`, runs its timers (flush deadline, heartbeat, idle
/// timeout), and closes the transport once the lane is closed.
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
            // Cancel safety: abandoning a write loses the rest of the batch, which is the point
            // of an abort (the peer may have stopped reading).
            let result = tokio::select! {
                r = write.write(&mut chunks) => r,
                () = ctl.token.cancelled() => Err(std::io::Error::other("lane aborted")),
            };
            if let Err(e) = result {
                chunks.clear();
                peer.with(|st, _| st.mux.handle_lane_lost(lane, format!("write failed: {e}")));
                break;
            }
            continue;
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
                peer.with(|st, _| st.mux.handle_lane_lost(lane, "endpoint aborted"));
                break;
            }
        }
    }
    if !ctl.token.is_cancelled()
        && let Err(e) = write.close().await
    {
        tracing::debug!(%lane, error = %e, "closing the lane's transport failed");
    }
    ctl.token.cancel();
    tracing::debug!("lane down");
    peer.pump_ended();
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}
