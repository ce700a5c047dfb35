//! Classic plane, worker side: a connection per stream, one write per item.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::conn::{Conn, ConnRead, ConnWrite};
use super::frame::{
    self, ACCEPTED, DATA, HANDSHAKE, HEARTBEAT, PROLOGUE, REQUIRES_TLS, SENTINEL, STOP,
};
use super::mismatch;
use super::socket::set_liveness;
use crate::info::{StreamAddress, hex_token};
use crate::stats::{Count, PlaneCounters};
use crate::{Cause, Disconnect, ResponseError, TlsMismatch};

/// Time to connect to the frontend.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

const RUNNING: u8 = 0;
const STOPPED: u8 = 1;
const KILLED: u8 = 2;
/// How long a failed write waits for the watcher's verdict on why the connection broke.
const VERDICT_WAIT: Duration = Duration::from_secs(1);

/// What the frontend asked of one classic stream, fed by a reader task.
#[derive(Debug, Default)]
pub(crate) struct ClassicControl {
    state: AtomicU8,
    changed: Notify,
    /// The worker's side is over (finished, or its writer dropped): a kill from now on is
    /// not a cancellation of work.
    finished: AtomicBool,
    /// Cancelled when the writer is dropped: the watcher gives the frontend a bounded time
    /// to close, then stops.
    writer_gone: CancellationToken,
    /// The frontend took the stream (ACCEPTED): the end the worker sends is delivered.
    accepted: AtomicBool,
    /// When the writer last wrote, in ms after the stream's epoch: heartbeats go out only
    /// after a third of the liveness bound without writes.
    last_write_ms: AtomicU64,
    /// Writes made, counted under the connection's lock: a heartbeat that waited for the
    /// lock goes out only if no write happened meanwhile.
    writes: AtomicU64,
    /// The frontend refused the connection for a TLS mismatch (it requires TLS).
    mismatch: OnceLock<TlsMismatch>,
    /// The connection ended or failed without the frontend ending the stream: why.
    lost: OnceLock<Cause>,
}

impl ClassicControl {
    pub(crate) fn is_stopped(&self) -> bool {
        self.state.load(Ordering::Acquire) >= STOPPED
    }

    pub(crate) fn is_killed(&self) -> bool {
        self.state.load(Ordering::Acquire) == KILLED
    }

    /// Waits until the state is at least `at_least`.
    pub(crate) async fn wait(&self, at_least: u8) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change in between is not missed.
            notified.as_mut().enable();
            if self.state.load(Ordering::Acquire) >= at_least {
                return;
            }
            notified.await;
        }
    }

    pub(crate) async fn stopped(&self) {
        self.wait(STOPPED).await;
    }

    pub(crate) async fn killed(&self) {
        self.wait(KILLED).await;
    }

    /// Whether the frontend took the stream: `true` once it said so, `false` if the
    /// connection ended (or was killed) first.
    async fn answered(&self) -> bool {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.accepted.load(Ordering::Acquire) {
                return true;
            }
            if self.is_killed() {
                return false;
            }
            notified.await;
        }
    }

    fn accept(&self) {
        self.accepted.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Ends the watch from this side (the plane closed, or the stream is over): waiters see
    /// a kill, and no cancellation is counted.
    fn end(&self) {
        self.finished.store(true, Ordering::Release);
        if self.state.swap(KILLED, Ordering::AcqRel) != KILLED {
            self.changed.notify_waiters();
        }
    }

    /// The frontend refused the connection for `mismatch`: the stream ends, as a kill that
    /// is no cancellation of work.
    fn refused_for(&self, mismatch: TlsMismatch) {
        let _ = self.mismatch.set(mismatch);
        self.end();
    }

    /// The connection ended or failed (`cause`) without a word from the frontend: the stream
    /// is over for the engine, as after a kill, but nobody cancelled its work.
    fn lose(&self, cause: Cause) {
        let _ = self.lost.set(cause);
        self.end();
    }

    fn raise(&self, to: u8, cancellations: &Count) {
        let before = self.state.fetch_max(to, Ordering::AcqRel);
        if before < to {
            if before == RUNNING && !self.finished.load(Ordering::Acquire) {
                cancellations.inc();
            }
            self.changed.notify_waiters();
        }
    }
}

/// How a classic worker dials its frontends: every connection of one worker plane, a
/// stream's or the announcement of its loss, is made the same way.
struct Dial {
    /// Largest message, in bytes.
    max: u32,
    /// The liveness bound of each connection (the plane's `idle_timeout`), also how long a
    /// finished stream's watcher waits for the frontend to close.
    liveness: Duration,
    /// This worker's discovery instance, named in every handshake.
    worker_instance: Option<u64>,
    /// TLS on every connection, when set.
    tls: Option<Arc<velo_tls::ClientTls>>,
}

impl Dial {
    /// A connection to `addr`'s frontend: connected, its liveness bounded, secured when the
    /// plane has TLS; not yet named.
    async fn open(&self, addr: std::net::SocketAddr) -> Result<Conn, ResponseError> {
        let unreachable = |cause| ResponseError::Unreachable { addr, cause };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| unreachable(Cause::timeout(CONNECT_TIMEOUT)))?
            .map_err(|e| unreachable(Cause::io(e)))?;
        let io = |e| unreachable(Cause::io(e));
        stream.set_nodelay(true).map_err(io)?;
        set_liveness(&stream, self.liveness).map_err(io)?;
        match &self.tls {
            None => Ok(Conn::Plain(stream)),
            Some(tls) => secure(stream, addr, tls).await.map_err(unreachable),
        }
    }

    /// The handshake naming the stream at `address`, and this worker.
    fn handshake(&self, address: &StreamAddress) -> Result<String, ResponseError> {
        let mut handshake =
            serde_json::json!({ "stream": address.ticket, "token": hex_token(&address.token()?) });
        if let Some(worker) = self.worker_instance {
            handshake["worker"] = worker.into();
        }
        Ok(handshake.to_string())
    }
}

/// What every classic stream of one worker plane shares: how to dial, where the watchers
/// run, and the signal that ends them all.
pub(crate) struct ClassicDialer {
    dial: Arc<Dial>,
    /// Where the watcher tasks run.
    tracker: TaskTracker,
    /// The plane's counters (frontend cancellations of streams still running).
    counters: Arc<PlaneCounters>,
    /// Cancelled by `close` and `abort`: every watcher ends, every connection is shut.
    stop: CancellationToken,
}

impl ClassicDialer {
    pub(crate) fn new(
        max: u32,
        liveness: Duration,
        worker_instance: Option<u64>,
        tls: Option<Arc<velo_tls::ClientTls>>,
        counters: Arc<PlaneCounters>,
        tracker: TaskTracker,
    ) -> Self {
        let dial = Dial {
            max,
            liveness,
            worker_instance,
            tls,
        };
        Self {
            dial: Arc::new(dial),
            tracker,
            counters,
            stop: CancellationToken::new(),
        }
    }

    /// Ends every stream: each engine sees a kill, each connection is shut down, each
    /// watcher task ends at once. New streams are refused with `Closed`.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// Dials the frontend for one stream and names the stream.
    pub(crate) async fn connect(
        &self,
        addr: &StreamAddress,
    ) -> Result<ClassicWriter, ResponseError> {
        if self.stop.is_cancelled() {
            return Err(ResponseError::Closed);
        }
        let handshake = self.dial.handshake(addr)?;
        let conn = self.dial.open(addr.addr).await?;
        let (read, write) = conn.into_split().map_err(|e| ResponseError::Unreachable {
            addr: addr.addr,
            cause: Cause::io(e),
        })?;
        let control = Arc::new(ClassicControl::default());
        let write = Arc::new(Mutex::new(write));
        let epoch = Instant::now();
        let watch = Watch {
            control: control.clone(),
            counters: self.counters.clone(),
            stop: self.stop.child_token(),
            dial: self.dial.clone(),
            write: Arc::downgrade(&write),
            epoch,
            address: addr.clone(),
        };
        self.tracker.spawn(watch.run(read));
        let mut w = ClassicWriter {
            write,
            addr: addr.addr,
            control,
            out: Vec::with_capacity(256),
            max: self.dial.max,
            liveness: self.dial.liveness,
            epoch,
        };
        w.send_message(HANDSHAKE, handshake.as_bytes()).await?;
        Ok(w)
    }
}

/// One classic stream's sending side.
pub(crate) struct ClassicWriter {
    /// Shared with the watcher, which writes heartbeats while this side is quiet (it holds
    /// only a weak reference: dropping the writer closes the connection's sending side).
    write: Arc<Mutex<ConnWrite>>,
    /// The frontend's address.
    addr: std::net::SocketAddr,
    control: Arc<ClassicControl>,
    out: Vec<u8>,
    max: u32,
    /// How long a finish waits for the frontend to say it took the stream.
    liveness: Duration,
    epoch: Instant,
}

impl ClassicWriter {
    pub(crate) fn control(&self) -> Arc<ClassicControl> {
        self.control.clone()
    }

    pub(crate) async fn prologue(&mut self, json: &[u8]) -> Result<(), ResponseError> {
        self.send_message(PROLOGUE, json).await
    }

    /// One item, one write.
    pub(crate) async fn item(&mut self, item: &[u8]) -> Result<(), ResponseError> {
        if self.control.is_killed() {
            return Err(self.killed());
        }
        self.send_message(DATA, item).await
    }

    /// Why this stream ended before its writer did: the frontend refused the connection,
    /// the connection was lost, or the frontend killed the stream.
    fn killed(&self) -> ResponseError {
        if let Some(m) = self.control.mismatch.get() {
            return ResponseError::Unreachable {
                addr: self.addr,
                cause: Cause::tls_mismatch(*m),
            };
        }
        match self.control.lost.get() {
            Some(cause) => ResponseError::lost(cause.clone()),
            None => ResponseError::Cancelled { graceful: false },
        }
    }

    /// The sentinel, then the end of the connection's sending side; returns once the
    /// frontend has taken the stream (its ACCEPTED, sent as soon as it matched the
    /// connection, usually long before).
    ///
    /// # Errors
    ///
    /// `Disconnected` if the connection ended, or the liveness bound passed, before the
    /// frontend took the stream: it may never have seen it.
    pub(crate) async fn finish(&mut self) -> Result<(), ResponseError> {
        self.control.finished.store(true, Ordering::Release);
        self.send_message(SENTINEL, &[]).await?;
        self.write
            .lock()
            .await
            .shutdown()
            .await
            .map_err(|e| ResponseError::lost(Cause::io(e)))?;
        match tokio::time::timeout(self.liveness, self.control.answered()).await {
            Ok(true) => Ok(()),
            Ok(false)
                if self.control.mismatch.get().is_some() || self.control.lost.get().is_some() =>
            {
                Err(self.killed())
            }
            Ok(false) => Err(ResponseError::Disconnected(Disconnect::Closed)),
            Err(_) => Err(ResponseError::lost(Cause::timeout(self.liveness))),
        }
    }

    async fn send_message(&mut self, kind: u8, payload: &[u8]) -> Result<(), ResponseError> {
        if self.control.mismatch.get().is_some() {
            return Err(self.killed());
        }
        let max = self.max;
        if payload.len() > max as usize {
            return Err(ResponseError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        self.out.clear();
        self.out
            .extend_from_slice(&frame::header(kind, payload.len()));
        self.out.extend_from_slice(payload);
        // A TLS half may hold the record until flushed (a plaintext flush does nothing).
        let written = {
            let mut w = self.write.lock().await;
            let written = match w.write_all(&self.out).await {
                Ok(()) => w.flush().await,
                Err(e) => Err(e),
            };
            // Under the lock: a heartbeat waiting for it sees this write.
            self.control.wrote(self.epoch);
            written
        };
        let Err(e) = written else { return Ok(()) };
        // A frontend that kills a stream sends KILL and closes: this write can fail before
        // the watcher has read the KILL. Its verdict decides (a broken connection ends its
        // read at once; the bound covers a watcher that cannot run).
        let _ = tokio::time::timeout(VERDICT_WAIT, self.control.killed()).await;
        if self.control.is_killed() {
            Err(self.killed())
        } else {
            Err(ResponseError::lost(Cause::io(e)))
        }
    }
}

impl Drop for ClassicWriter {
    fn drop(&mut self) {
        self.control.finished.store(true, Ordering::Release);
        self.control.writer_gone.cancel();
    }
}

/// `stream` after its TLS handshake with the frontend at `addr` (under the TLS handshake
/// timeout); a frontend that answered in plaintext is named as such.
async fn secure(
    stream: TcpStream,
    addr: std::net::SocketAddr,
    tls: &velo_tls::ClientTls,
) -> Result<Conn, Cause> {
    let connect = tls.connector().connect(tls.server_name(addr.ip()), stream);
    let timeout = tls.handshake_timeout();
    let s = tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| Cause::timeout(timeout))?
        .map_err(|e| {
            if mismatch::answered_in_plaintext(&e) {
                Cause::tls_mismatch(TlsMismatch::FrontendAnsweredPlaintext)
            } else {
                Cause::io(std::io::Error::new(
                    e.kind(),
                    format!("TLS handshake failed: {e}"),
                ))
            }
        })?;
    Ok(Conn::Tls(Box::new(
        velo_tls::tokio_rustls::TlsStream::Client(s),
    )))
}

/// One stream's watcher: the frontend's control messages, for the engine; and the worker's
/// heartbeats while its writer is quiet.
struct Watch {
    control: Arc<ClassicControl>,
    /// The plane's counters (frontend cancellations).
    counters: Arc<PlaneCounters>,
    /// The plane closed or aborted.
    stop: CancellationToken,
    /// How the stream was dialled; its liveness bound is how long the frontend has to close
    /// once the writer is gone, and a third of it the heartbeat interval.
    dial: Arc<Dial>,
    write: Weak<Mutex<ConnWrite>>,
    epoch: Instant,
    /// The stream's address: its loss is announced there again if the connection ends
    /// before the frontend took the stream.
    address: StreamAddress,
}

/// How the frontend's side of a classic connection ended.
enum Ending {
    /// It killed the stream, refused it, or sent garbage.
    Refused,
    /// The connection ended or failed, for this cause.
    Lost(Cause),
}

impl Watch {
    /// Watches until the frontend kills or closes the stream, the plane stops, or the writer
    /// has been gone for `linger` (a wedged frontend that never closes must not keep this
    /// task). Every way out leaves the control killed.
    async fn run(self, mut read: ConnRead) {
        let linger = self.dial.liveness;
        let gone = async {
            self.control.writer_gone.cancelled().await;
            tokio::time::sleep(linger).await;
        };
        // Cancel safety: whichever branch wins, the others are dropped and the watch ends; a
        // read in flight loses nothing anyone still needs.
        let heartbeats = heartbeats(&self.control, &self.write, self.epoch, linger / 3);
        let lost = tokio::select! {
            () = heartbeats => false,
            ending = read_control(&mut read, &self.control, &self.counters) => match ending {
                Ending::Refused => {
                    self.control.raise(KILLED, &self.counters.classic_cancellations);
                    if self.control.mismatch.get().is_some() {
                        // The connection is good for nothing: close it, the frontend waits.
                        read.shutdown();
                    }
                    false
                }
                Ending::Lost(cause) => {
                    self.control.lose(cause);
                    true
                }
            },
            () = self.stop.cancelled() => {
                self.control.end();
                // The writer half may live on in a wedged engine: close the connection now.
                read.shutdown();
                false
            }
            () = gone => {
                self.control.end();
                true
            }
        };
        if lost && !self.control.accepted.load(Ordering::Acquire) {
            drop(read);
            announce_abandoned(&self.dial, &self.address).await;
        }
    }
}

/// The connection of a stream the frontend had not taken ended: the frontend may never have
/// seen it, and its request would wait. Says so on a new connection, once, dialled as the
/// stream was (TLS, this worker's instance: the frontend takes it as the stream's): the
/// stream's name, then an empty prologue (abandoned), so the frontend's pending request ends
/// (retryable). Bounded by the liveness bound (at least the connect timeout); a failure is
/// only logged (the frontend's establish timeout remains).
async fn announce_abandoned(dial: &Dial, address: &StreamAddress) {
    let announce = async {
        let name = dial.handshake(address)?;
        let mut conn = dial.open(address.addr).await?;
        let mut out = frame::header(HANDSHAKE, name.len()).to_vec();
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&frame::header(PROLOGUE, 0));
        let sent = async {
            conn.write_all(&out).await?;
            conn.flush().await?;
            conn.shutdown().await
        };
        sent.await.map_err(|e| ResponseError::lost(Cause::io(e)))
    };
    let within = dial.liveness.max(CONNECT_TIMEOUT);
    match tokio::time::timeout(within, announce).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::debug!(addr = %address.addr, ticket = address.ticket, %error, "cannot announce a lost classic stream");
        }
        Err(_) => {
            tracing::debug!(addr = %address.addr, ticket = address.ticket, ?within, "announcing a lost classic stream timed out");
        }
    }
}

impl ClassicControl {
    /// The writer wrote just now (called with the connection's lock held).
    fn wrote(&self, epoch: Instant) {
        let ms = u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_write_ms.store(ms, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
    }
}

/// Writes a HEARTBEAT whenever the writer has been quiet for `every`, until the writer is
/// gone or has finished; never returns (the watch's other branches end it).
async fn heartbeats(
    control: &ClassicControl,
    write: &Weak<Mutex<ConnWrite>>,
    epoch: Instant,
    every: Duration,
) {
    loop {
        let last_ms = control.last_write_ms.load(Ordering::Relaxed);
        let due = epoch + Duration::from_millis(last_ms) + every;
        if Instant::now() < due {
            tokio::time::sleep_until(due).await;
            continue;
        }
        let Some(write) = write.upgrade() else { break };
        let writes = control.writes.load(Ordering::Relaxed);
        if control.finished.load(Ordering::Acquire) {
            break;
        }
        let mut w = write.lock().await;
        // Checked again under the lock: the writer may have finished (its SENTINEL out, after
        // which the frontend takes no byte) or written while this waited for the lock.
        if control.finished.load(Ordering::Acquire) {
            break;
        }
        if control.writes.load(Ordering::Relaxed) == writes
            && (w.write_all(&frame::header(HEARTBEAT, 0)).await.is_err()
                || w.flush().await.is_err())
        {
            break;
        }
        control.wrote(epoch);
        drop(w);
    }
    std::future::pending::<()>().await;
}

/// Reads the frontend's control messages (stop, kill) until the frontend ends the stream or
/// the connection ends (lost: the frontend said nothing, its work is not cancelled).
async fn read_control(
    read: &mut ConnRead,
    control: &ClassicControl,
    counters: &PlaneCounters,
) -> Ending {
    let mut buf = BytesMut::with_capacity(64);
    loop {
        match frame::decode(&mut buf, 0) {
            Ok(Some((STOP, _))) => {
                control.raise(STOPPED, &counters.classic_cancellations);
                continue;
            }
            Ok(Some((ACCEPTED, _))) => {
                control.accept();
                continue;
            }
            Ok(Some((REQUIRES_TLS, _))) => {
                control.refused_for(TlsMismatch::FrontendRequiresTls);
                return Ending::Refused;
            }
            // A kill, or garbage: the stream is as good as killed.
            Ok(Some(_)) | Err(_) => return Ending::Refused,
            Ok(None) => {}
        }
        match read.read_buf(&mut buf).await {
            Ok(0) => {
                let eof = std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the frontend closed the connection without ending the stream",
                );
                return Ending::Lost(Cause::io(eof));
            }
            Err(e) => return Ending::Lost(Cause::io(e)),
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;
    use crate::Codec;

    /// A stream address pointing at `addr`, as a frontend would hand it out.
    fn address(addr: std::net::SocketAddr) -> StreamAddress {
        StreamAddress {
            v: crate::info::ADDRESS_VERSION,
            addr,
            instance: format!("{:032x}", 1),
            ticket: 1,
            token: hex_token(&[7; 16]),
            codec: Codec::default(),
        }
    }

    #[tokio::test]
    async fn worker_sockets_give_up_on_a_vanished_frontend_within_the_liveness_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let bound = Duration::from_secs(9);
        let counters = Arc::default();
        let dialer = ClassicDialer::new(1 << 20, bound, None, None, counters, TaskTracker::new());
        let to = address(listener.local_addr().unwrap());
        let (w, accepted) = tokio::join!(dialer.connect(&to), listener.accept());
        let (w, _frontend) = (w.unwrap(), accepted.unwrap());
        crate::classic::socket::assert_liveness(w.write.lock().await.tcp().unwrap(), bound);
        dialer.stop();
    }

    /// A frontend that kills a stream writes KILL and closes at once (with tokens unread: a
    /// reset). The worker's next write fails before its watcher has read the KILL; the writer
    /// must still report the kill, not a lost connection. A current-thread runtime makes the
    /// writer win that race every time: the watcher cannot run until the writer yields.
    #[tokio::test(flavor = "current_thread")]
    async fn a_write_failing_after_the_frontends_kill_reports_the_kill_not_a_lost_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dialer = ClassicDialer::new(
            1 << 20,
            Duration::from_secs(9),
            None,
            None,
            Arc::default(),
            TaskTracker::new(),
        );
        let to = address(listener.local_addr().unwrap());
        let mut w = dialer.connect(&to).await.unwrap();
        let (mut frontend, _) = listener.accept().unwrap();
        w.prologue(b"{}").await.unwrap();
        std::io::Write::write_all(&mut frontend, &frame::header(frame::KILL, 0)).unwrap();
        // Unread bytes and no linger: the close is a reset, delivered (loopback) before
        // `drop` returns.
        socket2::SockRef::from(&frontend)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(frontend);
        let mut outcome = Ok(());
        for _ in 0..1000 {
            outcome = w.item(b"a token").await;
            if outcome.is_err() {
                break;
            }
        }
        assert!(
            matches!(outcome, Err(ResponseError::Cancelled { .. })),
            "{outcome:?}"
        );
        dialer.stop();
    }

    /// A frontend whose connection breaks without a word (its process died, a middlebox
    /// reset the flow) cancelled nothing: the writer reports the lost connection, the engine
    /// is told to stop, and no frontend cancellation is counted.
    #[tokio::test]
    async fn a_connection_lost_without_a_kill_is_a_disconnect_not_a_cancellation() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let counters: Arc<PlaneCounters> = Arc::default();
        let dialer = ClassicDialer::new(
            1 << 20,
            Duration::from_secs(9),
            None,
            None,
            counters.clone(),
            TaskTracker::new(),
        );
        let to = address(listener.local_addr().unwrap());
        let mut w = dialer.connect(&to).await.unwrap();
        let (mut frontend, _) = listener.accept().unwrap();
        std::io::Write::write_all(&mut frontend, &frame::header(ACCEPTED, 0)).unwrap();
        w.prologue(b"{}").await.unwrap();
        // The handshake and prologue are unread: the close is a reset.
        drop(frontend);
        let control = w.control();
        tokio::time::timeout(Duration::from_secs(30), control.killed())
            .await
            .expect("the engine is told to stop");
        let outcome = w.item(b"a token").await;
        assert!(
            matches!(
                outcome,
                Err(ResponseError::Disconnected(Disconnect::Lost(_)))
            ),
            "{outcome:?}"
        );
        assert_eq!(counters.classic_cancellations.get(), 0);
        dialer.stop();
    }

    /// The writer finishes (its SENTINEL written) while a heartbeat that fell due waits for
    /// the connection's lock: once it gets the lock the heartbeat must see the stream is over
    /// and write nothing, since the frontend reads any byte after the SENTINEL as a protocol
    /// violation. Paused time, one thread: the interleaving is the story's, not the
    /// scheduler's.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn no_heartbeat_follows_the_sentinel() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = listener.local_addr().unwrap();
        let (dialed, accepted) = tokio::join!(TcpStream::connect(to), listener.accept());
        let (_read, write) = Conn::Plain(dialed.unwrap()).into_split().unwrap();
        let (mut frontend, _) = accepted.unwrap();
        let control = Arc::new(ClassicControl::default());
        let write = Arc::new(Mutex::new(write));
        let (epoch, every) = (Instant::now(), Duration::from_secs(3));
        // The writer is mid-write when the heartbeat falls due.
        let mut guard = write.lock().await;
        let heartbeat = tokio::spawn({
            let (control, write) = (control.clone(), Arc::downgrade(&write));
            async move { heartbeats(&control, &write, epoch, every).await }
        });
        tokio::time::sleep(every * 2).await;
        // The writer finishes: the stream is over, its SENTINEL written, the lock released.
        control.finished.store(true, Ordering::Release);
        guard.write_all(&frame::header(SENTINEL, 0)).await.unwrap();
        drop(guard);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        heartbeat.abort();
        let _ = heartbeat.await;
        drop(write); // the worker's sending side closes
        let mut sent = Vec::new();
        frontend.read_to_end(&mut sent).await.unwrap();
        assert_eq!(sent, frame::header(SENTINEL, 0), "bytes after the SENTINEL");
    }
}
