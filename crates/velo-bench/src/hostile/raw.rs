//! Speaking to the frontend by hand: TCP from a chosen loopback address, TLS with the run's
//! CA, HELLOs of any shape, and reading what comes back.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use velo_tls::tokio_rustls::client::TlsStream;
use velo_tls::{ClientTls, Trust};
use velo_wire::{Close, Frame, FrameDecoder, Hello, InstanceId, Role};

/// Bound on waiting for the frontend's answer.
pub(super) const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// A TCP connection to `to` from `from` (a loopback address: 127.0.0.2 and up).
pub(super) async fn tcp(from: IpAddr, to: SocketAddr) -> io::Result<TcpStream> {
    let sock = TcpSocket::new_v4()?;
    sock.bind(SocketAddr::new(from, 0))?;
    sock.connect(to).await
}

/// A TLS connection over `tcp`, verifying the frontend with the CA at `ca`.
pub(super) async fn tls(tcp: TcpStream, ca: &Path) -> io::Result<TlsStream<TcpStream>> {
    let client = ClientTls::new(
        Trust::Ca(ca.to_owned()),
        None,
        None,
        velo_tls::DEFAULT_HANDSHAKE_TIMEOUT,
    )
    .map_err(io::Error::other)?;
    let name = client.server_name(std::net::Ipv4Addr::LOCALHOST.into());
    client.connector().connect(name, tcp).await
}

/// A worker HELLO for lane 0 of 1 to any frontend instance.
pub(super) fn hello(nonce: Option<[u8; 32]>, idle_timeout_ms: u32) -> Hello {
    Hello {
        role: Role::Worker,
        lane_index: 0,
        lane_count: 1,
        instance_id: InstanceId::from_u128(rand::random::<u128>() | 1),
        peer_instance_id: InstanceId::ANY,
        max_frame_len: velo_wire::DEFAULT_MAX_FRAME_LEN,
        initial_window: 32,
        idle_timeout_ms,
        capabilities: 0,
        auth_nonce: nonce,
        worker_instance: Some(super::INSIDER_INSTANCE),
    }
}

/// `frame`'s bytes.
pub(super) fn bytes(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::new();
    frame.encode(&mut out);
    out
}

/// The frames `s` sends until it sends a CLOSE (included), ends, or `n` frames came; bounded
/// by [`ANSWER_WITHIN`].
pub(super) async fn frames<S: AsyncRead + Unpin>(s: &mut S, n: usize) -> Vec<Frame> {
    let mut out = Vec::new();
    let mut buf = BytesMut::new();
    let mut decoder = FrameDecoder::new(velo_wire::DEFAULT_MAX_FRAME_LEN);
    let read = async {
        loop {
            while let Ok(Some(f)) = decoder.decode(&mut buf) {
                let close = matches!(f, Frame::Close(_));
                out.push(f);
                if close || out.len() >= n {
                    return;
                }
            }
            buf.reserve(4096);
            match s.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    let _ = tokio::time::timeout(ANSWER_WITHIN, read).await;
    out
}

/// The CLOSE among `frames`, if any.
pub(super) fn close_of(frames: &[Frame]) -> Option<&Close> {
    frames.iter().find_map(|f| match f {
        Frame::Close(c) => Some(c),
        _ => None,
    })
}

/// A lane authenticated by hand (TLS, HELLO with a nonce, the secret's proof), as an insider
/// holding the secret would have: returns it with the bytes after its handshake unread.
pub(super) async fn insider_lane(
    from: IpAddr,
    to: SocketAddr,
    ca: &Path,
    secret: &velo_session::ClusterSecret,
) -> io::Result<TlsStream<TcpStream>> {
    let mut s = tls(tcp(from, to).await?, ca).await?;
    let mine = hello(Some(rand::random::<[u8; 32]>()), 10_000);
    s.write_all(&bytes(&Frame::Hello(mine))).await?;
    let got = frames(&mut s, 2).await;
    let Some(Frame::Hello(answer)) = got.first() else {
        return Err(io::Error::other(format!("no answer: {got:?}")));
    };
    let proof = secret.proof(Role::Worker, &mine, answer);
    s.write_all(&bytes(&Frame::Auth(proof))).await?;
    Ok(s)
}

/// Writes `bytes` and closes the writing side, ignoring errors (the peer may be gone).
pub(super) async fn send_and_wait<S: AsyncWrite + AsyncRead + Unpin>(
    s: &mut S,
    out: &[u8],
) -> Vec<Frame> {
    let _ = s.write_all(out).await;
    let _ = s.flush().await;
    frames(s, 16).await
}

/// Tallies outcomes into "a x3, b x1".
pub(super) fn tally(outcomes: impl IntoIterator<Item = String>) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for o in outcomes {
        match counts.iter_mut().find(|(k, _)| *k == o) {
            Some((_, n)) => *n += 1,
            None => counts.push((o, 1)),
        }
    }
    counts
        .iter()
        .map(|(k, n)| format!("{k} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A short form of a CLOSE (or of its absence) for the table.
pub(super) fn describe(frames: &[Frame]) -> String {
    match close_of(frames) {
        Some(c) => format!("closed ({})", c.code),
        None if frames.is_empty() => "dropped".to_owned(),
        None => "answered".to_owned(),
    }
}
