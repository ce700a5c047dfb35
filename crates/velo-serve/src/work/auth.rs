//! The request plane's handshake: who may send a worker requests, and whom a frontend sends
//! them to. Every connection starts with it, before any request frame; the wire format, and
//! why a proof cannot be replayed or reflected, are in the parent module's docs
//! ([`crate::work`], "Handshake").
//!
//! Both sides hold a [`RequestAuth`]: the cluster secret of the response plane's
//! configuration (`DYN_VELO_CLUSTER_SECRET_PATH`), or none, and its TLS (`DYN_TCP_TLS_*`), or
//! none. [`frontend_handshake`] and [`worker_handshake`] run one side of the secret's
//! handshake each on any stream (the request plane runs it inside TLS when TLS is on, see the
//! parent module's "TLS"), bounded by [`HANDSHAKE_TIMEOUT`] and reading a fixed number of
//! bytes (but for a TLS record a plaintext frontend drains, at most about 18 KiB); either fails with a [`HandshakeError`] naming what is wrong, after which the
//! connection is closed.

use std::time::Duration;

use ring::rand::{SecureRandom, SystemRandom};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use velo_session::ClusterSecret;
use velo_tls::TLS_HANDSHAKE_RECORD;

mod error;
mod settings;

pub use error::{HandshakeError, SecretError};
pub use settings::RequestAuth;

/// How long a handshake may take in all, on either side: far above a few round trips on any
/// network, short enough that a peer that says nothing holds a worker's connection slot
/// briefly. The velo lanes' HELLO exchange has the same bound.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The first bytes of every greeting: the protocol and its version. A request frame's length
/// prefix starts with a zero byte (frames are at most 64 KiB), so a peer that writes frames
/// at once, without greeting, is told apart at its first byte.
pub const MAGIC: [u8; 8] = *b"velo-rq2";
/// A greeting's length in bytes: [`MAGIC`], the sender's role, whether a proof follows, the
/// worker instance it is about, and a nonce.
pub const GREETING_LEN: usize = INSTANCE_AT + 8 + NONCE_LEN;
/// A proof's length in bytes: an HMAC-SHA256 tag.
pub const PROOF_LEN: usize = 32;

/// One side of a request-plane connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The side that connects and sends requests.
    Frontend,
    /// The side that accepts and runs them.
    Worker,
}

impl Side {
    fn byte(self) -> u8 {
        match self {
            Self::Frontend => ROLE_FRONTEND,
            Self::Worker => ROLE_WORKER,
        }
    }

    /// The prover's part of a proof's transcript: its role byte.
    fn tag(self) -> &'static [u8] {
        match self {
            Self::Frontend => &[ROLE_FRONTEND],
            Self::Worker => &[ROLE_WORKER],
        }
    }

    fn other(self) -> Self {
        match self {
            Self::Frontend => Self::Worker,
            Self::Worker => Self::Frontend,
        }
    }
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Frontend => "frontend",
            Self::Worker => "worker",
        })
    }
}

/// The frontend's side of the handshake on a fresh connection: on `Ok`, the worker proved
/// the secret (or neither side has one) and requests may follow. Reads exactly what the
/// handshake needs, nothing of what follows.
///
/// # Errors
///
/// [`HandshakeError`] naming what is wrong; the caller closes the connection and sends no
/// request on it.
pub async fn frontend_handshake<S>(stream: &mut S, auth: &RequestAuth) -> Result<(), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    bounded(Side::Worker, HANDSHAKE_TIMEOUT, frontend(stream, auth)).await
}

/// The worker's side of the handshake on an accepted connection: on `Ok`, the frontend
/// proved the secret (or neither side has one) and its request frames may be read. Reads
/// exactly what the handshake needs: not one byte of a request before the frontend's proof
/// verified.
///
/// # Errors
///
/// [`HandshakeError`] naming what is wrong; the caller closes the connection unread.
pub async fn worker_handshake<S>(stream: &mut S, auth: &RequestAuth) -> Result<(), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    bounded(Side::Frontend, HANDSHAKE_TIMEOUT, worker(stream, auth)).await
}

/// `handshake`, failing with [`HandshakeError::Timeout`] naming `peer` after `bound`.
pub(super) async fn bounded<T>(
    peer: Side,
    bound: Duration,
    handshake: impl Future<Output = Result<T, HandshakeError>>,
) -> Result<T, HandshakeError> {
    tokio::time::timeout(bound, handshake)
        .await
        .map_err(|_| HandshakeError::Timeout { peer, bound })?
}

pub(super) async fn frontend<S>(stream: &mut S, auth: &RequestAuth) -> Result<(), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let peer = Side::Worker;
    let ours = greeting(Side::Frontend, auth);
    send(stream, peer, &ours).await?;
    let theirs = read_greeting(stream, peer).await?;
    same_instance(auth, &theirs, peer)?;
    let Some(secret) = agree(auth, &theirs, peer)? else {
        return Ok(());
    };
    let transcript = |prover: Side| -> [&[u8]; 4] { [LABEL, prover.tag(), &ours, &theirs] };
    send(stream, peer, &secret.mac(&transcript(Side::Frontend))).await?;
    let [verdict] = receive::<_, 1>(stream, peer, "verdict on this frontend's proof").await?;
    match verdict {
        VERDICT_ACCEPTED => {}
        VERDICT_REFUSED => return Err(HandshakeError::Refused),
        value => {
            let what = "verdict";
            return Err(HandshakeError::Malformed { peer, what, value });
        }
    }
    let proof = receive::<_, PROOF_LEN>(stream, peer, "proof").await?;
    if !secret.verify_mac(&transcript(Side::Worker), &proof) {
        return Err(HandshakeError::BadProof { peer });
    }
    Ok(())
}

pub(super) async fn worker<S>(stream: &mut S, auth: &RequestAuth) -> Result<(), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let peer = Side::Frontend;
    let ours = greeting(Side::Worker, auth);
    send(stream, peer, &ours).await?;
    let theirs = read_greeting(stream, peer).await?;
    same_instance(auth, &theirs, peer)?;
    let Some(secret) = agree(auth, &theirs, peer)? else {
        return Ok(());
    };
    let transcript = |prover: Side| -> [&[u8]; 4] { [LABEL, prover.tag(), &theirs, &ours] };
    let proof = receive::<_, PROOF_LEN>(stream, peer, "proof").await?;
    if !secret.verify_mac(&transcript(Side::Frontend), &proof) {
        // Best effort: the frontend learns why; the connection closes whatever happens.
        if send(stream, peer, &[VERDICT_REFUSED]).await.is_err() {
            tracing::debug!("the refused frontend is already gone");
        }
        return Err(HandshakeError::BadProof { peer });
    }
    // The worker proves itself only to a frontend that did: a stranger gets no MAC out of it.
    let mut answer = [0; 1 + PROOF_LEN];
    answer[0] = VERDICT_ACCEPTED;
    answer[1..].copy_from_slice(&secret.mac(&transcript(Side::Worker)));
    send(stream, peer, &answer).await
}

/// This side's greeting: [`MAGIC`], role, mode, the worker instance `auth` names (0 for
/// none), a fresh nonce.
fn greeting(side: Side, auth: &RequestAuth) -> [u8; GREETING_LEN] {
    let mode = if auth.has_secret() {
        MODE_SECRET
    } else {
        MODE_OPEN
    };
    let mut g = greeting_with(side, mode);
    g[INSTANCE_AT..INSTANCE_AT + 8].copy_from_slice(&auth.instance.unwrap_or(0).to_be_bytes());
    g
}

/// A frontend's greeting to a plaintext worker when TLS is required: it says so, in clear,
/// and the frontend closes (see [`super::tls`]).
pub(super) fn tls_required_greeting() -> [u8; GREETING_LEN] {
    greeting_with(Side::Frontend, MODE_TLS_REQUIRED)
}

fn greeting_with(side: Side, mode: u8) -> [u8; GREETING_LEN] {
    let mut g = [0; GREETING_LEN];
    g[..MAGIC.len()].copy_from_slice(&MAGIC);
    g[MAGIC.len()] = side.byte();
    g[MAGIC.len() + 1] = mode;
    // The generator the velo lanes' nonces come from. Without it nothing can be
    // authenticated, so its failure is fatal there too.
    SystemRandom::new()
        .fill(&mut g[INSTANCE_AT + 8..])
        .expect("the OS random generator works");
    g
}

/// Reads the peer's greeting and checks its magic and role (its mode is [`agree`]'s).
async fn read_greeting<S>(stream: &mut S, peer: Side) -> Result<[u8; GREETING_LEN], HandshakeError>
where
    S: AsyncRead + Unpin,
{
    // The first byte alone: a peer writing frames at once is told at its first byte.
    let [first] = receive::<_, 1>(stream, peer, "greeting").await?;
    if first == TLS_HANDSHAKE_RECORD && peer == Side::Worker {
        // A worker speaking TLS to a plaintext frontend: its ClientHello is read to its end
        // (best effort, within the handshake's bound) so closing resets nothing the worker
        // has yet to read, and it sees the plaintext greeting for what it is.
        super::tls::drain_record(stream).await;
        return Err(HandshakeError::NoLocalTls { peer });
    }
    if first != MAGIC[0] {
        return Err(HandshakeError::NotAGreeting { peer });
    }
    let rest = receive::<_, { GREETING_LEN - 1 }>(stream, peer, "greeting").await?;
    let mut g = [0; GREETING_LEN];
    g[0] = first;
    g[1..].copy_from_slice(&rest);
    if g[..MAGIC.len()] != MAGIC {
        return Err(HandshakeError::NotAGreeting { peer });
    }
    match g[MAGIC.len()] {
        role if role == peer.byte() => Ok(g),
        role if role == peer.other().byte() => Err(HandshakeError::WrongRole {
            peer,
            got: peer.other(),
        }),
        value => Err(HandshakeError::Malformed {
            peer,
            what: "role",
            value,
        }),
    }
}

/// The worker instance a greeting names, `None` for none (0).
fn instance_of(g: &[u8; GREETING_LEN]) -> Option<u64> {
    let mut id = [0; 8];
    id.copy_from_slice(&g[INSTANCE_AT..INSTANCE_AT + 8]);
    Some(u64::from_be_bytes(id)).filter(|&id| id != 0)
}

/// Whether the worker instance this side names and the one the peer's greeting names agree:
/// a frontend's is the instance it means to reach (from discovery), a worker's its own. Checked
/// only when both name one; the greetings are in both proofs' transcripts, so a relay cannot
/// change what the frontend named.
fn same_instance(
    auth: &RequestAuth,
    theirs: &[u8; GREETING_LEN],
    peer: Side,
) -> Result<(), HandshakeError> {
    let (Some(ours), Some(their)) = (auth.instance, instance_of(theirs)) else {
        return Ok(());
    };
    if ours == their {
        return Ok(());
    }
    let (meant, actual) = match peer {
        Side::Worker => (ours, their),
        Side::Frontend => (their, ours),
    };
    Err(HandshakeError::WrongInstance {
        peer,
        meant,
        actual,
    })
}

/// The secret both sides prove, `None` when neither has one; an error when one side only
/// has one.
fn agree<'a>(
    auth: &'a RequestAuth,
    theirs: &[u8; GREETING_LEN],
    peer: Side,
) -> Result<Option<&'a ClusterSecret>, HandshakeError> {
    match (theirs[MAGIC.len() + 1], &auth.secret) {
        (MODE_OPEN, None) => Ok(None),
        (MODE_SECRET, Some(secret)) => Ok(Some(secret)),
        (MODE_OPEN, Some(_)) => Err(HandshakeError::PeerHasNoSecret { peer }),
        (MODE_SECRET, None) => Err(HandshakeError::NoLocalSecret { peer }),
        // Unauthenticated and in plaintext: only a frontend's claim, and only a claim.
        (MODE_TLS_REQUIRED, _) if peer == Side::Frontend => Err(HandshakeError::ClaimsTlsRequired),
        (value, _) => Err(HandshakeError::Malformed {
            peer,
            what: "mode",
            value,
        }),
    }
}

async fn send<S>(stream: &mut S, peer: Side, bytes: &[u8]) -> Result<(), HandshakeError>
where
    S: AsyncWrite + Unpin,
{
    let io = |source| HandshakeError::Io { peer, source };
    stream.write_all(bytes).await.map_err(io)?;
    stream.flush().await.map_err(io)
}

/// Exactly `N` bytes from the peer.
async fn receive<S, const N: usize>(
    stream: &mut S,
    peer: Side,
    awaiting: &'static str,
) -> Result<[u8; N], HandshakeError>
where
    S: AsyncRead + Unpin,
{
    let mut buf = [0; N];
    match stream.read_exact(&mut buf).await {
        Ok(_) => Ok(buf),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(HandshakeError::Closed { peer, awaiting })
        }
        Err(source) => Err(HandshakeError::Io { peer, source }),
    }
}

/// A greeting's role byte for a frontend.
const ROLE_FRONTEND: u8 = 1;
/// A greeting's role byte for a worker.
const ROLE_WORKER: u8 = 2;
/// A greeting's mode byte: the sender has no cluster secret; no proof follows.
const MODE_OPEN: u8 = 0;
/// A greeting's mode byte: the sender has a cluster secret and proves it.
const MODE_SECRET: u8 = 1;
/// A greeting's mode byte: the sender (a frontend) requires TLS and this greeting came in
/// plaintext; the sender closes next.
const MODE_TLS_REQUIRED: u8 = 2;
/// The worker's verdict on the frontend's proof: refused (the worker closes next).
const VERDICT_REFUSED: u8 = 0;
/// The worker's verdict on the frontend's proof: accepted, the worker's own proof follows.
const VERDICT_ACCEPTED: u8 = 1;
/// Where a greeting's worker instance starts: 8 bytes, big-endian; 0 names none.
const INSTANCE_AT: usize = MAGIC.len() + 2;
/// A nonce's length in bytes (256 bits: never repeats).
const NONCE_LEN: usize = 32;
/// The label every proof's transcript starts with: this protocol and its version, so no
/// proof here is a velo lane's HELLO proof (whose labels begin `velo v3`) or another
/// protocol's.
const LABEL: &[u8] = b"velo-serve request plane v2";

#[cfg(test)]
mod tests;
