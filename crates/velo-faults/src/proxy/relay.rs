//! One proxied connection: two directions ([`Pipe`]s), each following its fault, driven by one
//! task so that the task owns both sockets and can end the connection the way the fault says.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Direction, Fault, Shared};

/// How a connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Both directions reached their end of stream and passed it on.
    Finished,
    /// A `CutAfter` fault used up its bytes: both sides get a FIN.
    Cut,
    /// A `Reset` fault: the receiver of the direction gets a RST, the sender a FIN.
    Reset(Direction),
    /// An I/O error on either socket, or the proxy is stopping: both sides get a RST.
    Abort,
}

/// Makes the next close of `stream` send a RST (`SO_LINGER` 0) instead of a FIN.
pub(crate) fn reset(stream: &TcpStream) {
    // Best effort: a socket that cannot take the option is closed with a FIN instead.
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// Relays between `client` and `upstream` until the connection ends, then closes both
/// sockets as the end requires.
pub(crate) async fn run(
    mut client: TcpStream,
    mut upstream: TcpStream,
    shared: &Shared,
    stop: &CancellationToken,
) {
    let end = {
        let (cr, cw) = client.split();
        let (ur, uw) = upstream.split();
        let mut up = Pipe::new(cr, uw, shared);
        let mut down = Pipe::new(ur, cw, shared);
        relay(&mut up, &mut down, shared, stop).await
    };
    match end {
        End::Finished => {}
        End::Cut => {
            shared.cuts.fetch_add(1, Ordering::Relaxed);
        }
        End::Reset(Direction::ToUpstream) => reset(&upstream),
        End::Reset(Direction::ToClient) => reset(&client),
        End::Abort => {
            reset(&client);
            reset(&upstream);
        }
    }
    if matches!(end, End::Reset(_) | End::Abort) {
        shared.resets.fetch_add(1, Ordering::Relaxed);
    }
    // Dropping the sockets closes them: FIN, or RST where `reset` was called.
}

/// Runs both directions until one of them ends the connection or both finish. Fault changes
/// are applied between steps.
async fn relay(
    up: &mut Pipe<'_>,
    down: &mut Pipe<'_>,
    shared: &Shared,
    stop: &CancellationToken,
) -> End {
    let mut faults = shared.faults.subscribe();
    loop {
        let now = *faults.borrow_and_update();
        if let Some(end) = up.apply(now.to_upstream, Direction::ToUpstream) {
            return end;
        }
        if let Some(end) = down.apply(now.to_client, Direction::ToClient) {
            return end;
        }
        loop {
            if up.finished() && down.finished() {
                return End::Finished;
            }
            // Cancel safety: `changed` loses no change, and each `step` changes its pipe only
            // after one of its own awaits completed (see `Pipe::step`). Biased: a fault that
            // was set before bytes arrived is applied before they are read.
            tokio::select! {
                biased;
                () = stop.cancelled() => return End::Abort,
                changed = faults.changed() => {
                    if changed.is_err() {
                        return End::Abort;
                    }
                    break;
                }
                end = up.step() => if let Some(end) = end { return end },
                end = down.step() => if let Some(end) = end { return end },
            }
        }
    }
}

/// One direction: reads from `src`, holds what it read (bounded), writes it to `dst`.
struct Pipe<'a> {
    src: ReadHalf<'a>,
    dst: WriteHalf<'a>,
    buf: BytesMut,
    /// Chunks read and not yet written, each with the time it may be written.
    held: VecDeque<(Instant, Bytes)>,
    held_bytes: usize,
    fault: Fault,
    /// Bytes still to forward before a `CutAfter` fault closes the connection.
    cut_left: Option<u64>,
    src_eof: bool,
    dst_shut: bool,
    chunk_bytes: usize,
    max_held_bytes: usize,
}

/// What one step's I/O did.
enum Io {
    Read(std::io::Result<usize>),
    Wrote(std::io::Result<usize>),
}

impl<'a> Pipe<'a> {
    fn new(src: ReadHalf<'a>, dst: WriteHalf<'a>, shared: &Shared) -> Self {
        let chunk_bytes = shared.config.chunk_bytes.max(1);
        Self {
            src,
            dst,
            buf: BytesMut::with_capacity(chunk_bytes),
            held: VecDeque::new(),
            held_bytes: 0,
            fault: Fault::Pass,
            cut_left: None,
            src_eof: false,
            dst_shut: false,
            chunk_bytes,
            max_held_bytes: shared.config.max_held_bytes,
        }
    }

    /// Whether this direction has passed its end of stream on.
    fn finished(&self) -> bool {
        self.dst_shut
    }

    /// Takes `fault` for this direction; returns how the connection ends if it ends now.
    fn apply(&mut self, fault: Fault, dir: Direction) -> Option<End> {
        if fault == self.fault {
            return None;
        }
        self.fault = fault;
        self.cut_left = None;
        match fault {
            Fault::Reset => Some(End::Reset(dir)),
            Fault::CutAfter(0) => Some(End::Cut),
            Fault::CutAfter(n) => {
                self.cut_left = Some(n);
                None
            }
            Fault::Pass | Fault::Delay(_) | Fault::Stall | Fault::StopReading => None,
        }
    }

    /// Makes one unit of progress: one read, one write, or passing the end of stream on.
    /// Never resolves while the fault allows nothing. Cancel safe: the pipe changes only
    /// after an await completed (`read_buf` and `write` are cancel safe; a cancelled
    /// `shutdown` is simply repeated).
    async fn step(&mut self) -> Option<End> {
        let reading = !self.src_eof
            && self.held_bytes < self.max_held_bytes
            && matches!(
                self.fault,
                Fault::Pass | Fault::Delay(_) | Fault::CutAfter(_)
            );
        let writing = !self.held.is_empty() && self.fault != Fault::Stall;
        if !reading && !writing {
            if self.src_eof && self.held.is_empty() && !self.dst_shut {
                // The peer's FIN, passed on.
                let _ = self.dst.shutdown().await;
                self.dst_shut = true;
                return None;
            }
            return std::future::pending().await;
        }
        if self.buf.capacity() - self.buf.len() < self.chunk_bytes / 2 {
            self.buf.reserve(self.chunk_bytes);
        }
        let limit = self
            .cut_left
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        let io = tokio::select! {
            r = self.src.read_buf(&mut self.buf), if reading => Io::Read(r),
            r = write_due(&mut self.dst, self.held.front(), limit), if writing => Io::Wrote(r),
        };
        match io {
            Io::Read(r) => self.on_read(r),
            Io::Wrote(r) => self.on_written(r),
        }
    }

    fn on_read(&mut self, r: std::io::Result<usize>) -> Option<End> {
        match r {
            Err(_) => Some(End::Abort),
            Ok(0) => {
                self.src_eof = true;
                None
            }
            Ok(n) => {
                let due = match self.fault {
                    Fault::Delay(d) => Instant::now() + d,
                    _ => Instant::now(),
                };
                self.held.push_back((due, self.buf.split().freeze()));
                self.held_bytes += n;
                None
            }
        }
    }

    fn on_written(&mut self, r: std::io::Result<usize>) -> Option<End> {
        let n = match r {
            Err(_) | Ok(0) => return Some(End::Abort),
            Ok(n) => n,
        };
        if let Some((_, front)) = self.held.front_mut() {
            front.advance(n.min(front.len()));
            if front.is_empty() {
                self.held.pop_front();
            }
        }
        self.held_bytes = self.held_bytes.saturating_sub(n);
        match &mut self.cut_left {
            Some(left) => {
                *left = left.saturating_sub(n as u64);
                (*left == 0).then_some(End::Cut)
            }
            None => None,
        }
    }
}

/// Writes (part of) `chunk` to `dst` once it is due, at most `limit` bytes.
async fn write_due(
    dst: &mut WriteHalf<'_>,
    chunk: Option<&(Instant, Bytes)>,
    limit: usize,
) -> std::io::Result<usize> {
    let Some((due, bytes)) = chunk else {
        return std::future::pending().await;
    };
    tokio::time::sleep_until(*due).await;
    let n = bytes.len().min(limit);
    dst.write(&bytes[..n]).await
}
