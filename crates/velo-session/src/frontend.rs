//! The frontend's endpoint: connections from workers, attached lane by lane as transports
//! complete handshakes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::task::TaskTracker;
use velo_mux::handshake::{Expect, HandshakeError};

use velo_mux::{LaneId, LaneState, Mux, MuxConfig, MuxStats, Side};
use velo_wire::{CloseCode, Hello, InstanceId, Role};

use crate::auth::{self, ClusterSecret};
use crate::peer::{NotStarted, Refusal, Retired};
use crate::{Acceptor, LaneIo, Peer, clock};

/// Settings of a [`FrontendEndpoint`].
#[derive(Debug, Clone)]
pub struct FrontendSettings {
    /// The mux configuration (frontend side): window, limits, flush policy for grants. Its
    /// lane count is ignored: each worker chooses its own (up to 64).
    pub mux: MuxConfig,
    /// Receive buffer of each lane's reader, in bytes.
    pub read_buffer: usize,
    /// The cluster secret every worker must prove in its handshake; `None` takes workers
    /// without one (and refuses those offering one: a secret on one side only is a
    /// misconfiguration, reported on both).
    pub secret: Option<ClusterSecret>,
}

impl FrontendSettings {
    /// The defaults with `mux` (a frontend-side configuration): no secret.
    pub fn new(mux: MuxConfig) -> Self {
        Self {
            mux,
            read_buffer: crate::DEFAULT_READ_BUFFER,
            secret: None,
        }
    }
}

/// Why a handshaken lane could not join a connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// The HELLO is not acceptable.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// The worker's lanes disagree on the lane count.
    #[error("lane {index} announces {count} lanes, but the connection has {expected}")]
    LaneCount {
        /// The lane's index.
        index: u16,
        /// Its announced count.
        count: u16,
        /// The connection's count.
        expected: u16,
    },
    /// That lane of the connection is already connected (or was, and died).
    #[error("lane {0} of this connection is already in use")]
    LaneInUse(u16),
    /// The endpoint is shutting down and takes no new lanes.
    #[error("the frontend is shutting down")]
    ShuttingDown,
    /// The worker's HELLO and this side disagree on the cluster secret.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// The worker's connection ended each time this lane was about to join it (its other
    /// lanes died meanwhile, [`ATTACH_ATTEMPTS`] times): the worker dials again.
    #[error("the worker's connection ended {ATTACH_ATTEMPTS} times as lane {0} joined it")]
    ConnectionEnded(u16),
    /// The worker's lanes announce different discovery instances.
    #[error("lane {index} announces worker instance {got:?}, the connection {expected:?}")]
    WorkerInstance {
        /// The lane's index.
        index: u16,
        /// Its announced instance.
        got: Option<u64>,
        /// The connection's.
        expected: Option<u64>,
    },
}

impl AttachError {
    /// The close code telling the worker about this error.
    pub fn close_code(&self) -> CloseCode {
        match self {
            Self::Handshake(e) => e.close_code(),
            Self::LaneCount { .. } | Self::LaneInUse(_) | Self::WorkerInstance { .. } => {
                CloseCode::BAD_HANDSHAKE
            }
            Self::ShuttingDown => CloseCode::SHUTTING_DOWN,
            Self::ConnectionEnded(_) => CloseCode::NORMAL,
            Self::Unauthenticated(_) => CloseCode::UNAUTHENTICATED,
        }
    }
}

/// How many times a lane tries to join its worker's connection when that connection keeps
/// ending under it (each try after the first joins a new one).
pub const ATTACH_ATTEMPTS: u32 = 3;

/// A frontend's side of the response plane: accepts connections from workers and hands every
/// stream they open to an [`Acceptor`].
#[derive(Clone)]
pub struct FrontendEndpoint {
    inner: Arc<FrontendInner>,
}

struct FrontendInner {
    settings: FrontendSettings,
    instance: InstanceId,
    acceptor: Arc<dyn Acceptor>,
    peers: Mutex<HashMap<InstanceId, Peer>>,
    /// Counters of connections that are done.
    retired: Retired,
    tracker: TaskTracker,
    closing: AtomicBool,
    /// Cancelled by `close`: accept loops stop.
    closed: tokio_util::sync::CancellationToken,
    /// Cancelled by `abort`: every lane stops at once.
    abort: tokio_util::sync::CancellationToken,
}

impl FrontendEndpoint {
    /// A frontend endpoint with instance id `instance`; lane tasks are spawned on `tracker`.
    ///
    /// # Panics
    ///
    /// If `settings.mux` is not a frontend-side configuration.
    pub fn new(
        settings: FrontendSettings,
        instance: InstanceId,
        acceptor: Arc<dyn Acceptor>,
        tracker: TaskTracker,
    ) -> Self {
        assert_eq!(
            settings.mux.side(),
            Side::Frontend,
            "a frontend endpoint needs a frontend mux config"
        );
        Self {
            inner: Arc::new(FrontendInner {
                settings,
                instance,
                acceptor,
                peers: Mutex::new(HashMap::new()),
                retired: Retired::default(),
                tracker,
                closing: AtomicBool::new(false),
                closed: tokio_util::sync::CancellationToken::new(),
                abort: tokio_util::sync::CancellationToken::new(),
            }),
        }
    }

    /// Cancelled when the endpoint closes (its accept loops stop).
    pub(crate) fn closed_token(&self) -> &tokio_util::sync::CancellationToken {
        &self.inner.closed
    }

    /// The tracker lane and accept tasks run on.
    pub(crate) fn tracker(&self) -> &TaskTracker {
        &self.inner.tracker
    }

    /// This frontend's instance id (part of every stream address it hands out).
    pub fn instance(&self) -> InstanceId {
        self.inner.instance
    }

    /// The cluster secret workers must prove, if any.
    pub(crate) fn secret(&self) -> Option<&ClusterSecret> {
        self.inner.settings.secret.as_ref()
    }

    /// Checks a worker's HELLO (identity, role, lane numbering against its connection so
    /// far, the cluster secret's offer) and returns this side's answer, with a fresh
    /// challenge nonce when a secret is configured.
    ///
    /// # Errors
    ///
    /// The [`AttachError`] to send back in a CLOSE frame.
    pub fn answer(&self, worker: &Hello) -> Result<Hello, AttachError> {
        Expect {
            role: Role::Worker,
            local_instance: self.inner.instance,
            peer_instance: None,
            lane: None,
        }
        .check(worker)?;
        match (&self.inner.settings.secret, worker.auth_nonce) {
            (Some(_), None) => {
                return Err(AttachError::Unauthenticated(
                    "this frontend requires the cluster secret; the worker offers no proof",
                ));
            }
            (None, Some(_)) => {
                return Err(AttachError::Unauthenticated(
                    "the worker offers a cluster secret, but this frontend has none configured",
                ));
            }
            _ => {}
        }
        if self.inner.closing.load(Ordering::Acquire) {
            return Err(AttachError::ShuttingDown);
        }
        let existing = self
            .inner
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&worker.instance_id)
            .cloned();
        if let Some(peer) = existing.filter(|p| !p.inner.done.is_cancelled()) {
            check_joinable(&peer, worker)?;
        }
        let mut reply = self.inner.settings.mux.hello(
            worker.lane_index,
            self.inner.instance,
            worker.instance_id,
        );
        reply.lane_count = worker.lane_count;
        reply.auth_nonce = self.inner.settings.secret.as_ref().map(|_| auth::nonce());
        Ok(reply)
    }

    /// Adds a handshaken lane (after [`answer`](Self::answer) was sent) to the worker's
    /// connection, creating the connection on its first lane, and starts the lane's tasks.
    ///
    /// # Errors
    ///
    /// [`AttachError`]: the transport should send a CLOSE with its code and close the lane.
    pub fn attach_lane(&self, worker: &Hello, io: LaneIo) -> Result<(), AttachError> {
        if self.inner.closing.load(Ordering::Acquire) {
            return Err(AttachError::ShuttingDown);
        }
        let mut io = io;
        for _ in 0..ATTACH_ATTEMPTS {
            let peer = self.connection_of(worker);
            check_joinable(&peer, worker)?;
            let lane = LaneId(worker.lane_index);
            let read_buffer = self.inner.settings.read_buffer;
            match peer.start_lane(lane, worker, io, &self.inner.tracker, read_buffer) {
                Ok(()) => {
                    // `close` may have run since the check above, before this connection
                    // was listed or before this lane came up: it must not outlive the close.
                    if self.inner.closing.load(Ordering::Acquire) {
                        peer.close(CloseCode::SHUTTING_DOWN, "frontend shutting down");
                    }
                    return Ok(());
                }
                // Its last lane died since the lookup: this lane joins a new connection.
                Err(NotStarted {
                    io: back,
                    why: Refusal::Done,
                }) => io = back,
                // Another lane with its index came up since the check.
                Err(NotStarted {
                    why: Refusal::InUse,
                    ..
                }) => return Err(AttachError::LaneInUse(worker.lane_index)),
            }
        }
        Err(AttachError::ConnectionEnded(worker.lane_index))
    }

    /// The worker's connection (created on its first lane), forgetting those that are done.
    fn connection_of(&self, worker: &Hello) -> Peer {
        let mut peers = self
            .inner
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        peers.retain(|_, p| !p.inner.done.is_cancelled());
        let peer = peers.entry(worker.instance_id).or_insert_with(|| {
            let mux_config = self.inner.settings.mux.with_lanes(worker.lane_count);
            let mux = Mux::new(mux_config, clock::now());
            Peer::new(
                mux,
                worker.instance_id,
                worker.worker_instance,
                Some(self.inner.acceptor.clone()),
                None, // a frontend opens no streams, so it loses none before an ACCEPT
                &self.inner.abort,
                self.inner.retired.clone(),
            )
        });
        peer.clone()
    }

    /// Connections currently attached.
    pub fn peers(&self) -> Vec<Peer> {
        let peers = self
            .inner
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        peers
            .values()
            .filter(|p| !p.inner.done.is_cancelled())
            .cloned()
            .collect()
    }

    /// The sum of every connection's counters, those of connections already gone included
    /// (so each total only ever grows).
    pub fn stats(&self) -> MuxStats {
        let peers = self
            .inner
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.inner.retired.total(peers.values())
    }

    /// Tells every worker this frontend takes no new streams (GOAWAY); open ones finish.
    pub fn go_away(&self) {
        for p in self.peers() {
            p.go_away(velo_wire::GoAwayCode::DRAIN);
        }
    }

    /// Stops every lane at once, abandoning writes in progress.
    pub fn abort(&self) {
        self.close();
        self.inner.abort.cancel();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closing(&self) -> bool {
        self.inner.closing.load(Ordering::Acquire)
    }

    /// Stops its accept loops, refuses new lanes and closes every lane (open streams end as
    /// lost). The lane tasks end on their own; wait for them on the tracker.
    pub fn close(&self) {
        self.inner.closing.store(true, Ordering::Release);
        self.inner.closed.cancel();
        for p in self.peers() {
            p.close(CloseCode::SHUTTING_DOWN, "frontend shutting down");
        }
    }
}

/// Every lane of a connection announces the same worker instance.
/// Whether the lane `worker`'s HELLO announces may join `peer`: the same lane count, a lane
/// not taken yet, the same worker instance.
fn check_joinable(peer: &Peer, worker: &Hello) -> Result<(), AttachError> {
    let lanes = peer.lock().mux.config().lanes();
    if worker.lane_count != lanes {
        return Err(AttachError::LaneCount {
            index: worker.lane_index,
            count: worker.lane_count,
            expected: lanes,
        });
    }
    if peer.lane_state(LaneId(worker.lane_index)) != LaneState::Down {
        return Err(AttachError::LaneInUse(worker.lane_index));
    }
    check_instance(peer, worker)
}

fn check_instance(peer: &Peer, worker: &Hello) -> Result<(), AttachError> {
    if peer.worker_instance() != worker.worker_instance {
        return Err(AttachError::WorkerInstance {
            index: worker.lane_index,
            got: worker.worker_instance,
            expected: peer.worker_instance(),
        });
    }
    Ok(())
}
