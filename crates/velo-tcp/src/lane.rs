//! A lane over one TCP stream: velo-session's byte-stream lane, split into the stream's owned
//! halves (no lock between the lane's reader and writer).

use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use velo_session::StreamLane;

/// A TCP connection as a lane.
pub(crate) type TcpLane = StreamLane<TcpStream, OwnedReadHalf, OwnedWriteHalf>;

/// `stream` as a lane, before its handshake.
pub(crate) fn tcp_lane(stream: TcpStream) -> TcpLane {
    let peer = stream.peer_addr().ok();
    StreamLane::new(stream, TcpStream::into_split).with_peer(peer)
}
