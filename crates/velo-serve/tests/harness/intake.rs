//! A worker's request plane seen from a stranger's side: raw greetings and request frames,
//! and bounded waits for what the worker did with them (refused and counted, never run).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use response_plane::{Codec, RegisterOptions};
use runtime_glue::{ResponseService, Role};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use velo_serve::wire::StreamItem;
use velo_serve::work::auth::{GREETING_LEN, MAGIC};
use velo_serve::work::{IntakeStats, WireEnding, WorkRequest};
use velo_serve::worker::Worker;

use super::BOUND;

/// How often the tests look at a counter while waiting for a condition.
pub const POLL: Duration = Duration::from_millis(5);

/// `request` as a length-delimited frame (a 4-byte big-endian length, then the JSON).
pub fn frame(request: &WorkRequest) -> Bytes {
    let body = request.encode();
    let mut out = BytesMut::with_capacity(body.len() + 4);
    out.put_u32(u32::try_from(body.len()).expect("a small request"));
    out.put_slice(&body);
    out.freeze()
}

/// A request numbered `id` whose stream address is never used (the tests look only at whether
/// and when the worker takes it).
pub fn request_numbered(id: u64) -> WorkRequest {
    WorkRequest {
        id,
        prompt_tokens: 1,
        output_tokens: 1,
        ending: WireEnding::Eos,
        info: response_plane::ConnectionInfo {
            transport: "tcp".into(),
            info: String::new(),
        },
    }
}

/// A worker with `secret` (or none) on its plane, and a frontend's plane with the same holding a
/// registered stream: a well-formed request for it, as a stranger who learnt its address
/// would write it.
pub async fn worker_and_request(secret: Option<&str>) -> (Worker, ResponseService, Bytes) {
    let plane = super::plane_with_secret(secret);
    let frontend = ResponseService::start(super::service(Role::Frontend, plane.clone()))
        .await
        .expect("the frontend's plane starts");
    let config = super::worker_config(plane, super::discovery(Duration::from_secs(10)));
    let worker = Worker::start(config).await.expect("the worker starts");
    let opts = RegisterOptions {
        codec: Codec::Msgpack,
        establish_timeout: Some(BOUND),
    };
    let (info, _pending) = frontend
        .register::<StreamItem>(opts)
        .expect("a registered stream");
    let request = frame(&WorkRequest {
        id: 1,
        prompt_tokens: 16,
        output_tokens: 8,
        ending: WireEnding::Length,
        info,
    });
    (worker, frontend, request)
}

/// Waits (bounded) until the worker closes `conn` or one of its engines sees a request; then
/// asserts the former; then waits (bounded) until the worker counted `refusals` refused
/// handshakes (it closes the connection a moment before it counts it) and asserts that no
/// engine saw anything.
pub async fn closed_before_any_engine_saw_it(conn: &mut TcpStream, worker: &Worker, refusals: u64) {
    let stats = worker.stats().clone();
    let engines_saw = || {
        let [running, admitted, _, _, refused] = stats.snapshot();
        running + admitted + refused > 0
    };
    let start = Instant::now();
    let mut buf = [0u8; 256];
    let closed = loop {
        // Cancel safety: a read that loses the race is simply tried again.
        tokio::select! {
            r = conn.read(&mut buf) => match r {
                Ok(0) | Err(_) => break true,
                Ok(_) => continue,
            },
            () = tokio::time::sleep(POLL) => {
                if engines_saw() {
                    break false;
                }
            }
        }
        assert!(
            start.elapsed() < BOUND,
            "the worker neither closed the connection nor ran the request within {BOUND:?}"
        );
    };
    assert!(closed, "the worker ran the request: {:?}", stats.snapshot());
    refusals_reach(worker.intake_stats(), refusals).await;
    assert!(
        !engines_saw(),
        "the request reached an engine: (running, admitted, completed, cancelled, refused) = \
         {:?}",
        stats.snapshot()
    );
}

/// A greeting as the wire format lays it out (see `velo_serve::work`'s docs): `role` 1 for a
/// frontend, 2 for a worker; `mode` 1 when a proof follows; naming no worker instance (its 8
/// bytes after the mode are 0); then a made-up nonce.
pub fn greeting(role: u8, mode: u8) -> [u8; GREETING_LEN] {
    let mut g = [0; GREETING_LEN];
    g[..MAGIC.len()].copy_from_slice(&MAGIC);
    g[MAGIC.len()] = role;
    g[MAGIC.len() + 1] = mode;
    g[MAGIC.len() + 2 + 8..].fill(0x5a);
    g
}

/// Polls (bounded) until the worker counted `want` refused handshakes.
pub async fn refusals_reach(stats: &IntakeStats, want: u64) {
    let start = Instant::now();
    while stats.handshakes_refused.load(Ordering::Relaxed) < want {
        assert!(
            start.elapsed() < BOUND,
            "the worker counted {} refused handshakes, not {want}",
            stats.handshakes_refused.load(Ordering::Relaxed)
        );
        tokio::time::sleep(POLL).await;
    }
}
