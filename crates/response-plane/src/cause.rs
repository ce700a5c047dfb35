//! The typed causes inside [`ResponseError`](crate::ResponseError): what exactly went wrong,
//! with the source error kept (`std::error::Error::source`), without naming a lower layer's
//! types in this crate's public API.

use std::fmt;
use std::sync::Arc;

/// A lower layer's error, kept whole as the [`source`](std::error::Error::source) of the
/// error that carries it. Opaque: its text says what it is; its kind can be asked.
#[derive(Clone)]
pub struct Cause(CauseInner);

#[derive(Clone)]
enum CauseInner {
    Io(Arc<std::io::Error>),
    Lane(velo_mux::LaneError),
    Connect(velo_session::ConnectError),
    Open(velo_session::StreamError),
    Start(Arc<crate::StartError>),
    Json(Arc<serde_json::Error>),
    MsgpackEncode(Arc<rmp_serde::encode::Error>),
    MsgpackDecode(Arc<rmp_serde::decode::Error>),
    Timeout(std::time::Duration),
    TlsMismatch(TlsMismatch),
}

impl Cause {
    pub(crate) fn io(e: std::io::Error) -> Self {
        Self(CauseInner::Io(Arc::new(e)))
    }

    pub(crate) fn lane(e: velo_mux::LaneError) -> Self {
        Self(CauseInner::Lane(e))
    }

    pub(crate) fn connect(e: velo_session::ConnectError) -> Self {
        Self(CauseInner::Connect(e))
    }

    pub(crate) fn open(e: velo_session::StreamError) -> Self {
        Self(CauseInner::Open(e))
    }

    pub(crate) fn start(e: crate::StartError) -> Self {
        Self(CauseInner::Start(Arc::new(e)))
    }

    pub(crate) fn json(e: serde_json::Error) -> Self {
        Self(CauseInner::Json(Arc::new(e)))
    }

    pub(crate) fn msgpack_encode(e: rmp_serde::encode::Error) -> Self {
        Self(CauseInner::MsgpackEncode(Arc::new(e)))
    }

    pub(crate) fn msgpack_decode(e: rmp_serde::decode::Error) -> Self {
        Self(CauseInner::MsgpackDecode(Arc::new(e)))
    }

    pub(crate) fn timeout(after: std::time::Duration) -> Self {
        Self(CauseInner::Timeout(after))
    }

    pub(crate) fn tls_mismatch(m: TlsMismatch) -> Self {
        Self(CauseInner::TlsMismatch(m))
    }

    /// Which TLS setting differs between this worker and the frontend, when that is why the
    /// frontend could not be used (the classic plane's workers learn it from the frontend's
    /// plaintext answer).
    pub fn as_tls_mismatch(&self) -> Option<TlsMismatch> {
        match &self.0 {
            CauseInner::TlsMismatch(m) => Some(*m),
            CauseInner::Connect(e) => connect_tls_mismatch(e),
            _ => None,
        }
    }

    /// Whether the cause is a deadline that passed (a connect or handshake timeout).
    pub fn is_timeout(&self) -> bool {
        match &self.0 {
            CauseInner::Timeout(_) => true,
            CauseInner::Connect(e) => matches!(e, velo_session::ConnectError::Timeout { .. }),
            CauseInner::Io(e) => e.kind() == std::io::ErrorKind::TimedOut,
            _ => false,
        }
    }

    /// The I/O error kind, when the cause is an I/O error.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match &self.0 {
            CauseInner::Io(e) => Some(e.kind()),
            _ => None,
        }
    }

    fn as_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(match &self.0 {
            CauseInner::Io(e) => &**e,
            CauseInner::Lane(e) => e,
            CauseInner::Connect(e) => e,
            CauseInner::Open(e) => e,
            CauseInner::Start(e) => &**e,
            CauseInner::Json(e) => &**e,
            CauseInner::MsgpackEncode(e) => &**e,
            CauseInner::MsgpackDecode(e) => &**e,
            CauseInner::TlsMismatch(m) => m,
            CauseInner::Timeout(_) => return None,
        })
    }
}

/// The TLS mismatch a velo connect failed for: the TLS frontend's plaintext CLOSE (its one
/// reason for a plaintext HELLO), or the plaintext answer the TLS transport met.
fn connect_tls_mismatch(e: &velo_session::ConnectError) -> Option<TlsMismatch> {
    use velo_session::ConnectError;
    match e {
        ConnectError::Refused { code, reason, .. }
            if *code == velo_wire::CloseCode::BAD_HANDSHAKE
                && reason == velo_session::TLS_REQUIRED_REASON =>
        {
            Some(TlsMismatch::FrontendRequiresTls)
        }
        ConnectError::Io { source, .. }
            if source
                .get_ref()
                .is_some_and(|e| e.is::<velo_tls::PlaintextAnswer>()) =>
        {
            Some(TlsMismatch::FrontendAnsweredPlaintext)
        }
        ConnectError::BackingOff { last, .. } => connect_tls_mismatch(last),
        _ => None,
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.0, self.as_error()) {
            (CauseInner::Timeout(after), _) => write!(f, "timed out after {after:?}"),
            (_, Some(e)) => fmt::Display::fmt(e, f),
            (_, None) => f.write_str("unknown cause"),
        }
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cause({self})")
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.as_error().and_then(std::error::Error::source)
    }
}

/// Equal when they say the same (error values of the lower layers are not comparable).
impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Cause {}

/// A TLS/plaintext mismatch between a worker and the frontend it dialed: each side's
/// configuration is valid, but they disagree (Dynamo's `DYN_TCP_TLS_*` set on one side only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsMismatch {
    /// This worker dialed in plaintext and the frontend requires TLS: the worker needs
    /// `DYN_TCP_TLS_CA_CERT_PATH` (or `DYN_TCP_TLS_INSECURE`).
    #[error(
        "the frontend requires TLS and this worker connected in plaintext \
         (set DYN_TCP_TLS_CA_CERT_PATH on the worker)"
    )]
    FrontendRequiresTls,
    /// This worker began a TLS handshake and the frontend answered in plaintext: the
    /// frontend has no TLS (`DYN_TCP_TLS_CERT_PATH` and `DYN_TCP_TLS_KEY_PATH` unset there).
    #[error(
        "the frontend answered the TLS handshake in plaintext: it has no TLS \
         (set DYN_TCP_TLS_CERT_PATH and DYN_TCP_TLS_KEY_PATH on the frontend)"
    )]
    FrontendAnsweredPlaintext,
}

/// Why a stream was lost before it ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Disconnect {
    /// The worker gave the request up before answering it (its sender was dropped before the
    /// prologue): nothing was generated, so another worker may serve it.
    #[error("the worker gave the request up before its prologue")]
    Abandoned,
    /// The worker dropped the stream before finishing it.
    #[error("the worker dropped the stream")]
    Dropped,
    /// The worker's instance was removed from discovery.
    #[error("worker instance {instance:x} was removed from discovery")]
    InstanceRemoved {
        /// The removed instance.
        instance: u64,
    },
    /// The peer closed the connection before the stream ended.
    #[error("the peer closed the connection")]
    Closed,
    /// The connection failed or its lane was lost (reset, timed out, broken by the peer).
    #[error("connection lost: {0}")]
    Lost(#[source] Cause),
}

/// How the peer broke the response protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolViolation {
    /// The prologue is not the JSON the contract says.
    #[error("invalid prologue JSON: {0}")]
    Prologue(#[source] Cause),
    /// The first message of a classic stream was not its prologue.
    #[error("expected the prologue, got message kind {kind:#04x}")]
    ExpectedPrologue {
        /// The kind received.
        kind: u8,
    },
    /// A classic message of a kind that has no place there.
    #[error("unexpected message kind {kind:#04x}")]
    UnexpectedMessage {
        /// The kind received.
        kind: u8,
    },
    /// A classic message length outside what the plane accepts.
    #[error("message length {len} outside 1..={max}")]
    MessageLength {
        /// The length announced.
        len: u32,
        /// The largest accepted (the plane's message size plus the kind byte).
        max: u64,
    },
    /// Items arrived after the final one.
    #[error("data after the final item")]
    DataAfterFinal,
    /// A velo stream broke its sequence or credit rules (the mux's reason).
    #[error("{0}")]
    Stream(&'static str),
}

/// What is wrong with a stream address ([`ConnectionInfo`](crate::ConnectionInfo)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInfo {
    /// The transport name is none this build knows.
    #[error("unknown transport {0:?}")]
    UnknownTransport(String),
    /// The address is not the JSON it should be.
    #[error("address is not valid JSON: {0}")]
    Json(#[source] Cause),
    /// The address is of another protocol version.
    #[error("address of protocol version {got}, this build speaks {supported}")]
    Version {
        /// The address's version.
        got: u8,
        /// This build's.
        supported: u8,
    },
    /// The frontend instance id is not 32 hex digits, or is zero.
    #[error("bad instance id {0:?}")]
    Instance(String),
    /// The token is not 32 hex digits.
    #[error("bad token")]
    Token,
}
