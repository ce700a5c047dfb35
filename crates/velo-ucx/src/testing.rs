//! Raw lanes for this crate's loopback tests (feature `__testing`, never for users): speak
//! bytes over a UCX lane without the handshake, to play a peer of another version or one that
//! misbehaves.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use velo_session::{LaneRead, LaneWrite};

use crate::driver::{self, Command, Handle};
use crate::lane::Lane;
use crate::{UcxConfig, UcxError, stats};

/// A UCX worker that dials and (optionally) listens for raw lanes.
pub struct RawEndpoint {
    handle: Handle,
    accepted: Option<mpsc::Receiver<Lane>>,
    port: Option<u16>,
}

/// A lane without any velo handshake.
pub struct RawLane(Lane);

impl RawEndpoint {
    /// A raw endpoint, listening on `listen` if given.
    ///
    /// # Errors
    ///
    /// UCX set-up failures.
    pub fn new(
        listen: Option<SocketAddr>,
        cfg: &UcxConfig,
        tracker: &TaskTracker,
    ) -> Result<Self, UcxError> {
        let running = driver::start(cfg, listen, Arc::new(stats::Counters::default()), tracker)?;
        Ok(Self {
            handle: running.handle,
            accepted: running.accepted,
            port: running.port,
        })
    }

    /// The listener's port.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Dials a lane to `addr`.
    ///
    /// # Errors
    ///
    /// When UCX refuses at once (most failures arrive later, on the lane).
    pub async fn connect(&self, addr: SocketAddr) -> Result<RawLane, String> {
        self.handle
            .connect(addr)
            .await
            .map(RawLane)
            .map_err(|e| e.to_string())
    }

    /// The next lane the listener connected.
    pub async fn accept(&mut self) -> Option<RawLane> {
        self.accepted.as_mut()?.recv().await.map(RawLane)
    }

    /// Stops the driver at once, force-closing every endpoint.
    pub fn abort(&self) {
        self.handle.send(Command::Abort);
    }
}

impl RawLane {
    /// Appends received bytes to `buf`; 0 at the peer's orderly end.
    ///
    /// # Errors
    ///
    /// The lane failed.
    pub async fn read(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        poll_fn(|cx| self.0.poll_read(cx, buf)).await
    }

    /// Sends `bytes` as one write.
    ///
    /// # Errors
    ///
    /// The lane failed.
    pub async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.write_chunks(vec![Bytes::copy_from_slice(bytes)]).await
    }

    /// Sends `chunks` as one write.
    ///
    /// # Errors
    ///
    /// The lane failed.
    pub async fn write_chunks(&mut self, mut chunks: Vec<Bytes>) -> io::Result<()> {
        poll_fn(|cx| self.0.poll_write(cx, &mut chunks)).await
    }

    /// Ends the lane in order.
    ///
    /// # Errors
    ///
    /// Never in practice (kept for symmetry with the session's lanes).
    pub async fn close(&mut self) -> io::Result<()> {
        poll_fn(|cx| self.0.poll_close(cx)).await
    }
}
