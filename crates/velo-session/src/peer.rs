//! One connection to a peer: the mux behind a mutex, the wakers of its stream handles, and
//! the signals of its lane pumps.
//!
//! # Why a mutex and not a single-owner task
//!
//! STYLE.md prefers a single owner with channels. Here a channel hop per item would cost a
//! task wake per record (~200 ns for a `tokio::sync::mpsc`, ~50 us when it crosses threads on
//! our machines), while the mux work per record is ~30 ns. So the mux lives in a `Mutex`
//! shared by the lane pumps and the stream handles, and every lock does a whole batch of work:
//! a reader locks once per socket read (hundreds of records), a writer once per transmit. A
//! frontend stream's handle is handed its items by the reader, into its own mailbox
//! ([`Mailbox`]), and takes this lock only for what arrived while it was away. No lock is
//! ever held across an `.await`; a mailbox's lock is only ever taken after this one.

use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use velo_mux::{LaneId, LaneState, Mux, MuxEvent, MuxStats, StreamKey};
use velo_wire::{Hello, InstanceId, Token};

use crate::mailbox::Mailbox;
use crate::recv::IncomingStream;
use crate::{LaneIo, clock, pump};

/// Capacity (in entries) below which the waker table is not shrunk: small tables are cheap
/// and shrinking them would only make bursts reallocate.
const SHRINK_ABOVE: usize = 64;

/// A lane [`Peer::start_lane`] did not start, handed back with why.
pub(crate) struct NotStarted {
    pub(crate) io: LaneIo,
    pub(crate) why: Refusal,
}

/// Why a lane was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The connection is done (its lanes all died): the lane belongs on a new one.
    Done,
    /// A lane with its index is up already.
    InUse,
}

/// The counters of an endpoint's connections that are done, shared with each of them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Retired(Arc<Mutex<MuxStats>>);

impl Retired {
    pub(crate) fn lock(&self) -> MutexGuard<'_, MuxStats> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The retired counters plus those of every connection of `peers` not done yet.
    pub(crate) fn total<'a>(&self, peers: impl IntoIterator<Item = &'a Peer>) -> MuxStats {
        let retired = self.lock();
        let mut total = *retired;
        for p in peers {
            if !p.inner.done.is_cancelled() {
                total += p.stats();
            }
        }
        total
    }
}

/// Hands the frontend every stream a worker opens.
pub trait Acceptor: Send + Sync + 'static {
    /// Called once per OPEN, outside any lock. The acceptor checks the ticket and token and
    /// either keeps the stream ([`IncomingStream::accept`]) or refuses it
    /// ([`IncomingStream::refuse`]); dropping it refuses it too. Answer within the worker's
    /// idle timeout: a worker closes a lane that leaves an OPEN unanswered that long.
    fn accept(&self, incoming: IncomingStream);
}

/// A stream lost before the frontend accepted it: its registration, and how many more times
/// an announcement of it may itself be announced.
pub(crate) type LostOpen = (u64, Token, u8);

/// Called (outside any lock) with the connection and the streams whose lane died before the
/// frontend accepted them, to announce their loss elsewhere.
pub(crate) type LostOpens = Arc<dyn Fn(&Peer, Vec<LostOpen>) + Send + Sync>;

/// A connection to one peer (one worker process or one frontend instance). Cheap to clone.
#[derive(Clone)]
pub struct Peer {
    pub(crate) inner: Arc<PeerInner>,
}

pub(crate) struct PeerInner {
    state: Mutex<PeerState>,
    pub(crate) lanes: Box<[LaneCtl]>,
    instance: InstanceId,
    /// The worker's discovery instance, as its HELLO announced it (frontend).
    worker_instance: Option<u64>,
    /// Some lane is up: read without the lock on the worker's per-request fast path.
    alive: AtomicBool,
    /// The peer sent GOAWAY: it takes no new streams on this connection.
    going_away: AtomicBool,
    /// Lane pumps still running.
    pumps: AtomicU16,
    /// Cancelled when every lane is closed and its pumps have ended.
    pub(crate) done: CancellationToken,
    /// Where the connection's counters go when it is done, so its endpoint's totals never
    /// go down (they are exported as monotonic counters).
    retired: Retired,
    acceptor: Option<Arc<dyn Acceptor>>,
    /// Worker: announces streams lost before the frontend accepted them.
    on_lost: Option<LostOpens>,
}

/// What a lane's pumps listen to.
pub(crate) struct LaneCtl {
    /// Wakes the lane's writer: something to transmit, or the lane closed.
    pub(crate) notify: Notify,
    /// Stops the lane's tasks at once: cancelled by the writer when the lane has closed, or
    /// by the endpoint's abort (then a write in progress is abandoned).
    pub(crate) token: CancellationToken,
}

/// The state behind the lock.
pub(crate) struct PeerState {
    pub(crate) mux: Mux,
    wakers: Vec<Option<StreamWakers>>,
    lane_waiters: Vec<Vec<Waker>>,
    incoming: Vec<(StreamKey, u64, Token, Bytes)>,
    /// Worker: registrations of streams lost before the frontend accepted them.
    lost_opens: Vec<LostOpen>,
    /// Handles to wake once the lock is released (woken under it, a handle on another thread
    /// would only run into the lock).
    to_wake: Vec<Waker>,
    /// A lane closed since the last check of the connection's liveness.
    lane_closed: bool,
}

/// Wakers of one stream's handle, by what they wait for.
struct StreamWakers {
    generation: u32,
    /// Frontend: where the lane readers hand the stream's items to its handle.
    mailbox: Option<Arc<Mailbox>>,
    /// Worker: credit came back, or the stream ended.
    send: Option<Waker>,
    /// Worker: the frontend asked to stop, or the stream ended (several watchers may wait).
    stop: Vec<Waker>,
    /// Worker: the stream was ended by the frontend or its lane (several watchers may wait).
    closed: Vec<Waker>,
}

/// Which waker a handle registers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WakeOn {
    Send,
    Stop,
    Closed,
}

impl Peer {
    /// A connection over `mux`. Its lanes stop at once when `abort` is cancelled.
    pub(crate) fn new(
        mux: Mux,
        instance: InstanceId,
        worker_instance: Option<u64>,
        acceptor: Option<Arc<dyn Acceptor>>,
        on_lost: Option<LostOpens>,
        abort: &CancellationToken,
        retired: Retired,
    ) -> Self {
        let lanes = (0..mux.config().lanes())
            .map(|_| LaneCtl {
                notify: Notify::new(),
                token: abort.child_token(),
            })
            .collect();
        let lane_waiters = vec![Vec::new(); usize::from(mux.config().lanes())];
        Self {
            inner: Arc::new(PeerInner {
                state: Mutex::new(PeerState {
                    mux,
                    wakers: Vec::new(),
                    lane_waiters,
                    incoming: Vec::new(),
                    lost_opens: Vec::new(),
                    to_wake: Vec::new(),
                    lane_closed: false,
                }),
                lanes,
                instance,
                worker_instance,
                alive: AtomicBool::new(false),
                going_away: AtomicBool::new(false),
                pumps: AtomicU16::new(0),
                done: CancellationToken::new(),
                retired,
                acceptor,
                on_lost,
            }),
        }
    }

    /// The peer's instance id.
    pub fn instance(&self) -> InstanceId {
        self.inner.instance
    }

    /// The worker's discovery instance id, as its handshake announced it (frontend; `None`
    /// when it announced none, and on a worker's side). Authenticated when the cluster
    /// secret or mutual TLS is on; otherwise only as trustworthy as the network.
    pub fn worker_instance(&self) -> Option<u64> {
        self.inner.worker_instance
    }

    /// Whether any lane to the peer is up. Lock-free.
    pub fn is_alive(&self) -> bool {
        self.inner.alive.load(Ordering::Acquire)
    }

    /// Whether new streams may be opened on this connection: a lane is up and the peer did
    /// not say it is going away. Lock-free.
    pub fn is_usable(&self) -> bool {
        self.is_alive() && !self.is_going_away()
    }

    /// Whether the peer said it takes no new streams on this connection (GOAWAY). Open
    /// streams go on; a worker opens new ones on a new connection. Lock-free.
    pub fn is_going_away(&self) -> bool {
        self.inner.going_away.load(Ordering::Acquire)
    }

    /// Resolves once every lane has closed and its pumps have ended.
    pub async fn closed(&self) {
        self.inner.done.cancelled().await;
    }

    /// The connection's counters.
    pub fn stats(&self) -> MuxStats {
        self.lock().mux.stats()
    }

    /// Bytes queued for the peer on every lane and not yet handed to the transport.
    pub fn buffered_bytes(&self) -> usize {
        let st = self.lock();
        (0..st.mux.config().lanes())
            .map(|i| st.mux.lane_buffered(LaneId(i)))
            .sum()
    }

    /// Live streams on each lane (placement is least-loaded).
    pub fn lane_streams(&self) -> Vec<u32> {
        let st = self.lock();
        (0..st.mux.config().lanes())
            .map(|i| st.mux.lane_streams(LaneId(i)))
            .collect()
    }

    /// Entries the per-stream waker table keeps allocated (it follows the live streams: a
    /// burst's table is given back as its streams are released).
    pub fn waker_capacity(&self) -> usize {
        self.lock().wakers.capacity()
    }

    /// Flushes every lane's open batch now (the engine's once-per-forward-pass hint).
    pub fn flush(&self) {
        self.with(|st, now| st.mux.flush_hint(now));
    }

    /// Tells the peer this side takes no new streams (GOAWAY); open streams go on.
    pub fn go_away(&self, code: velo_wire::GoAwayCode) {
        self.with(|st, now| st.mux.go_away(now, code));
    }

    /// Closes every lane with `code` (streams on them end as lost); the pumps write a CLOSE
    /// frame, close the transport and stop.
    pub fn close(&self, code: velo_wire::CloseCode, reason: &str) {
        self.with(|st, _| {
            for i in 0..st.mux.config().lanes() {
                st.mux.close(LaneId(i), code, reason);
            }
        });
        for ctl in self.inner.lanes.iter() {
            ctl.notify.notify_one();
        }
    }

    /// Brings `lane` up with the peer's HELLO and starts its reader and writer on `tracker`.
    ///
    /// # Errors
    ///
    /// The lane's transport back, starting nothing, when the connection is already done (its
    /// last pump ended: it is unlisted and its counters retired; the lane belongs on a new
    /// connection).
    pub(crate) fn start_lane(
        &self,
        lane: LaneId,
        hello: &Hello,
        io: LaneIo,
        tracker: &TaskTracker,
        read_buffer: usize,
    ) -> Result<(), NotStarted> {
        // Decided under the lock `pump_ended` decides "done" under: a lane either starts
        // before the connection is done (and keeps it from being done), or not at all.
        let refused = self.with(|st, now| {
            if self.inner.done.is_cancelled() {
                return Some(Refusal::Done);
            }
            // Checked again here: two lanes with one index may both have passed a caller's
            // check made before this lock.
            if st.mux.lane_state(lane) != LaneState::Down {
                return Some(Refusal::InUse);
            }
            // A lane is brought up once: a connection whose lanes all died is replaced.
            st.mux.handle_lane_up(now, lane, hello);
            self.inner.pumps.fetch_add(2, Ordering::AcqRel);
            self.inner.alive.store(true, Ordering::Release);
            None
        });
        if let Some(why) = refused {
            return Err(NotStarted { io, why });
        }
        let LaneIo { read, write } = io;
        // One span per lane covers its whole life; records are never logged one by one.
        let span = tracing::debug_span!("lane", peer = %self.inner.instance, lane = lane.0);
        tracing::debug!(parent: &span, "lane up");
        tracker.spawn(pump::run_writer(self.clone(), lane, write).instrument(span.clone()));
        tracker.spawn(pump::run_reader(self.clone(), lane, read, read_buffer).instrument(span));
        Ok(())
    }

    /// Keeps the connection from being done until the matching [`pump_ended`]: a worker
    /// starting its lanes one by one, one of which may die before the next starts.
    ///
    /// [`pump_ended`]: Self::pump_ended
    pub(crate) fn hold(&self) {
        let _st = self.lock();
        self.inner.pumps.fetch_add(1, Ordering::AcqRel);
    }

    /// A pump of this peer ended (or a [`hold`](Self::hold) was let go); the last one marks
    /// the peer done.
    pub(crate) fn pump_ended(&self) {
        // Under the retired lock, so a total taken meanwhile counts this connection exactly
        // once (live, or retired); then under the peer's, which `start_lane` checks under.
        let mut retired = self.inner.retired.lock();
        let st = self.lock();
        if self.inner.pumps.fetch_sub(1, Ordering::AcqRel) == 1 {
            let connected = st.mux.is_connected();
            self.inner.alive.store(connected, Ordering::Release);
            if !connected {
                *retired += st.mux.stats();
                self.inner.done.cancel();
            }
        }
    }

    /// Runs `f` on the locked state with the current time, then dispatches the mux's events
    /// (waking handles and lane writers) and hands opened streams to the acceptor.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut PeerState, Instant) -> R) -> R {
        let mut st = self.lock();
        let now = clock::now();
        let r = f(&mut st, now);
        if st.dispatch(&self.inner.lanes, now) {
            self.inner.going_away.store(true, Ordering::Release);
        }
        let retire = self.is_going_away() && st.retire_if_idle();
        if std::mem::take(&mut st.lane_closed) && !st.mux.is_connected() {
            self.inner.alive.store(false, Ordering::Release);
        }
        let incoming = if st.incoming.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut st.incoming)
        };
        let to_wake = if st.to_wake.is_empty() {
            Vec::new()
        } else {
            crate::wake_list::take(&mut st.to_wake)
        };
        let lost = if st.lost_opens.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut st.lost_opens)
        };
        drop(st);
        if retire {
            for ctl in self.inner.lanes.iter() {
                ctl.notify.notify_one();
            }
        }
        if let (false, Some(on_lost)) = (lost.is_empty(), &self.inner.on_lost) {
            on_lost(self, lost);
        }
        crate::wake_list::wake_all(to_wake);
        if !incoming.is_empty() {
            self.deliver(incoming);
        }
        r
    }

    /// Registers `waker` for `on` events of `key`. Nothing is registered for a stream the mux
    /// no longer holds: its slot may belong to a newer stream already.
    pub(crate) fn register(st: &mut PeerState, key: StreamKey, on: WakeOn, waker: &Waker) {
        if st.mux.stream_state(key).is_none() {
            return;
        }
        let w = st.wakers_mut(key);
        let slot = match on {
            WakeOn::Send => &mut w.send,
            WakeOn::Stop | WakeOn::Closed => {
                let list = if matches!(on, WakeOn::Stop) {
                    &mut w.stop
                } else {
                    &mut w.closed
                };
                if !list.iter().any(|old| old.will_wake(waker)) {
                    list.push(waker.clone());
                }
                return;
            }
        };
        match slot {
            Some(old) if old.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
    }

    /// Frontend: hands `key`'s items to `mailbox` from now on (see [`Mailbox`]). Nothing is
    /// attached for a stream the mux no longer holds.
    pub(crate) fn attach_mailbox(st: &mut PeerState, key: StreamKey, mailbox: &Arc<Mailbox>) {
        if st.mux.stream_state(key).is_some() {
            st.wakers_mut(key).mailbox = Some(Arc::clone(mailbox));
        }
    }

    /// Registers `waker` to be woken when `lane` has buffer room again.
    pub(crate) fn register_lane(st: &mut PeerState, lane: LaneId, waker: &Waker) {
        // A lane that is not up never has room again: its list would keep the waker for as
        // long as the connection lives.
        if st.mux.lane_state(lane) != LaneState::Up {
            return;
        }
        if let Some(list) = st.lane_waiters.get_mut(usize::from(lane.0))
            && !list.iter().any(|w| w.will_wake(waker))
        {
            list.push(waker.clone());
        }
    }

    /// Wakes (after unlock) every task watching `key` for a stop or its end.
    pub(crate) fn wake_watchers(st: &mut PeerState, key: StreamKey) {
        if let Some(w) = wakers_of(&mut st.wakers, key) {
            st.to_wake.append(&mut w.stop);
            st.to_wake.append(&mut w.closed);
        }
    }

    /// Forgets a released stream's wakers; the table shrinks with the streams it serves.
    pub(crate) fn forget(st: &mut PeerState, key: StreamKey) {
        if let Some(slot) = st.wakers.get_mut(key.index() as usize)
            && slot
                .as_ref()
                .is_some_and(|w| w.generation == key.generation())
        {
            *slot = None;
        }
        while st.wakers.last().is_some_and(Option::is_none) {
            st.wakers.pop();
        }
        if st.wakers.capacity() > SHRINK_ABOVE && st.wakers.len() < st.wakers.capacity() / 4 {
            st.wakers.shrink_to(st.wakers.len() * 2);
        }
    }

    fn deliver(&self, incoming: Vec<(StreamKey, u64, Token, Bytes)>) {
        for (key, ticket, token, prologue) in incoming {
            let stream = crate::RecvStream::new(self.clone(), key);
            let incoming = IncomingStream::new(stream, ticket, token, prologue);
            match &self.inner.acceptor {
                Some(a) => a.accept(incoming),
                None => incoming.refuse(velo_wire::CancelCode::REFUSED),
            }
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, PeerState> {
        // A panic while holding the lock is a bug; the state it left is still the best we have.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn lane_state(&self, lane: LaneId) -> LaneState {
        self.lock().mux.lane_state(lane)
    }
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("instance", &self.inner.instance)
            .field("alive", &self.is_alive())
            .finish()
    }
}

impl PeerState {
    /// The wakers of `key`, a stream the mux holds: an entry of another generation in its
    /// slot is older (its stream was released, so the slot is `key`'s now) and is replaced.
    fn wakers_mut(&mut self, key: StreamKey) -> &mut StreamWakers {
        let i = key.index() as usize;
        if self.wakers.len() <= i {
            // Bounded by the mux's stream limit: keys come from its slab.
            self.wakers.resize_with(i + 1, || None);
        }
        let slot = &mut self.wakers[i];
        if slot
            .as_ref()
            .is_none_or(|w| w.generation != key.generation())
        {
            *slot = Some(StreamWakers {
                generation: key.generation(),
                mailbox: None,
                send: None,
                stop: Vec::new(),
                closed: Vec::new(),
            });
        }
        slot.as_mut().expect("set just above")
    }

    /// Turns the mux's events into wakeups (collected in `to_wake`, woken after unlock).
    /// Returns whether the peer said it is going away.
    fn dispatch(&mut self, lanes: &[LaneCtl], now: Instant) -> bool {
        let mut going_away = false;
        while let Some(event) = self.mux.poll_event() {
            match event {
                MuxEvent::Readable(k) => {
                    // Under this lock anyway: hand the items over now if the handle waits.
                    if let Some(mailbox) =
                        wakers_of(&mut self.wakers, k).and_then(|w| w.mailbox.as_deref())
                        && let Some(w) = mailbox.on_readable(&mut self.mux, now, k)
                    {
                        self.to_wake.push(w);
                    }
                }
                MuxEvent::Writable(k) => {
                    if let Some(w) = wakers_of(&mut self.wakers, k).and_then(|w| w.send.take()) {
                        self.to_wake.push(w);
                    }
                }
                MuxEvent::StopRequested(k) => {
                    if let Some(w) = wakers_of(&mut self.wakers, k) {
                        self.to_wake.append(&mut w.stop);
                    }
                }
                MuxEvent::Closed { stream, .. } => {
                    if let Some(w) = wakers_of(&mut self.wakers, stream) {
                        self.to_wake.extend(w.send.take());
                        self.to_wake.append(&mut w.stop);
                        self.to_wake.append(&mut w.closed);
                    }
                }
                MuxEvent::Accepted(k) => {
                    // A finishing sender, or one waiting for the answer, waits on its send
                    // waker.
                    if let Some(w) = wakers_of(&mut self.wakers, k).and_then(|w| w.send.take()) {
                        self.to_wake.push(w);
                    }
                }
                MuxEvent::LostBeforeAccept {
                    ticket,
                    token,
                    remaining,
                } => self.lost_opens.push((ticket, token, remaining)),
                MuxEvent::LaneWritable(lane) => self.wake_lane_waiters(lane),
                MuxEvent::LaneClosed { lane, error } => {
                    tracing::debug!(%lane, %error, "lane closed");
                    self.lane_closed = true;
                    self.wake_lane_waiters(lane);
                    if let Some(ctl) = lanes.get(usize::from(lane.0)) {
                        ctl.notify.notify_one();
                    }
                }
                MuxEvent::GoAway { code } => {
                    tracing::debug!(%code, "peer is going away");
                    going_away = true;
                }
                MuxEvent::Opened {
                    stream,
                    ticket,
                    token,
                    prologue,
                } => {
                    self.incoming.push((stream, ticket, token, prologue));
                }
            }
        }
        for lane in self.mux.poll_ready_lanes().iter() {
            if let Some(ctl) = lanes.get(usize::from(lane.0)) {
                ctl.notify.notify_one();
            }
        }
        going_away
    }

    /// Worker: closes a connection whose frontend is going away once no stream is left on it
    /// (a frontend that says GOAWAY and never closes would otherwise have the worker keep
    /// every such connection). Returns whether it closed the lanes.
    fn retire_if_idle(&mut self) -> bool {
        let lanes = self.mux.config().lanes();
        if self.mux.config().side() != velo_mux::Side::Worker
            || self.mux.stream_count() != 0
            || !self.mux.is_connected()
            // The last records (a FINAL, its batch) are written first, those already in
            // the writer's hands included: a closing lane's write gets only `CLOSE_GRACE`.
            || !(0..lanes).all(|i| self.mux.lane_flushed(LaneId(i)))
        {
            return false;
        }
        tracing::debug!("closing a going-away connection with no stream left");
        for i in 0..lanes {
            self.mux.close(
                LaneId(i),
                velo_wire::CloseCode::NORMAL,
                "the frontend is going away and no stream is left",
            );
        }
        true
    }

    fn wake_lane_waiters(&mut self, lane: LaneId) {
        if let Some(list) = self.lane_waiters.get_mut(usize::from(lane.0)) {
            self.to_wake.append(list);
        }
    }
}

/// The wakers of `key`, if its slot still holds that generation. A free function so that
/// `dispatch` can borrow the wakers and the wake list at once.
fn wakers_of(wakers: &mut [Option<StreamWakers>], key: StreamKey) -> Option<&mut StreamWakers> {
    wakers
        .get_mut(key.index() as usize)?
        .as_mut()
        .filter(|w| w.generation == key.generation())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;
    use velo_mux::{LaneId, Mux, MuxConfig, Side};

    use super::{Peer, Refusal, Retired};
    use crate::{LaneIo, RawLane, StreamLane, clock, new_instance_id};

    fn lane() -> (LaneIo, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let raw: Box<dyn RawLane> = Box::new(StreamLane::new(ours, tokio::io::split));
        (raw.into_io(), theirs)
    }

    /// A frontend's connection to a worker of two lanes, none started, and the HELLO of each
    /// of the worker's lanes.
    struct Connection {
        peer: Peer,
        abort: CancellationToken,
        tracker: TaskTracker,
        hello: Box<dyn Fn(u16) -> velo_wire::Hello>,
    }

    fn connection() -> Connection {
        let frontend = MuxConfig::builder(Side::Frontend).lanes(2).build().unwrap();
        let worker = MuxConfig::builder(Side::Worker).lanes(2).build().unwrap();
        let (me, them) = (new_instance_id(), new_instance_id());
        let abort = CancellationToken::new();
        let mux = Mux::new(frontend, clock::now());
        let peer = Peer::new(mux, them, None, None, None, &abort, Retired::default());
        Connection {
            peer,
            abort,
            tracker: TaskTracker::new(),
            hello: Box::new(move |lane| worker.hello(lane, them, me)),
        }
    }

    /// A frontend looks a worker's connection up for a new lane while its only lane dies: by
    /// the time the lane would start, the connection is done (unlisted, its counters
    /// retired, skipped by `close`). The lane must not start on it.
    #[tokio::test(start_paused = true)]
    async fn a_lane_is_not_started_on_a_connection_already_done() {
        let Connection {
            peer,
            abort: _abort,
            tracker,
            hello,
        } = connection();
        let (io0, far0) = lane();
        let hello0 = hello(0);
        assert!(
            peer.start_lane(LaneId(0), &hello0, io0, &tracker, 4096)
                .is_ok()
        );
        drop(far0);
        tokio::time::timeout(Duration::from_secs(60), peer.closed())
            .await
            .expect("lane 0's pumps end");
        let (io1, _far1) = lane();
        let hello1 = hello(1);
        assert!(
            peer.start_lane(LaneId(1), &hello1, io1, &tracker, 4096)
                .is_err(),
            "a done connection takes no lane"
        );
        assert!(!peer.is_usable());
        tracker.close();
        tokio::time::timeout(Duration::from_secs(60), tracker.wait())
            .await
            .expect("no task left running");
    }

    /// Two handshakes for the same lane of one worker finish at once (a duplicated path, or a
    /// stranger who knows the instance without a cluster secret): both pass the frontend's
    /// "is it down?" check before either starts. The second must be refused, not replace the
    /// first under its running pumps (two readers and two writers on one lane).
    #[tokio::test(start_paused = true)]
    async fn a_lane_already_up_is_not_started_again() {
        let Connection {
            peer,
            abort,
            tracker,
            hello,
        } = connection();
        let hello = hello(0);
        let (first, _far_first) = lane();
        assert!(
            peer.start_lane(LaneId(0), &hello, first, &tracker, 4096)
                .is_ok()
        );
        let (second, mut far_second) = lane();
        let refused = peer
            .start_lane(LaneId(0), &hello, second, &tracker, 4096)
            .expect_err("lane 0 is up: a second one with its index is refused");
        assert_eq!(refused.why, Refusal::InUse);
        assert!(peer.is_usable(), "the first lane is untouched");
        // The refused lane's transport was handed back (held here), never driven: its far
        // end reads nothing from it.
        let mut byte = [0u8; 1];
        let read = tokio::io::AsyncReadExt::read(&mut far_second, &mut byte);
        // Longer than a heartbeat interval (a third of the idle timeout): a driven lane would
        // have written one by then (paused time: the wait costs nothing).
        assert!(
            tokio::time::timeout(Duration::from_secs(60), read)
                .await
                .is_err(),
            "the refused lane was driven"
        );
        drop(refused);
        abort.cancel();
        tracker.close();
        tokio::time::timeout(Duration::from_secs(60), tracker.wait())
            .await
            .expect("no task left running");
    }
}
