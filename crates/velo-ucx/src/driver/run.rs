//! The driver's loop and the commands it runs.

use std::collections::HashMap;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::lane::{End, Inbox, Lane};
use crate::message::{self, AM_ID, Header, Kind, MAX_MESSAGE_BYTES};
use crate::reorder::Reorder;
use crate::stats::Counters;
use crate::sys::{self, Arm, EpId, Started, Worker};
use crate::{UcxConfig, UcxError};

use super::*;

/// A driver, its listener's port and the lanes the listener connects (when listening).
pub(super) type Built = (Driver, Option<u16>, Option<mpsc::Receiver<Lane>>);

impl Driver {
    pub(super) fn new(
        cfg: &UcxConfig,
        listen: Option<SocketAddr>,
        cmd: mpsc::UnboundedReceiver<Command>,
        weak: mpsc::WeakUnboundedSender<Command>,
        counters: Arc<Counters>,
    ) -> Result<Built, UcxError> {
        let settings = sys::Settings {
            tls: cfg.tls(),
            net_devices: cfg.net_devices(),
        };
        let mut worker = Worker::new(settings, AM_ID).map_err(|e| UcxError::Init {
            step: e.step,
            status: e.status,
        })?;
        let (mut port, mut accepted, mut accepted_rx) = (None, None, None);
        if let Some(addr) = listen {
            port = Some(worker.listen(addr).map_err(|s| UcxError::Listen {
                addr,
                status: s.to_string(),
            })?);
            let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
            accepted = Some(tx);
            accepted_rx = Some(rx);
        }
        let driver = Self {
            lanes: Vec::new(),
            generations: Vec::new(),
            free: Vec::new(),
            by_ep: HashMap::new(),
            receives: HashMap::new(),
            next_receive: 0,
            writes: HashMap::new(),
            next_write: UNTRACKED,
            touched: Vec::new(),
            cmd,
            weak,
            accepted,
            counters,
            close_timeout: cfg.close_timeout(),
            max_queue: cfg.max_lane_queue_bytes(),
            shutting_down: false,
            worker,
        };
        Ok((driver, port, accepted_rx))
    }

    pub(super) async fn run(mut self) {
        let mut busy = 0u32;
        loop {
            let mut worked = false;
            for _ in 0..COMMAND_BUDGET {
                match self.cmd.try_recv() {
                    Ok(Command::Abort) => return,
                    Ok(c) => {
                        self.handle(c);
                        worked = true;
                    }
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => return,
                }
            }
            worked |= self.worker.progress();
            worked |= self.after_progress();
            // Due closes expire whether or not the pass found work.
            if self.next_deadline().is_some_and(|t| t <= Instant::now()) {
                self.expire_closes();
            }
            if self.shutting_down && self.live_lanes() == 0 {
                return;
            }
            if worked {
                busy += 1;
                if busy.is_multiple_of(YIELD_EVERY) {
                    tokio::task::yield_now().await;
                }
                continue;
            }
            busy = 0;
            match self.worker.arm() {
                Ok(Arm::Armed) => {}
                Ok(Arm::Busy) => continue,
                Err(status) => {
                    tracing::error!(%status, "ucp_worker_arm failed; the UCX transport stops");
                    return;
                }
            }
            let deadline = self.next_deadline();
            // Cancel safety: `recv` loses no command when dropped; `readable` only waits
            // (readiness is cleared once it resolved); the sleep is re-armed every round.
            tokio::select! {
                biased;
                c = self.cmd.recv() => match c {
                    None | Some(Command::Abort) => return,
                    Some(c) => self.handle(c),
                },
                r = self.worker.readable() => {
                    self.counters.wakeups.inc();
                    if let Err(e) = r {
                        tracing::error!(error = %e, "waiting on the UCX event fd failed");
                        return;
                    }
                }
                () = sleep_until(deadline) => self.expire_closes(),
            }
        }
    }

    fn live_lanes(&self) -> usize {
        self.by_ep.len()
    }

    fn handle(&mut self, c: Command) {
        match c {
            Command::Connect { addr, reply } => {
                let r = if self.shutting_down {
                    Err(ConnectFailure::Stopped)
                } else {
                    match self.worker.connect(addr) {
                        Ok(ep) => self.add_lane(ep).ok_or(ConnectFailure::Stopped),
                        Err(status) => Err(ConnectFailure::Ucx { addr, status }),
                    }
                };
                let _ = reply.send(r);
            }
            Command::Write {
                lane,
                chunks,
                permit,
            } => self.write(lane, chunks, permit),
            Command::Close { lane, done } => self.close(lane, done),
            Command::Release { lane } => {
                if self.entry(lane).is_some() {
                    self.remove(lane, None);
                }
            }
            Command::StopListening { done } => {
                self.worker.stop_listening();
                self.accepted = None;
                let _ = done.send(());
            }
            Command::Shutdown => {
                self.shutting_down = true;
                self.worker.stop_listening();
                self.accepted = None;
            }
            Command::Abort => unreachable!("handled by the loop"),
        }
    }

    pub(super) fn add_lane(&mut self, ep: EpId) -> Option<Lane> {
        let Some(cmd) = self.weak.upgrade() else {
            self.worker.close(ep);
            return None;
        };
        let index = self.free.pop().unwrap_or_else(|| {
            self.lanes.push(None);
            self.generations.push(0);
            u32::try_from(self.lanes.len() - 1).expect("fewer than 2^32 lanes")
        });
        let i = index as usize;
        self.generations[i] = self.generations[i].wrapping_add(1);
        let key = LaneKey {
            index,
            generation: self.generations[i],
        };
        let inbox = Arc::new(Inbox::default());
        let window = Arc::new(Semaphore::new(WRITE_WINDOW_KIB as usize));
        self.lanes[i] = Some(Entry {
            generation: key.generation,
            ep,
            inbox: inbox.clone(),
            rx: Reorder::new(MAX_MESSAGE_BYTES),
            staged: BytesMut::new(),
            tx_seq: 0,
            window: window.clone(),
            closing: None,
        });
        self.by_ep.insert(ep, key);
        Some(Lane::new(key, inbox, window, cmd))
    }

    pub(super) fn entry(&mut self, key: LaneKey) -> Option<&mut Entry> {
        self.lanes
            .get_mut(key.index as usize)
            .and_then(Option::as_mut)
            .filter(|e| e.generation == key.generation)
    }

    /// Forgets `lane`: force-closes its endpoint, delivers what it received, ends its inbox
    /// with `end` (unless it ended already) and answers whoever waits on it.
    pub(super) fn remove(&mut self, key: LaneKey, end: Option<End>) {
        let Some(mut e) = self
            .lanes
            .get_mut(key.index as usize)
            .filter(|slot| {
                slot.as_ref()
                    .is_some_and(|e| e.generation == key.generation)
            })
            .and_then(Option::take)
        else {
            return;
        };
        self.free.push(key.index);
        self.by_ep.remove(&e.ep);
        self.worker.close(e.ep);
        e.inbox.push(&mut e.staged);
        e.inbox
            .end(end.unwrap_or_else(|| End::Failed("the lane was closed".to_owned())));
        e.window.close();
        self.writes.retain(|_, w| w.lane != key);
        if let Some(c) = e.closing.take() {
            let _ = c.done.send(());
        }
    }

    /// The lane failed (peer's or transport's fault): every stream on it learns it once, from
    /// the mux, when its reader sees the error.
    pub(super) fn fail(&mut self, key: LaneKey, why: String) {
        tracing::debug!(lane = ?key, reason = %why, "ucx lane failed");
        self.remove(key, Some(End::Failed(why)));
    }

    fn write(&mut self, key: LaneKey, mut chunks: Vec<Bytes>, permit: OwnedSemaphorePermit) {
        let (ep, first_seq) = match self.entry(key) {
            Some(e) if e.closing.is_none() => (e.ep, e.tx_seq),
            // Closed, failed or closing: the writer learns it from its window or its reader.
            _ => return,
        };
        let mut messages = Vec::new();
        message::split(&mut chunks, MAX_MESSAGE_BYTES, &mut messages);
        self.next_write += 1;
        let token = self.next_write;
        let mut seq = first_seq;
        let mut remaining = 0;
        let mut failure = None;
        for m in messages {
            let header = Header {
                seq,
                kind: Kind::Data,
            }
            .encode();
            seq += 1;
            match self.worker.send(ep, AM_ID, &header, m, token) {
                Ok(Started::Done) => {}
                Ok(Started::Pending) => remaining += 1,
                Err(s) => {
                    failure = Some(s);
                    break;
                }
            }
        }
        self.counters.messages_sent.add(seq - first_seq);
        if let Some(s) = failure {
            self.fail(key, format!("UCX send failed: {s}"));
            return;
        }
        if let Some(e) = self.entry(key) {
            e.tx_seq = seq;
        }
        if remaining > 0 {
            self.writes.insert(
                token,
                InFlight {
                    lane: key,
                    remaining,
                    _permit: permit,
                },
            );
        }
    }

    fn close(&mut self, key: LaneKey, done: oneshot::Sender<()>) {
        let deadline = Instant::now() + self.close_timeout;
        let (ep, seq) = match self.entry(key) {
            Some(e) if e.closing.is_none() => {
                let seq = e.tx_seq;
                e.tx_seq += 1;
                e.closing = Some(Closing { deadline, done });
                (e.ep, seq)
            }
            _ => {
                let _ = done.send(());
                return;
            }
        };
        let header = Header {
            seq,
            kind: Kind::Fin,
        }
        .encode();
        let fin = self.worker.send(ep, AM_ID, &header, Vec::new(), UNTRACKED);
        let flush = fin.and_then(|_| self.worker.flush(ep, key.token()));
        match flush {
            Ok(Started::Pending) => {}
            Ok(Started::Done) | Err(_) => self.remove(key, Some(End::Closed)),
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.lanes
            .iter()
            .flatten()
            .filter_map(|e| e.closing.as_ref().map(|c| c.deadline))
            .min()
    }

    fn expire_closes(&mut self) {
        let now = Instant::now();
        let due: Vec<LaneKey> = self
            .lanes
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let e = e.as_ref()?;
                let c = e.closing.as_ref()?;
                (c.deadline <= now).then_some(LaneKey {
                    index: u32::try_from(i).ok()?,
                    generation: e.generation,
                })
            })
            .collect();
        for key in due {
            self.remove(key, Some(End::Closed));
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Every lane still here ends with an error its reader reports (exactly once, through
        // the mux); the worker (declared last) then closes the endpoints.
        for e in self.lanes.iter_mut().filter_map(Option::take) {
            e.inbox
                .end(End::Failed(ConnectFailure::Stopped.to_string()));
            e.window.close();
            if let Some(c) = e.closing {
                let _ = c.done.send(());
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod busy_close {
    use super::*;

    /// A closing lane whose flush never completes (a peer that stopped progressing) must be
    /// force-closed at its deadline even while other lanes keep the driver busy: the close
    /// deadline is the bound on `poll_close` (and so on a lane's and a frontend's shutdown).
    #[tokio::test(flavor = "current_thread")]
    async fn a_close_past_its_deadline_expires_while_the_driver_is_busy() {
        // A peer that listens and never progresses: the connection and the flush never complete.
        let mut peer = Worker::new(
            sys::Settings {
                tls: Some("tcp"),
                net_devices: Some("lo"),
            },
            AM_ID,
        )
        .expect("a UCX worker");
        let port = peer.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let (mut d, tx) = test_driver();
        let ep = d
            .worker
            .connect(SocketAddr::from(([127, 0, 0, 1], port)))
            .unwrap();
        let lane = d.add_lane(ep).unwrap();
        let key = lane.key();
        let (done, mut closed) = oneshot::channel();
        d.close(key, done);
        let c = d
            .entry(key)
            .and_then(|e| e.closing.as_mut())
            .expect("the flush is pending");
        // Already due: no time has to pass.
        c.deadline = Instant::now() - std::time::Duration::from_secs(1);
        let driver = tokio::spawn(d.run());
        // Other work every pass (any command is work; a release of an unknown lane is a no-op).
        let other = LaneKey {
            index: 9_999,
            generation: 1,
        };
        let mut turns = 0;
        while turns < 50 && closed.try_recv().is_err() {
            for _ in 0..100_000 {
                tx.send(Command::Release { lane: other }).unwrap();
            }
            tokio::task::yield_now().await;
            turns += 1;
        }
        let expired = closed.try_recv().is_ok() || turns < 50;
        tx.send(Command::Abort).unwrap();
        driver.await.unwrap();
        drop((lane, peer));
        assert!(
            expired,
            "a close past its deadline was not expired in {turns} busy driver turns"
        );
    }
}
