//! Fuzz entry point of velo-session, shared by `fuzz/` (cargo-fuzz) and the corpus replay test
//! (`tests/fuzz_replay.rs`). Behind the private `__fuzz` feature; not an API.
//!
//! [`handshake`] is the `handshake` target: arbitrary bytes to a listening frontend until it
//! closes. A [`FrontendEndpoint`] accepts up to [`MAX_CONNECTIONS`] in-memory lanes from a
//! [`LaneListener`](crate::LaneListener), each carrying the fuzzer's bytes in reads of a
//! fuzzer-chosen size, through the real accept loop: the handshake reader (a frame within
//! [`HANDSHAKE_MAX_FRAME`](crate::HANDSHAKE_MAX_FRAME)), `answer`, `attach_lane`, then the
//! lane's pumps and mux, on a paused tokio clock (timers fire in virtual time, so a run is
//! deterministic). Once every byte was read the lanes see the end of their transport.
//!
//! Checked: nothing panics; every lane and handshake ends within [`CLOSE_BOUND`] of virtual
//! time; what the frontend wrote on each lane is valid protocol: a HELLO that the worker's
//! own check accepts (or a CLOSE refusing it), then only frontend records, then at most a
//! CLOSE, with nothing written after a refusal; and no connection outlives its lanes.

mod lanes;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::task::TaskTracker;
use velo_mux::handshake::Expect;
use velo_mux::{FlushPolicy, MuxConfig, Side};
use velo_wire::{Frame, FrameDecoder, Hello, InstanceId, Record, Role};

use crate::{
    AcceptSettings, Acceptor, FrontendEndpoint, FrontendSettings, IncomingStream, RecvStream,
};
use lanes::{Connection, End, Listener};

/// The frontend's instance id: the `peer_instance_id` of the golden worker HELLO in
/// `docs/protocol.md`, so that seed is answered.
pub const FRONTEND_ID: InstanceId =
    InstanceId::from_u128(0xfedc_ba98_7654_3210_8899_aabb_ccdd_eeff);

/// Connections per input at most; more than the accept loop's limit, so it is reached.
pub const MAX_CONNECTIONS: usize = 6;

/// Connections the frontend holds at once (lanes plus handshakes).
const CONNECTION_LIMIT: usize = 4;

/// Virtual time the lanes get to read and answer everything before their transports end.
const READ_TIME: Duration = Duration::from_millis(50);

/// Virtual time within which every lane must have closed once its transport ended: the
/// handshake timeout plus the close grace, with room.
pub const CLOSE_BOUND: Duration = Duration::from_secs(30);

/// Handshake timeout of the fuzz frontend: shorter than [`READ_TIME`], so a silent
/// connection is timed out.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(20);

/// Receive buffer of each lane's reader, in bytes.
const READ_BUFFER: usize = 4096;

/// What a run's frontend did with its connections.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Connections answered with a HELLO.
    pub answered: usize,
    /// Connections refused with a CLOSE.
    pub refused: usize,
    /// Connections that got nothing (ended before a whole frame, or dropped).
    pub silent: usize,
}

/// Runs the connections `data` encodes against a fresh frontend until every lane closed.
///
/// # Panics
///
/// When a lane does not close, or the frontend writes something a worker must not accept.
pub fn handshake(data: &[u8]) -> Summary {
    let connections = lanes::parse(data);
    let written = runtime().block_on(run(&connections));
    let mut summary = Summary::default();
    for (conn, out) in connections.iter().zip(&written) {
        match check_output(conn, out) {
            Some(Frame::Hello(_)) => summary.answered += 1,
            Some(_) => summary.refused += 1,
            None => summary.silent += 1,
        }
    }
    summary
}

/// Accepts `connections`, lets them be read, ends their transports, and waits for every lane
/// and handshake to close. Returns what the frontend wrote on each.
async fn run(connections: &[Connection]) -> Vec<Vec<u8>> {
    let tracker = TaskTracker::new();
    let end = End::default();
    let keep = Arc::new(Keep::default());
    let endpoint = FrontendEndpoint::new(settings(), FRONTEND_ID, keep.clone(), tracker.clone());
    let (listener, outputs) = Listener::new(connections, &end);
    let settings = AcceptSettings {
        handshake_timeout: HANDSHAKE_TIMEOUT,
        max_connections: CONNECTION_LIMIT,
        ..AcceptSettings::default()
    };
    let accepting = endpoint.accept(listener, settings);
    tokio::time::sleep(READ_TIME).await;
    end.fire();
    let closed = tokio::time::timeout(CLOSE_BOUND, async {
        accepting.shutdown().await;
        while !endpoint.peers().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        endpoint.close();
        tracker.close();
        tracker.wait().await;
    })
    .await;
    // The kept streams hold their connection, which holds the acceptor: let go of them, or
    // every run would leak its connection.
    keep.0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clear();
    assert!(
        closed.is_ok(),
        "a lane or handshake was still open {CLOSE_BOUND:?} after its transport ended"
    );
    outputs
        .iter()
        .map(|o| std::mem::take(&mut *o.lock().unwrap_or_else(PoisonError::into_inner)))
        .collect()
}

/// The frontend's settings: small limits, so they are reached.
fn settings() -> FrontendSettings {
    let mux = MuxConfig::builder(Side::Frontend)
        .window(4)
        .max_streams(16)
        .max_frame_len(64 * 1024)
        .max_buffered_bytes(64 * 1024)
        .flush(FlushPolicy::with_max_delay(Duration::from_millis(2)))
        .build()
        .expect("fuzz settings are in range");
    FrontendSettings {
        read_buffer: READ_BUFFER,
        ..FrontendSettings::new(mux)
    }
}

/// The application: keeps every stream with an odd ticket (and never reads it), refuses the
/// others.
#[derive(Default)]
struct Keep(Mutex<Vec<RecvStream>>);

impl Acceptor for Keep {
    fn accept(&self, incoming: IncomingStream) {
        if incoming.ticket().is_multiple_of(2) {
            incoming.refuse(velo_wire::CancelCode::REFUSED);
            return;
        }
        let stream = incoming.accept();
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(stream);
    }
}

/// What the frontend wrote on a connection is what a worker may accept: nothing, a refusal,
/// or an answer that passes the worker's check followed by frontend records and at most a
/// final CLOSE. Returns the first frame.
fn check_output(conn: &Connection, out: &[u8]) -> Option<Frame> {
    let mut src = bytes::BytesMut::from(out);
    let mut decoder = FrameDecoder::new(velo_wire::DEFAULT_MAX_FRAME_LEN);
    let mut frames = Vec::new();
    loop {
        match decoder.decode(&mut src) {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => break,
            Err(e) => panic!("the frontend wrote invalid bytes: {e}"),
        }
    }
    assert!(src.is_empty(), "the frontend wrote half a frame");
    let (first, rest) = frames.split_first()?;
    match first {
        Frame::Close(_) => assert!(rest.is_empty(), "frames after a refusal"),
        Frame::Hello(answer) => check_session(conn, answer, rest),
        Frame::Batch(_) => panic!("a batch before the handshake"),
        Frame::Auth(_) => panic!("a proof of a secret this frontend does not hold"),
    }
    Some(first.clone())
}

/// After an answer: the worker would accept it, and only frontend records and a final CLOSE
/// follow.
fn check_session(conn: &Connection, answer: &Hello, rest: &[Frame]) {
    let hello = conn
        .hello()
        .unwrap_or_else(|| panic!("answered a connection that sent no HELLO"));
    let expect = Expect {
        role: Role::Frontend,
        local_instance: hello.instance_id,
        peer_instance: Some(FRONTEND_ID),
        lane: Some((hello.lane_index, hello.lane_count)),
    };
    if let Err(e) = expect.check(answer) {
        panic!("the worker would refuse the answer: {e}");
    }
    for (i, frame) in rest.iter().enumerate() {
        match frame {
            Frame::Batch(batch) => {
                for record in batch.records() {
                    let record = record.unwrap_or_else(|e| panic!("an invalid record: {e}"));
                    assert!(
                        matches!(
                            record,
                            Record::Credit { .. }
                                | Record::Accept { .. }
                                | Record::Stop { .. }
                                | Record::Cancel { .. }
                                | Record::Heartbeat
                                | Record::GoAway { .. }
                        ),
                        "the frontend sent a worker's record: {record:?}"
                    );
                }
            }
            Frame::Close(_) => assert_eq!(i + 1, rest.len(), "frames after a CLOSE"),
            Frame::Hello(_) => panic!("a second HELLO"),
            Frame::Auth(_) => panic!("a proof of a secret this frontend does not hold"),
        }
    }
}

/// This thread's runtime: current-thread, clock paused (it jumps to the next timer whenever
/// every task waits), reused by every input.
fn runtime() -> Arc<tokio::runtime::Runtime> {
    thread_local! {
        static RUNTIME: Arc<tokio::runtime::Runtime> = Arc::new(
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("a current-thread runtime builds"),
        );
    }
    RUNTIME.with(Arc::clone)
}
