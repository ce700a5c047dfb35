//! Socket options of classic connections, on both sides.

use std::io;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// Unanswered keepalive probes after which the kernel gives up on a connection.
const KEEPALIVE_PROBES: u32 = 3;

/// How long a classic worker's socket may hold items its frontend does not take before the
/// kernel gives up on the connection (`TCP_USER_TIMEOUT` on the worker's side): a frontend
/// application may stop reading a stream (its own HTTP client is slow, a consumer paused)
/// for far longer than the liveness bound, and its window stays closed all that time; the
/// same bound applies to items unacknowledged because the frontend's host vanished
/// mid-write. Past it the stream ends `Disconnected` on both sides.
pub(crate) const STALLED_SEND_BOUND: Duration = Duration::from_secs(600);

/// Bounds how long the kernel keeps a classic connection whose peer vanished (no FIN, no
/// RST: a host that lost power, a partition): an idle connection whose keepalive probes,
/// sent from a third of `bound` on, go unanswered is reset, and so is one whose sent data
/// stays unacknowledged, or untaken behind a closed window, for `stalled_send`
/// (`TCP_USER_TIMEOUT`). A peer that is alive but quiet (a long prefill) answers the probes
/// and is never cut. A frontend sends only control messages, which a live worker always
/// reads, so its `stalled_send` is `bound`; a worker's is [`STALLED_SEND_BOUND`].
///
/// The velo plane's lanes get the liveness bound (the plane's `idle_timeout`) from
/// velo-tcp; their pumps always read, whatever the application does.
pub(crate) fn set_liveness(
    stream: &TcpStream,
    bound: Duration,
    stalled_send: Duration,
) -> io::Result<()> {
    let sock = SockRef::from(stream);
    // Keepalive times are whole seconds in the kernel.
    let idle = (bound / 3).max(Duration::from_secs(1));
    let interval = (bound / (3 * KEEPALIVE_PROBES)).max(Duration::from_secs(1));
    sock.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(idle)
            .with_interval(interval)
            .with_retries(KEEPALIVE_PROBES),
    )?;
    sock.set_tcp_user_timeout(Some(stalled_send))
}

/// Asserts that `stream` gives up on a vanished peer within `bound`, and on data stalled for
/// `stalled_send`.
#[cfg(test)]
pub(crate) fn assert_liveness(stream: &TcpStream, bound: Duration, stalled_send: Duration) {
    let s = SockRef::from(stream);
    assert_eq!(s.tcp_user_timeout().unwrap(), Some(stalled_send));
    assert!(s.keepalive().unwrap(), "keepalive is on");
    let idle = (bound / 3).max(Duration::from_secs(1));
    assert_eq!(s.tcp_keepalive_time().unwrap().as_secs(), idle.as_secs());
    assert_eq!(s.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
}
