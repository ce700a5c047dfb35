//! A user-space TCP fault proxy for loopback tests.
//!
//! [`FaultProxy`] accepts on `127.0.0.1:0` and forwards every connection to one upstream
//! address (a frontend's listener); workers are pointed at it by rewriting the address in the
//! stream's connection info ([`crate::protocol::rewrite_addr`]). Each direction of every
//! connection follows one [`Fault`], switchable at run time for all connections at once:
//! pass through, delay, stall (a blackhole: nothing read, nothing forwarded), stop reading
//! (a zero window: what was read is still forwarded), reset (RST via `SO_LINGER` 0) and cut
//! after N bytes (the connection is closed mid-stream).
//!
//! # Bounds
//!
//! | bound | setting | at the bound |
//! |---|---|---|
//! | connections | [`ProxyConfig::max_connections`] | new connections are reset at accept |
//! | bytes held per direction | [`ProxyConfig::max_held_bytes`] + one read | the proxy stops reading that direction |
//! | read size | [`ProxyConfig::chunk_bytes`] | - |
//! | upstream connect | [`ProxyConfig::connect_timeout`] | the client is reset |
//! | shutdown | [`SHUTDOWN_TIMEOUT`] | tasks still running are reported, sockets are reset |
//!
//! Every task runs on the proxy's own tracker and stops on [`FaultProxy::shutdown`].

mod control;
mod relay;

pub use control::{Control, parse_control};

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Longest [`FaultProxy::shutdown`] waits for its tasks: 2 s.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);
/// Default cap on connections held at once (each holds two sockets).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default bytes read per call: 64 KiB, a velo batch.
pub const DEFAULT_CHUNK_BYTES: usize = 64 * 1024;
/// Default cap on bytes read and not yet written, per direction of a connection: 256 KiB.
pub const DEFAULT_MAX_HELD_BYTES: usize = 256 * 1024;
/// Default bound on connecting to the upstream: 3 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default socket buffers of the proxy's sockets: 64 KiB, small so that a stalled direction
/// fills the sender's own buffer quickly (the "full send buffer" case).
pub const DEFAULT_SOCKET_BUFFER: u32 = 64 * 1024;
/// Pause after a failed accept (out of descriptors), so the loop never spins.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// Settings of a [`FaultProxy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Most connections held at once; more are reset at accept.
    pub max_connections: usize,
    /// Bytes read per call.
    pub chunk_bytes: usize,
    /// Most bytes read and not yet written, per direction of one connection.
    pub max_held_bytes: usize,
    /// Bound on connecting to the upstream.
    pub connect_timeout: Duration,
    /// `SO_RCVBUF` and `SO_SNDBUF` of the proxy's sockets; `None` keeps the OS default.
    pub socket_buffer: Option<u32>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            max_held_bytes: DEFAULT_MAX_HELD_BYTES,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            socket_buffer: Some(DEFAULT_SOCKET_BUFFER),
        }
    }
}

/// One direction of a proxied connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the connecting client (a worker) to the upstream (a frontend).
    ToUpstream,
    /// From the upstream back to the client.
    ToClient,
}

/// What a direction does with its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything at once.
    Pass,
    /// Forward everything, each read held for this long first.
    Delay(Duration),
    /// A blackhole: read nothing, forward nothing; the sockets stay open.
    Stall,
    /// A zero window: read nothing more; bytes already read are still forwarded.
    StopReading,
    /// Reset the connection: the receiver of this direction gets a RST (`SO_LINGER` 0), the
    /// sender a FIN. New connections are reset at accept while this holds.
    Reset,
    /// Forward this many more bytes, then close the connection (both sides get a FIN).
    CutAfter(u64),
}

/// The faults of both directions, as every connection sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    /// Client to upstream.
    pub to_upstream: Fault,
    /// Upstream to client.
    pub to_client: Fault,
}

impl Faults {
    /// Both directions pass.
    pub const PASS: Self = Self {
        to_upstream: Fault::Pass,
        to_client: Fault::Pass,
    };

    /// The fault of `dir`.
    pub fn get(&self, dir: Direction) -> Fault {
        match dir {
            Direction::ToUpstream => self.to_upstream,
            Direction::ToClient => self.to_client,
        }
    }
}

/// Counters of a proxy, read with [`FaultProxy::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyStats {
    /// Connections accepted and forwarded.
    pub accepted: u64,
    /// Connections reset at accept (over the limit, a Reset fault, upstream unreachable).
    pub refused: u64,
    /// Connections open now.
    pub active: u64,
    /// Connections ended by a Reset fault or an I/O error.
    pub resets: u64,
    /// Connections ended by a CutAfter fault.
    pub cuts: u64,
}

/// Why the proxy cannot do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The proxy forwards only to loopback addresses.
    #[error("the fault proxy forwards only to loopback addresses, not {0}")]
    NotLoopback(SocketAddr),
    /// The listener could not be set up.
    #[error("cannot listen: {0}")]
    Listen(#[from] std::io::Error),
}

/// A running fault proxy; see the module docs.
pub struct FaultProxy {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    stop: CancellationToken,
    tracker: TaskTracker,
}

pub(crate) struct Shared {
    pub(crate) config: ProxyConfig,
    pub(crate) faults: watch::Sender<Faults>,
    upstream: Mutex<SocketAddr>,
    active: AtomicUsize,
    accepted: AtomicU64,
    refused: AtomicU64,
    pub(crate) resets: AtomicU64,
    pub(crate) cuts: AtomicU64,
}

impl Shared {
    pub(crate) fn upstream(&self) -> SocketAddr {
        *self.upstream.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards to `upstream`, every direction passing.
    ///
    /// # Errors
    ///
    /// [`ProxyError::NotLoopback`] for an upstream off this machine; the listener's error.
    pub async fn bind(upstream: SocketAddr, config: ProxyConfig) -> Result<Self, ProxyError> {
        check_loopback(upstream)?;
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        if let Some(bytes) = config.socket_buffer {
            // Accepted sockets inherit the listener's buffers.
            socket.set_recv_buffer_size(bytes)?;
            socket.set_send_buffer_size(bytes)?;
        }
        socket.bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let listener = socket.listen(1024)?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            faults: watch::Sender::new(Faults::PASS),
            upstream: Mutex::new(upstream),
            active: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            cuts: AtomicU64::new(0),
        });
        let (stop, tracker) = (CancellationToken::new(), TaskTracker::new());
        tracker.spawn(accept_loop(
            listener,
            shared.clone(),
            stop.clone(),
            tracker.clone(),
        ));
        Ok(Self {
            shared,
            local_addr,
            stop,
            tracker,
        })
    }

    /// Where clients connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Sets the fault of `dir` for every connection, open and future.
    pub fn set(&self, dir: Direction, fault: Fault) {
        self.shared.faults.send_modify(|f| match dir {
            Direction::ToUpstream => f.to_upstream = fault,
            Direction::ToClient => f.to_client = fault,
        });
    }

    /// Sets both directions at once (a single change, seen atomically by every connection).
    pub fn set_both(&self, faults: Faults) {
        self.shared.faults.send_replace(faults);
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        *self.shared.faults.borrow()
    }

    /// Forwards new connections to `upstream` (open ones keep theirs).
    ///
    /// # Errors
    ///
    /// [`ProxyError::NotLoopback`] for an address off this machine.
    pub fn set_upstream(&self, upstream: SocketAddr) -> Result<(), ProxyError> {
        check_loopback(upstream)?;
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = upstream;
        Ok(())
    }

    /// The proxy's counters.
    pub fn stats(&self) -> ProxyStats {
        let s = &self.shared;
        ProxyStats {
            accepted: s.accepted.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            active: s.active.load(Ordering::Relaxed) as u64,
            resets: s.resets.load(Ordering::Relaxed),
            cuts: s.cuts.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting, resets every connection and waits for the tasks, at most
    /// [`SHUTDOWN_TIMEOUT`]. Returns whether every task ended in time.
    pub async fn shutdown(self) -> bool {
        self.stop.cancel();
        self.tracker.close();
        tokio::time::timeout(SHUTDOWN_TIMEOUT, self.tracker.wait())
            .await
            .is_ok()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("local_addr", &self.local_addr)
            .field("upstream", &self.shared.upstream())
            .field("faults", &self.faults())
            .finish()
    }
}

fn check_loopback(addr: SocketAddr) -> Result<(), ProxyError> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(ProxyError::NotLoopback(addr))
    }
}

/// Accepts until stopped; each connection gets a relay task on `tracker`.
async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        // Cancel safety: `accept` loses no connection when dropped.
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            a = listener.accept() => a,
        };
        let Ok((client, _)) = accepted else {
            tokio::time::sleep(ACCEPT_BACKOFF).await;
            continue;
        };
        let faults = *shared.faults.borrow();
        let over = shared.active.load(Ordering::Acquire) >= shared.config.max_connections;
        if over || faults.to_upstream == Fault::Reset || faults.to_client == Fault::Reset {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            relay::reset(&client);
            continue;
        }
        shared.active.fetch_add(1, Ordering::AcqRel);
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let (shared, stop) = (shared.clone(), stop.clone());
        tracker.spawn(async move {
            serve(client, &shared, &stop).await;
            shared.active.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// Connects one client to the upstream and relays until the connection ends.
async fn serve(client: TcpStream, shared: &Shared, stop: &CancellationToken) {
    let _ = client.set_nodelay(true);
    let upstream = shared.upstream();
    let connect = async {
        let socket = TcpSocket::new_v4()?;
        if let Some(bytes) = shared.config.socket_buffer {
            socket.set_recv_buffer_size(bytes)?;
            socket.set_send_buffer_size(bytes)?;
        }
        socket.connect(upstream).await
    };
    let connected = tokio::select! {
        () = stop.cancelled() => None,
        r = tokio::time::timeout(shared.config.connect_timeout, connect) => r.ok().and_then(Result::ok),
    };
    let Some(upstream) = connected else {
        shared.refused.fetch_add(1, Ordering::Relaxed);
        relay::reset(&client);
        return;
    };
    let _ = upstream.set_nodelay(true);
    relay::run(client, upstream, shared, stop).await;
}
