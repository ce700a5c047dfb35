//! What the driver does with the events UCX's callbacks queued.

use bytes::Bytes;

use crate::lane::End;
use crate::message::{Header, Kind};
use crate::stats::Counters;
use crate::sys::{Body, Event, Status};

use super::*;

impl Driver {
    /// Handles what the last progress pass queued. Returns whether there was anything.
    pub(super) fn after_progress(&mut self) -> bool {
        let mut worked = false;
        let mut events = Vec::new();
        let mut fails = Vec::new();
        // The worker is borrowed while its events are handled: only lane state is touched
        // inside, and failures (which close endpoints) are applied right after.
        let Self {
            worker,
            lanes,
            by_ep,
            receives,
            next_receive,
            touched,
            counters,
            ..
        } = self;
        worker.drain_events(|ev| {
            worked = true;
            match ev {
                Event::Message { ep, header, body } => {
                    let Some(&key) = by_ep.get(&ep) else { return };
                    let Some(e) = lanes
                        .get_mut(key.index as usize)
                        .and_then(Option::as_mut)
                        .filter(|e| e.generation == key.generation)
                    else {
                        return;
                    };
                    counters.messages_received.inc();
                    let r = on_message(e, header.as_slice(), body, counters, || {
                        *next_receive += 1;
                        *next_receive
                    });
                    match r {
                        Ok(Received::Pending(token, seq)) => {
                            receives.insert(token, (key, seq));
                        }
                        Ok(Received::Delivered) => touched.push(key),
                        Ok(Received::Ended) => fails.push((key, End::Fin)),
                        Err(why) => fails.push((key, End::Failed(why))),
                    }
                }
                Event::EpError { ep, status } => {
                    counters.endpoint_errors.inc();
                    if let Some(&key) = by_ep.get(&ep) {
                        fails.push((key, End::Failed(format!("UCX endpoint failed: {status}"))));
                    }
                }
                Event::SendDone { token, status } => events.push(Done::Send(token, status)),
                Event::RecvDone {
                    token,
                    status,
                    data,
                } => events.push(Done::Recv(token, status, data)),
                Event::FlushDone { token } => events.push(Done::Flush(token)),
            }
        });
        for done in events {
            self.on_done(done);
        }
        for (key, end) in fails {
            match end {
                End::Failed(why) => self.fail(key, why),
                end => self.remove(key, Some(end)),
            }
        }
        worked |= self.accept();
        self.deliver();
        worked
    }

    fn on_done(&mut self, done: Done) {
        match done {
            Done::Send(token, status) => {
                let Some(w) = self.writes.get_mut(&token) else {
                    return;
                };
                let lane = w.lane;
                w.remaining -= 1;
                if w.remaining == 0 {
                    self.writes.remove(&token);
                }
                if !status.is_ok() {
                    self.fail(lane, format!("UCX send failed: {status}"));
                }
            }
            Done::Recv(token, status, data) => {
                let Some((key, seq)) = self.receives.remove(&token) else {
                    return;
                };
                if !status.is_ok() {
                    self.fail(key, format!("UCX rendezvous receive failed: {status}"));
                    return;
                }
                let Some(e) = self.entry(key) else { return };
                match e.rx.on_complete(seq, Bytes::from(data), &mut e.staged) {
                    Ok(false) => self.touched.push(key),
                    Ok(true) => self.remove(key, Some(End::Fin)),
                    Err(err) => self.fail(key, err.to_string()),
                }
            }
            Done::Flush(token) => {
                let key = LaneKey::from_token(token);
                if self.entry(key).is_some_and(|e| e.closing.is_some()) {
                    self.remove(key, Some(End::Closed));
                }
            }
        }
    }

    /// Takes the listener's connection requests: accepted while the accept loop keeps up,
    /// rejected otherwise (or when not listening any more).
    fn accept(&mut self) -> bool {
        let requests = self.worker.take_conn_requests();
        if requests.is_empty() {
            return false;
        }
        let mut eps = Vec::new();
        for req in requests {
            let room = self
                .accepted
                .as_ref()
                .is_some_and(|tx| tx.capacity() > eps.len());
            if !room {
                self.counters.connections_refused.inc();
                drop(req); // rejects it
                continue;
            }
            let client = req.client();
            match req.accept() {
                Ok(ep) => eps.push(ep),
                Err(s) => {
                    tracing::debug!(?client, status = %s, "accepting a UCX connection failed")
                }
            }
        }
        for ep in eps {
            self.counters.connections_accepted.inc();
            let Some(lane) = self.add_lane(ep) else {
                continue;
            };
            let key = lane.key();
            let sent = self
                .accepted
                .as_ref()
                .is_some_and(|tx| tx.try_send(lane).is_ok());
            if !sent {
                self.remove(key, None);
            }
        }
        true
    }

    /// Moves staged bytes to their inboxes (one lock and one wake per lane per pass), failing
    /// lanes whose unread bytes pass the bound.
    fn deliver(&mut self) {
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable_by_key(|k| (k.index, k.generation));
        touched.dedup();
        for key in touched.drain(..) {
            let max = self.max_queue;
            let Some(e) = self.entry(key) else { continue };
            let unread = e.inbox.push(&mut e.staged) + e.rx.queued_bytes();
            if unread > max {
                self.fail(
                    key,
                    format!(
                        "more than {max} received bytes unread on the lane (peer ignores credit?)"
                    ),
                );
            }
        }
        self.touched = touched;
    }
}

enum Done {
    Send(u64, Status),
    Recv(u64, Status, Vec<u8>),
    Flush(u64),
}

enum Received {
    /// Bytes were staged (or queued behind a rendezvous message).
    Delivered,
    /// A rendezvous payload is on its way: token and message number.
    Pending(u64, u64),
    /// The peer's fin was reached.
    Ended,
}

fn on_message(
    e: &mut Entry,
    header: &[u8],
    body: Body<'_>,
    counters: &Counters,
    next_token: impl FnOnce() -> u64,
) -> Result<Received, String> {
    let Some(h) = Header::decode(header) else {
        return Err("the peer sent an active message that is not a velo-ucx lane message".into());
    };
    if e.rx.waiting() > 0 {
        counters.reordered.inc();
    }
    match (h.kind, body) {
        (Kind::Fin, _) => match e.rx.on_fin(h.seq) {
            Ok(true) => Ok(Received::Ended),
            Ok(false) => Ok(Received::Delivered),
            Err(err) => Err(err.to_string()),
        },
        (Kind::Data, Body::Eager(b)) => {
            e.rx.on_eager(h.seq, &b, &mut e.staged)
                .map(|_| Received::Delivered)
                .map_err(|err| err.to_string())
        }
        (Kind::Data, Body::Rndv(desc)) => {
            counters.rendezvous_received.inc();
            e.rx.on_rndv(h.seq, desc.len())
                .map_err(|err| err.to_string())?;
            let token = next_token();
            match desc.receive(token) {
                Ok(Some(data)) => match e.rx.on_complete(h.seq, Bytes::from(data), &mut e.staged) {
                    Ok(true) => Ok(Received::Ended),
                    Ok(false) => Ok(Received::Delivered),
                    Err(err) => Err(err.to_string()),
                },
                Ok(None) => Ok(Received::Pending(token, h.seq)),
                Err(s) => Err(format!("UCX rendezvous receive failed: {s}")),
            }
        }
    }
}

#[cfg(test)]
mod late_events {
    use super::*;

    /// A rendezvous receive of lane A fails after A is gone (its endpoint failed, or both halves
    /// were released: the force close cancels the receive), and a new lane B took A's slot
    /// meanwhile. The stale failure must not end B.
    #[tokio::test]
    async fn a_stale_failed_receive_leaves_the_lane_that_reuses_its_slot_alone() {
        let (mut d, _tx) = test_driver();
        // Nothing listens there; a failure to connect would only come as a later event.
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let ep_a = d.worker.connect(addr).unwrap();
        let lane_a = d.add_lane(ep_a).unwrap();
        let a = lane_a.key();
        // A has a rendezvous payload on its way.
        d.receives.insert(7, (a, 0));
        d.remove(a, Some(End::Failed("UCX endpoint failed".into())));
        // The status UCX reports for an operation on a closed endpoint.
        let status = d.worker.flush(ep_a, 0).expect_err("the endpoint is closed");
        // A new lane (an accepted or dialed one) takes the free slot.
        let ep_b = d.worker.connect(addr).unwrap();
        let lane_b = d.add_lane(ep_b).unwrap();
        let b = lane_b.key();
        assert_eq!(b.index, a.index, "the slot is reused");
        // A's cancelled receive completes now.
        d.on_done(Done::Recv(7, status, Vec::new()));
        assert!(
            d.entry(b).is_some(),
            "lane B was ended by lane A's stale rendezvous failure"
        );
        drop((lane_a, lane_b));
    }
}
