//! The one unsafe module: every UCX call, behind safe types.
//!
//! [`Worker`] owns a UCP context, one UCP worker on it, the worker's event fd (registered with
//! tokio), an optional listener and every endpoint (named by [`EpId`], never by pointer). UCX
//! calls back only from inside calls on the worker (`ucp_worker_progress`, a force close,
//! `ucp_worker_destroy`); the callbacks never touch the caller's state: they append
//! [`Event`]s to a queue inside the worker, which the caller drains between calls
//! ([`Worker::drain_events`]). So no Rust reference is ever live across a call that may call
//! back, and the caller's code is ordinary `&mut self` code.
//!
//! Threading: the worker is created `UCS_THREAD_MODE_SERIALIZED` and is `!Send` and `!Sync`
//! (raw pointers): it lives inside one driver future, which may move between a multi-thread
//! runtime's threads but never runs on two at once (the task handoff orders the accesses).
//!
//! `ucx1-sys` renders `ucs_status_t` as a Rust enum of the named codes; this module converts
//! every status to [`Status`] (an `i8`) at once and decodes status pointers by hand, because
//! the crate's `UCS_PTR_IS_PTR`/`UCS_PTR_STATUS` overflow (panic in debug builds) on NULL,
//! the normal "completed at once" result of every `*_nbx` call.

mod callbacks;
mod context;
mod worker;

use callbacks::{done_cb, on_am, on_conn, on_ep_error, recv_cb, send_cb};
use context::{create_context, from_sockaddr, init_error, sockaddr};

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::fmt;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::unix::AsyncFd;
use ucx1_sys as u;

/// Most bytes of an AM header this module hands on; ours are 9.
pub(crate) const MAX_HEADER: usize = 16;

/// Bound on progress rounds while tearing a worker down (waiting for outstanding requests).
const TEARDOWN_ROUNDS: usize = 10_000;
/// Bound on the time spent on those rounds.
const TEARDOWN_TIME: Duration = Duration::from_millis(200);

/// A UCX status code (`ucs_status_t`): 0 is OK, negative codes are errors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Status(i8);

impl Status {
    pub(crate) const OK: Self = Self(0);

    pub(crate) fn is_ok(self) -> bool {
        self.0 >= 0
    }

    fn of(s: u::ucs_status_t) -> Self {
        Self(s as i8)
    }

    /// The status of a `*_nbx` result that is NULL or an error pointer.
    fn of_ptr(p: u::ucs_status_ptr_t) -> Self {
        if p.is_null() {
            Self::OK
        } else {
            // Error pointers encode the (negative) status in the low byte: UCS_STATUS_PTR.
            #[allow(clippy::cast_possible_truncation)]
            Self(p as isize as i8)
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match named(self.0) {
            // SAFETY: ucs_status_string returns a pointer to a static, NUL-terminated string
            // for every named status.
            Some(s) => {
                let text = unsafe { CStr::from_ptr(u::ucs_status_string(s)) };
                write!(f, "{} ({s:?})", text.to_string_lossy())
            }
            None => write!(f, "UCX status {}", self.0),
        }
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The named status for a code, without transmuting an arbitrary `i8` into the enum.
fn named(code: i8) -> Option<u::ucs_status_t> {
    use u::ucs_status_t as S;
    const ALL: &[S] = &[
        S::UCS_OK,
        S::UCS_INPROGRESS,
        S::UCS_ERR_NO_MESSAGE,
        S::UCS_ERR_NO_RESOURCE,
        S::UCS_ERR_IO_ERROR,
        S::UCS_ERR_NO_MEMORY,
        S::UCS_ERR_INVALID_PARAM,
        S::UCS_ERR_UNREACHABLE,
        S::UCS_ERR_INVALID_ADDR,
        S::UCS_ERR_NOT_IMPLEMENTED,
        S::UCS_ERR_MESSAGE_TRUNCATED,
        S::UCS_ERR_NO_PROGRESS,
        S::UCS_ERR_BUFFER_TOO_SMALL,
        S::UCS_ERR_NO_ELEM,
        S::UCS_ERR_SOME_CONNECTS_FAILED,
        S::UCS_ERR_NO_DEVICE,
        S::UCS_ERR_BUSY,
        S::UCS_ERR_CANCELED,
        S::UCS_ERR_SHMEM_SEGMENT,
        S::UCS_ERR_ALREADY_EXISTS,
        S::UCS_ERR_OUT_OF_RANGE,
        S::UCS_ERR_TIMED_OUT,
        S::UCS_ERR_EXCEEDS_LIMIT,
        S::UCS_ERR_UNSUPPORTED,
        S::UCS_ERR_REJECTED,
        S::UCS_ERR_NOT_CONNECTED,
        S::UCS_ERR_CONNECTION_RESET,
        S::UCS_ERR_FIRST_LINK_FAILURE,
        S::UCS_ERR_LAST_LINK_FAILURE,
        S::UCS_ERR_FIRST_ENDPOINT_FAILURE,
        S::UCS_ERR_ENDPOINT_TIMEOUT,
        S::UCS_ERR_LAST_ENDPOINT_FAILURE,
        S::UCS_ERR_LAST,
    ];
    ALL.iter().copied().find(|s| *s as i8 == code)
}

/// Whether a `*_nbx` result is an error pointer (`UCS_PTR_IS_ERR`).
fn ptr_is_err(p: u::ucs_status_ptr_t) -> bool {
    p as usize >= (u::ucs_status_t::UCS_ERR_LAST as isize) as usize
}

/// The system UCX library's version, `major.minor.release`.
pub(crate) fn library_version() -> (u32, u32, u32) {
    let (mut major, mut minor, mut release) = (0, 0, 0);
    // SAFETY: ucp_get_version only writes the three integers we own.
    unsafe { u::ucp_get_version(&mut major, &mut minor, &mut release) };
    (major, minor, release)
}

/// The API version of the headers the bindings were generated from.
pub(crate) fn header_version() -> (u32, u32) {
    (u::UCP_API_MAJOR, u::UCP_API_MINOR)
}

/// What the context is set up with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings<'a> {
    /// `UCX_TLS` override.
    pub(crate) tls: Option<&'a str>,
    /// `UCX_NET_DEVICES` override.
    pub(crate) net_devices: Option<&'a str>,
}

/// Why a UCX set-up call failed.
#[derive(Debug, Clone)]
pub(crate) struct InitError {
    pub(crate) step: &'static str,
    pub(crate) status: String,
}

/// A UCX message received on an endpoint, or another thing that happened inside a UCX call.
pub(crate) enum Event<'w> {
    /// An active message arrived on `ep`.
    Message {
        ep: EpId,
        header: Header,
        body: Body<'w>,
    },
    /// `ep` failed (peer gone, reset, unreachable, rejected): it takes no more sends.
    EpError { ep: EpId, status: Status },
    /// A send started with [`Worker::send`] completed.
    SendDone { token: u64, status: Status },
    /// A rendezvous receive started with [`RndvDesc::receive`] completed.
    RecvDone {
        token: u64,
        status: Status,
        data: Vec<u8>,
    },
    /// A flush started with [`Worker::flush`] completed (or failed: the endpoint is being
    /// closed either way).
    FlushDone { token: u64 },
}

/// The AM header bytes of a message (at most [`MAX_HEADER`]; a longer one is empty).
#[derive(Clone, Copy)]
pub(crate) struct Header {
    len: u8,
    bytes: [u8; MAX_HEADER],
}

impl Header {
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// A message's payload.
pub(crate) enum Body<'w> {
    /// Eager: the bytes are here.
    Eager(Bytes),
    /// Rendezvous: the payload must be fetched ([`RndvDesc::receive`]) or dropped.
    Rndv(RndvDesc<'w>),
}

/// A rendezvous message's payload, still at the sender. Dropping it releases it (the sender's
/// request completes with an error).
pub(crate) struct RndvDesc<'w> {
    desc: *mut c_void,
    len: usize,
    worker: &'w Worker,
}

/// A connection request received by the listener; dropping it rejects it.
pub(crate) struct ConnRequest<'w> {
    raw: u::ucp_conn_request_h,
    worker: &'w Worker,
}

/// An endpoint of a [`Worker`]. Operations on a closed or unknown one fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct EpId(u64);

/// Whether a started operation completed at once or will report an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Started {
    /// Done already; no event follows.
    Done,
    /// Its event follows from a later call on the worker.
    Pending,
}

/// Whether the worker may sleep on its event fd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arm {
    /// Armed: the event fd signals the next event.
    Armed,
    /// Events are pending: progress again first.
    Busy,
}

/// The worker's event fd, owned by UCX (closed by `ucp_worker_destroy`).
struct EventFd(RawFd);

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A UCP context with one worker, its event fd, listener and endpoints.
pub(crate) struct Worker {
    /// Dropped (deregistered) before the worker that owns the fd is destroyed.
    efd: Option<AsyncFd<EventFd>>,
    listener: Option<u::ucp_listener_h>,
    raw: u::ucp_worker_h,
    ctx: u::ucp_context_h,
    /// The callbacks' argument: boxed so its address is stable; outlives `raw`.
    shared: Box<Shared>,
}

/// What the callbacks write; read by the worker's owner between calls.
struct Shared {
    eps: RefCell<EpTable>,
    events: RefCell<Vec<RawEvent>>,
    /// Eager payloads of queued events, back to back (one allocation per drain, not per
    /// message).
    arena: RefCell<BytesMut>,
    conn_requests: RefCell<Vec<u::ucp_conn_request_h>>,
    /// Requests whose callback has not run yet.
    in_flight: Cell<usize>,
}

#[derive(Default)]
struct EpTable {
    next: u64,
    by_id: HashMap<EpId, u::ucp_ep_h>,
    by_raw: HashMap<usize, EpId>,
}

enum RawEvent {
    Message {
        ep: EpId,
        header: Header,
        body: RawBody,
    },
    EpError {
        ep: EpId,
        status: Status,
    },
    SendDone {
        token: u64,
        status: Status,
    },
    RecvDone {
        token: u64,
        status: Status,
        data: Vec<u8>,
    },
    FlushDone {
        token: u64,
    },
}

enum RawBody {
    /// This many bytes at the front of the arena (in queue order).
    Eager(usize),
    Rndv {
        desc: *mut c_void,
        len: usize,
    },
}

/// Keeps a send's header and payload alive until UCX is done with them (UCX 1.13 does not
/// copy the AM header of a queued send).
struct SendOp {
    header: [u8; MAX_HEADER],
    _payload: Vec<Bytes>,
    iov: Vec<u::ucp_dt_iov>,
    token: u64,
    shared: *const Shared,
}

/// The buffer a rendezvous payload lands in.
struct RecvOp {
    buf: Vec<u8>,
    token: u64,
    shared: *const Shared,
}

/// A flush's token (or a close's, with `token == None`).
struct DoneOp {
    token: Option<u64>,
    shared: *const Shared,
}

// SAFETY: the worker is created UCS_THREAD_MODE_SERIALIZED: any thread may use it, one at a
// time. `Worker` is not `Sync`, so every access goes through one owner (the driver future),
// which may move between threads (a runtime's task handoff orders the accesses) but never runs
// on two at once. The callbacks' state is only touched inside calls on the worker.
unsafe impl Send for Worker {}
