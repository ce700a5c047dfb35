//! What every story sets up: a frontend with an inbox, a worker, a stream, and bounded waits.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use velo_mux::{MuxConfig, MuxConfigBuilder, Side};

use super::{BOUND, Frontend, FrontendSpec, PROLOGUE, TOKEN, Transport, Worker};
use crate::{
    AcceptSettings, Acceptor, FrontendParts, IncomingStream, RecvStream, SendStream,
    SessionSettings, WorkerSettings,
};

/// Hands incoming streams to the story through a bounded channel.
pub struct Inbox(pub mpsc::Sender<IncomingStream>);

impl Acceptor for Inbox {
    fn accept(&self, incoming: IncomingStream) {
        if let Err(e) = self.0.try_send(incoming) {
            panic!("test inbox full: {e}");
        }
    }
}

impl FrontendSpec {
    /// What a transport binds the frontend with: its parts, the session settings it asks for
    /// (its accept bounds, the rest at their defaults) and its address (`None`: any free one).
    pub fn into_parts(self) -> (FrontendParts, SessionSettings, Option<SocketAddr>) {
        let parts = FrontendParts {
            instance: self.instance,
            mux: self.mux,
            acceptor: self.acceptor,
            tracker: self.tracker,
        };
        let session = SessionSettings::builder()
            .accept(self.accept)
            .secret(self.secret)
            .build()
            .expect("a story's accept bounds are valid");
        (parts, session, self.addr)
    }
}

/// Resolves `f`, failing the test if it takes longer than [`BOUND`].
///
/// # Panics
///
/// When `f` takes longer.
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {BOUND:?}"))
}

/// Waits until `cond` holds, checking every few milliseconds; fails the test after [`BOUND`].
/// For state another task updates just after the event the story observed.
///
/// # Panics
///
/// When `cond` does not hold within the bound.
pub async fn eventually(what: &str, cond: impl Fn() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(POLL_EVERY).await;
        }
    })
    .await;
}

/// The frontend mux configuration of the stories, adjusted by `f`.
///
/// # Panics
///
/// If `f` makes the configuration invalid.
pub fn frontend_mux(f: impl FnOnce(MuxConfigBuilder) -> MuxConfigBuilder) -> MuxConfig {
    f(MuxConfig::builder(Side::Frontend))
        .build()
        .expect("a valid frontend configuration")
}

/// The worker settings of the stories, their mux configuration adjusted by `f`.
///
/// # Panics
///
/// If `f` makes the configuration invalid.
pub fn worker_settings(f: impl FnOnce(MuxConfigBuilder) -> MuxConfigBuilder) -> WorkerSettings {
    let mux = f(MuxConfig::builder(Side::Worker))
        .build()
        .expect("a valid worker configuration");
    WorkerSettings::new(mux)
}

/// A frontend whose streams arrive in the returned inbox, on any free address, with the
/// default settings adjusted by `adjust`.
///
/// # Panics
///
/// If the transport cannot start it.
pub async fn frontend_with<T: Transport>(
    net: &T,
    tracker: &TaskTracker,
    adjust: impl FnOnce(&mut FrontendSpec),
) -> (T::Frontend, mpsc::Receiver<IncomingStream>) {
    start_frontend(net, tracker, adjust)
        .await
        .expect("the frontend starts")
}

/// [`frontend_with`], returning the transport's error when it cannot start the frontend.
///
/// # Errors
///
/// The transport's (an address still taken, for one).
///
/// # Panics
///
/// If starting takes longer than [`BOUND`].
pub async fn start_frontend<T: Transport>(
    net: &T,
    tracker: &TaskTracker,
    adjust: impl FnOnce(&mut FrontendSpec),
) -> io::Result<(T::Frontend, mpsc::Receiver<IncomingStream>)> {
    let (tx, rx) = mpsc::channel(INBOX_STREAMS);
    let mut spec = FrontendSpec {
        mux: frontend_mux(|b| b),
        accept: AcceptSettings::default(),
        acceptor: Arc::new(Inbox(tx)),
        tracker: tracker.clone(),
        instance: crate::new_instance_id(),
        addr: None,
        secret: None,
    };
    adjust(&mut spec);
    let frontend = within("the frontend starting", net.frontend(spec)).await?;
    Ok((frontend, rx))
}

/// [`frontend_with`] the default settings.
///
/// # Panics
///
/// If the transport cannot start it.
pub async fn frontend<T: Transport>(
    net: &T,
    tracker: &TaskTracker,
) -> (T::Frontend, mpsc::Receiver<IncomingStream>) {
    frontend_with(net, tracker, |_| {}).await
}

/// A worker with the default settings.
pub fn worker<T: Transport>(net: &T, tracker: &TaskTracker) -> T::Worker {
    net.worker(worker_settings(|b| b), tracker)
}

/// Opens stream `ticket` from `worker` to `frontend` (bounded).
///
/// # Panics
///
/// If the stream cannot be opened.
pub async fn open(worker: &impl Worker, frontend: &impl Frontend, ticket: u64) -> SendStream {
    let open = worker.endpoint().open(
        frontend.addr(),
        frontend.instance(),
        ticket,
        &TOKEN,
        PROLOGUE,
    );
    within("opening a stream", open)
        .await
        .expect("the stream opens")
}

/// Takes the next stream from `inbox` (bounded).
///
/// # Panics
///
/// If none arrives within the bound.
pub async fn take(inbox: &mut mpsc::Receiver<IncomingStream>) -> RecvStream {
    within("a stream reaching the frontend", inbox.recv())
        .await
        .expect("the inbox is open")
        .accept()
}

/// The next item of `r` (bounded).
///
/// # Panics
///
/// If the stream ended instead, or nothing arrives within the bound.
pub async fn next_item(r: &mut RecvStream) -> Bytes {
    match within("an item", r.recv()).await {
        Some(Ok(item)) => item,
        other => panic!("expected an item, got {other:?}"),
    }
}

/// Sends `item` on `s` and flushes it.
///
/// # Panics
///
/// If the send fails.
pub async fn send_now(s: &mut SendStream, item: &[u8]) {
    within("a send", s.send(item))
        .await
        .expect("the send succeeds");
    s.flush();
}

/// How often [`eventually`] checks its condition.
const POLL_EVERY: Duration = Duration::from_millis(5);

/// Streams a story's inbox holds before the test takes them: more than any story opens.
const INBOX_STREAMS: usize = 4096;
