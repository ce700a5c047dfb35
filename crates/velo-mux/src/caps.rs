//! Per-lane caps on what a peer's input makes this side hold, whatever it sends:
//!
//! - **pending opens** (frontend): streams the worker opened that the application has not
//!   answered yet (ACCEPT or CANCEL). Past `max_pending_opens` an OPEN is refused with CANCEL
//!   `too_many_streams` before any stream state is kept, counted `pending_opens_refused`,
//!   and it is churn (the churn limit closes a lane that keeps at it). Input pauses at half
//!   of it ([`Mux::wants_input`]) until the application answers, so a legitimate burst waits
//!   in the socket; only input already read (one frame can carry thousands of OPENs) can
//!   reach the cap.
//! - **control bytes** (both sides): records that carry no stream payload (ACCEPT, CANCEL,
//!   CREDIT, STOP, HEARTBEAT, GOAWAY), queued and not yet taken by the transport. Input
//!   pauses at half of `max_control_bytes` ([`Mux::wants_input`]), so a peer that merely
//!   reads slowly is held back; input that queues past it anyway (one frame can carry up to
//!   `max_frame_len` of records) closes the lane with CLOSE `limit`
//!   ([`LaneError::ControlQueueFull`]), counted `control_queue_closes`. Control records
//!   answer input already decoded, and dropping or delaying them would break the protocol
//!   (every OPEN answered, credit returned): a peer that lets them pile up past the cap does
//!   not read, and loses nothing a reading peer would get.

use velo_wire::Record;

use crate::stream::Half;
use crate::{LaneError, LaneId, Mux, MuxEvent, StreamKey};

impl Mux {
    /// Frontend: whether `lane` holds `max_pending_opens` unanswered streams (an OPEN must
    /// be refused).
    pub(crate) fn pending_opens_full(&self, lane: LaneId) -> bool {
        self.lanes
            .get(usize::from(lane.0))
            .is_none_or(|l| l.pending_opens >= self.config.max_pending_opens)
    }

    /// Frontend: a stream opened on `lane` waits for the application's answer.
    pub(crate) fn opened_pending(&mut self, lane: LaneId) {
        if let Some(l) = self.lanes.get_mut(usize::from(lane.0)) {
            l.pending_opens += 1;
        }
    }

    /// Frontend: `key` was answered (ACCEPT or CANCEL): it no longer counts against its
    /// lane's pending opens. Call it where `answered` becomes true.
    pub(crate) fn answered(&mut self, key: StreamKey) {
        let Some(s) = self.streams.get_mut(key) else {
            return;
        };
        let Half::Recv(r) = &mut s.half else { return };
        let lane = s.lane;
        if std::mem::take(&mut r.pending)
            && let Some(l) = self.lanes.get_mut(usize::from(lane.0))
        {
            l.pending_opens = l.pending_opens.saturating_sub(1);
            self.resume_input(lane);
        }
    }

    /// A lane whose input [`Mux::wants_input`] paused resumes ([`MuxEvent::LaneWritable`])
    /// once every bound that pauses it has room again: the bytes queued for the peer at half
    /// of `max_buffered_bytes` or less, its control bytes and its unanswered OPENs under half
    /// of their caps. Called wherever one of them falls: a transmit, an answer.
    pub(crate) fn resume_input(&mut self, lane: LaneId) {
        let Some(l) = self.lanes.get_mut(usize::from(lane.0)) else {
            return;
        };
        if l.blocked
            && l.tx.buffered() <= self.config.max_buffered_bytes / 2
            && l.tx.control_bytes() < self.config.max_control_bytes / 2
            && l.pending_opens < self.config.pending_opens_pause()
        {
            l.blocked = false;
            self.events.push_back(MuxEvent::LaneWritable(lane));
        }
    }

    /// Frontend: `lane` closed; its unanswered streams no longer count against it (a lane
    /// that comes up again starts from none).
    pub(crate) fn forget_pending(&mut self, lane: LaneId) {
        let Some(l) = self.lanes.get_mut(usize::from(lane.0)) else {
            return;
        };
        if std::mem::take(&mut l.pending_opens) == 0 {
            return;
        }
        let counted: Vec<StreamKey> = self
            .streams
            .iter()
            .filter(|(_, s)| s.lane == lane && matches!(&s.half, Half::Recv(r) if r.pending))
            .map(|(k, _)| k)
            .collect();
        for key in counted {
            if let Some(s) = self.streams.get_mut(key)
                && let Half::Recv(r) = &mut s.half
            {
                r.pending = false;
            }
        }
    }

    /// The lane's control bytes are within `max_control_bytes`.
    ///
    /// # Errors
    ///
    /// [`LaneError::ControlQueueFull`] (counted) when input queued more.
    pub(crate) fn check_control_bytes(&mut self, lane: LaneId) -> Result<(), LaneError> {
        let max = self.config.max_control_bytes;
        let queued = self
            .lanes
            .get(usize::from(lane.0))
            .map_or(0, |l| l.tx.control_bytes());
        if queued <= max {
            return Ok(());
        }
        self.stats.control_queue_closes += 1;
        Err(LaneError::ControlQueueFull { max })
    }
}

/// Whether `record` is a control record: one that carries no stream payload (ACCEPT, CANCEL,
/// CREDIT, STOP, HEARTBEAT, GOAWAY), bounded per lane by `max_control_bytes`.
pub(crate) fn is_control(record: &Record) -> bool {
    !matches!(
        record,
        Record::Open { .. } | Record::Data { .. } | Record::Final { .. } | Record::Error { .. }
    )
}
