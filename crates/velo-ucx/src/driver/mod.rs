//! The driver: the one owner of the UCX worker, and the loop that progresses it.
//!
//! Every UCX call happens here. Lanes and endpoints talk to the driver through [`Command`]s;
//! the driver answers through each lane's inbox (received bytes, the lane's end), its write
//! window (permits come back as UCX completes sends) and one-shot replies (a lane dialed or
//! closed).
//!
//! ```text
//! loop {
//!     run queued commands (connect, write, close, release, ...)   <- lanes, endpoints
//!     ucp_worker_progress; handle the events its callbacks queued
//!     accept connection requests; move received bytes to inboxes  -> lanes' readers
//!     if nothing happened: ucp_worker_arm, then sleep until a command, the event fd or a
//!     close deadline
//! }
//! ```
//!
//! The command channel is unbounded by type but bounded by construction: a lane's writes hold
//! permits of its write window ([`WRITE_WINDOW_KIB`]) from the moment they are queued until UCX
//! is done with their buffers, a lane has at most one close and one release queued, and
//! endpoints queue a connect per lane being dialed. The driver takes at most
//! [`COMMAND_BUDGET`] per pass.

mod events;
mod run;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_util::task::TaskTracker;

use crate::config::names_network_transport;
use crate::error::ThreadFailure;
use crate::lane::{Inbox, Lane};
use crate::reorder::Reorder;
use crate::stats::Counters;
use crate::sys::{self, EpId, Status, Worker};
use crate::{ProgressEngine, UcxConfig, UcxError};

/// Commands run per pass before UCX is progressed again.
const COMMAND_BUDGET: usize = 1024;
/// Busy passes (work found every time) before the driver yields to other tasks.
const YIELD_EVERY: u32 = 64;
/// Connected lanes waiting for the frontend's accept loop; more are refused.
const ACCEPT_QUEUE: usize = 1024;
/// Bytes a lane may have queued for or in flight in UCX, in KiB (16 MiB): a write returns once
/// queued, so the writer does not wait for a round trip through the driver per batch, and waits
/// only when this much is still in flight (backpressure from a slow peer or network).
pub(crate) const WRITE_WINDOW_KIB: u32 = 16 * 1024;
/// The send token of messages whose completion nobody waits for (fins).
const UNTRACKED: u64 = 0;
/// Bound on a dedicated progress thread's start-up.
const THREAD_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What lanes and endpoints ask of the driver.
pub(crate) enum Command {
    /// Dial `addr`: a new lane (its failures arrive on the lane).
    Connect {
        addr: SocketAddr,
        reply: oneshot::Sender<Result<Lane, ConnectFailure>>,
    },
    /// Send `chunks` on `lane`, in order; `permit` (of the lane's write window) is released
    /// when UCX is done with them.
    Write {
        lane: LaneKey,
        chunks: Vec<Bytes>,
        permit: OwnedSemaphorePermit,
    },
    /// End `lane` in order: a fin after the data, a flush (bounded), then the endpoint closes.
    Close {
        lane: LaneKey,
        done: oneshot::Sender<()>,
    },
    /// Both halves of `lane` are gone: close its endpoint now if it is still open.
    Release { lane: LaneKey },
    /// Stop listening (connection requests are rejected from now on).
    StopListening { done: oneshot::Sender<()> },
    /// Stop once no lane is left.
    Shutdown,
    /// Close every endpoint now and stop.
    Abort,
}

/// A lane's slot in the driver, with a generation so a reused slot never aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct LaneKey {
    index: u32,
    generation: u32,
}

impl LaneKey {
    fn token(self) -> u64 {
        (u64::from(self.index) << 32) | u64::from(self.generation)
    }

    fn from_token(token: u64) -> Self {
        Self {
            index: u32::try_from(token >> 32).unwrap_or(u32::MAX),
            generation: u32::try_from(token & u64::from(u32::MAX)).unwrap_or(u32::MAX),
        }
    }
}

/// How lanes and endpoints reach the driver. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Handle {
    pub(crate) cmd: mpsc::UnboundedSender<Command>,
}

impl Handle {
    /// Sends `cmd`; false when the driver has stopped.
    pub(crate) fn send(&self, cmd: Command) -> bool {
        self.cmd.send(cmd).is_ok()
    }

    /// Dials a lane to `addr`.
    pub(crate) async fn connect(&self, addr: SocketAddr) -> Result<Lane, ConnectFailure> {
        let (reply, rx) = oneshot::channel();
        if !self.send(Command::Connect { addr, reply }) {
            return Err(ConnectFailure::Stopped);
        }
        rx.await.unwrap_or(Err(ConnectFailure::Stopped))
    }
}

/// What [`start`] hands back.
pub(crate) struct Running {
    pub(crate) handle: Handle,
    /// The listener's port, when listening.
    pub(crate) port: Option<u16>,
    /// Lanes the listener connected, when listening.
    pub(crate) accepted: Option<mpsc::Receiver<Lane>>,
}

/// Why the driver could not start a lane to a frontend.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectFailure {
    /// The driver has stopped (the transport is shutting down).
    #[error("the UCX transport has stopped")]
    Stopped,
    /// UCX refused to create the endpoint.
    #[error("cannot connect to {addr} with UCX: {status}")]
    Ucx { addr: SocketAddr, status: Status },
}

/// Checks the UCX installation and settings, creates the worker (and listener) and starts the
/// driver on `tracker` or a thread of its own, as `cfg.engine` says.
///
/// Must be called inside a tokio runtime.
pub(crate) fn start(
    cfg: &UcxConfig,
    listen: Option<SocketAddr>,
    counters: Arc<Counters>,
    tracker: &TaskTracker,
) -> Result<Running, UcxError> {
    check_setup(cfg)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let weak = tx.downgrade();
    let handle = Handle { cmd: tx };
    match cfg.engine() {
        ProgressEngine::Task => {
            let (driver, port, accepted) = Driver::new(cfg, listen, rx, weak, counters)?;
            tracker.spawn(driver.run());
            Ok(Running {
                handle,
                port,
                accepted,
            })
        }
        ProgressEngine::Thread => {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let (exit_tx, exit_rx) = oneshot::channel::<()>();
            let cfg = cfg.clone();
            std::thread::Builder::new()
                .name("velo-ucx-progress".to_owned())
                .spawn(move || {
                    let _exit = exit_tx;
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let failure = ThreadFailure::Runtime(Arc::new(e));
                            let _ = ready_tx.send(Err(UcxError::Thread(failure)));
                            return;
                        }
                    };
                    rt.block_on(async move {
                        match Driver::new(&cfg, listen, rx, weak, counters) {
                            Ok((driver, port, accepted)) => {
                                let _ = ready_tx.send(Ok((port, accepted)));
                                driver.run().await;
                            }
                            Err(e) => {
                                let _ = ready_tx.send(Err(e));
                            }
                        }
                    });
                })
                .map_err(|e| UcxError::Thread(ThreadFailure::Spawn(Arc::new(e))))?;
            // The thread is accounted for on the tracker like any task of ours.
            tracker.spawn(async move {
                let _ = exit_rx.await;
            });
            let (port, accepted) = ready_rx.recv_timeout(THREAD_START_TIMEOUT).map_err(|e| {
                UcxError::Thread(match e {
                    std::sync::mpsc::RecvTimeoutError::Timeout => {
                        ThreadFailure::Timeout(THREAD_START_TIMEOUT)
                    }
                    std::sync::mpsc::RecvTimeoutError::Disconnected => ThreadFailure::Ended,
                })
            })??;
            Ok(Running {
                handle,
                port,
                accepted,
            })
        }
    }
}

/// The checks UCX itself would only fail later, or not at all.
fn check_setup(cfg: &UcxConfig) -> Result<(), UcxError> {
    let (major, minor, release) = sys::library_version();
    let (h_major, h_minor) = sys::header_version();
    if major != h_major || minor < h_minor {
        return Err(UcxError::Version {
            headers: format!("{h_major}.{h_minor}"),
            library: format!("{major}.{minor}.{release}"),
        });
    }
    // A configured list was checked when built; the environment's is checked here.
    if cfg.tls().is_none()
        && let Ok(tls) = std::env::var("UCX_TLS")
        && !names_network_transport(&tls)
    {
        return Err(UcxError::Transports { tls });
    }
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(UcxError::Init {
            step: "starting the driver",
            status: "not called inside a tokio runtime".to_owned(),
        });
    }
    Ok(())
}

/// One lane's state in the driver. Lives as long as its endpoint.
struct Entry {
    generation: u32,
    ep: EpId,
    inbox: Arc<Inbox>,
    rx: Reorder,
    /// Bytes delivered in order and not yet moved to the inbox.
    staged: BytesMut,
    /// This side's next message number.
    tx_seq: u64,
    /// The lane's write window; closed when the lane goes, which fails waiting writers.
    window: Arc<Semaphore>,
    closing: Option<Closing>,
}

/// A write whose messages UCX has not completed yet.
struct InFlight {
    lane: LaneKey,
    remaining: usize,
    _permit: OwnedSemaphorePermit,
}

struct Closing {
    deadline: Instant,
    done: oneshot::Sender<()>,
}

struct Driver {
    lanes: Vec<Option<Entry>>,
    generations: Vec<u32>,
    free: Vec<u32>,
    by_ep: HashMap<EpId, LaneKey>,
    /// Rendezvous receives in flight: token -> (lane, message number).
    receives: HashMap<u64, (LaneKey, u64)>,
    next_receive: u64,
    /// Writes in flight, by send token (every message of a write carries its token).
    writes: HashMap<u64, InFlight>,
    next_write: u64,
    /// Lanes with staged bytes to move to their inbox.
    touched: Vec<LaneKey>,
    cmd: mpsc::UnboundedReceiver<Command>,
    /// To hand new lanes a way back here without keeping the driver alive by itself.
    weak: mpsc::WeakUnboundedSender<Command>,
    accepted: Option<mpsc::Sender<Lane>>,
    counters: Arc<Counters>,
    close_timeout: std::time::Duration,
    max_queue: usize,
    shutting_down: bool,
    /// Declared last: dropped after the lanes above are failed (see Drop).
    worker: Worker,
}

/// A driver on loopback that listens nowhere, for the driver's own stories, and the sender of
/// its commands (the driver holds only a weak one).
#[cfg(test)]
fn test_driver() -> (Driver, mpsc::UnboundedSender<Command>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let counters = Arc::new(Counters::default());
    let (d, _, _) = Driver::new(&UcxConfig::loopback(), None, rx, tx.downgrade(), counters)
        .expect("a UCX worker");
    (d, tx)
}
