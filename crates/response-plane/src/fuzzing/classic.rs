//! The `classic_reader` fuzz target: one classic-plane connection's bytes, read the way the
//! frontend reads them (`classic/frontend.rs`: the handshake message within its 1 KiB limit
//! and its JSON, the prologue, then items until the sentinel, every message through
//! [`frame::decode`] and every item through the stream's codec), or the frontend's control
//! messages read the way the worker reads them (`classic/worker.rs`). The bytes arrive in
//! reads of a fuzzer-chosen size, so every message is also seen split.
//!
//! Checked: nothing panics, a message never claims more than its limit, and between reads the
//! buffer holds less than one whole message (a complete message is never left unread, and
//! the reader never holds more than one message's bytes).

use bytes::BytesMut;
use serde::Deserialize;

use super::Item;
use crate::classic::frame::{self, DATA, HANDSHAKE, HEADER, PROLOGUE, STOP};
use crate::{Codec, prologue};

/// The frontend's limit on the handshake message, in bytes (`classic/frontend.rs`).
const MAX_HANDSHAKE: u32 = 1024;

/// Message limits the fuzzer picks from: tiny, so the limit is easy to hit; the handshake's;
/// the plane's default (32 MiB).
const LIMITS: [u32; 3] = [64, 4096, crate::config::DEFAULT_MAX_MESSAGE_SIZE];

/// The handshake message's JSON, as the frontend parses it.
#[derive(Deserialize)]
struct Handshake {
    #[allow(dead_code)] // parsed to check it, as the frontend does; not used here
    stream: u64,
    token: String,
}

/// Where the frontend's reader is in a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Handshake,
    Prologue,
    Items,
    Done,
}

/// Reads `data[2..]` as a classic connection: `data[0]` picks the message limit and the
/// direction (frontend reading a worker, or worker reading the frontend's control messages),
/// `data[1]` the read size.
///
/// # Panics
///
/// When a message is taken above its limit or the buffer holds a whole unread message.
pub fn classic_stream(data: &[u8]) {
    let [selector, chunk, stream @ ..] = data else {
        return;
    };
    let max = LIMITS[usize::from(*selector) % LIMITS.len()];
    let chunk = usize::from(*chunk).max(1);
    if selector & 0x80 == 0 {
        read_worker(stream, chunk, max);
    } else {
        read_control(stream, chunk);
    }
}

/// The frontend's side: handshake, prologue, items, sentinel.
fn read_worker(stream: &[u8], chunk: usize, max: u32) {
    let mut buf = BytesMut::new();
    let mut phase = Phase::Handshake;
    for read in stream.chunks(chunk) {
        buf.extend_from_slice(read);
        loop {
            let limit = if phase == Phase::Handshake {
                MAX_HANDSHAKE
            } else {
                max
            };
            let message = frame::decode(&mut buf, limit);
            let Ok(Some((kind, body))) = message else {
                if matches!(message, Ok(None)) {
                    check_buffer(&buf, limit);
                    break;
                }
                return;
            };
            assert!(body.len() <= to_usize(limit), "a message above its limit");
            phase = on_message(phase, kind, &body);
            if phase == Phase::Done {
                return;
            }
        }
    }
}

/// The frontend's reaction to one message; `Done` when the connection is over.
fn on_message(phase: Phase, kind: u8, body: &[u8]) -> Phase {
    match (phase, kind) {
        (Phase::Handshake, HANDSHAKE) => {
            let Ok(h) = serde_json::from_slice::<Handshake>(body) else {
                return Phase::Done;
            };
            let _ = crate::info::parse_token(&h.token);
            Phase::Prologue
        }
        (Phase::Prologue, PROLOGUE) => match prologue::decode(body) {
            Ok(()) => Phase::Items,
            Err(_) => Phase::Done,
        },
        (Phase::Items, DATA) => {
            let _ = Codec::Msgpack.decode::<Item>(body);
            Phase::Items
        }
        _ => Phase::Done,
    }
}

/// The worker's side: STOP and KILL messages of no payload (limit 0) until anything else.
fn read_control(stream: &[u8], chunk: usize) {
    let mut buf = BytesMut::new();
    for read in stream.chunks(chunk) {
        buf.extend_from_slice(read);
        loop {
            match frame::decode(&mut buf, 0) {
                Ok(Some((STOP, body))) => assert!(body.is_empty(), "STOP with a payload"),
                // KILL, or anything else: the stream is over.
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => {
                    check_buffer(&buf, 0);
                    break;
                }
            }
        }
    }
}

/// Between reads the buffer holds less than one whole message of at most `limit` bytes.
fn check_buffer(buf: &BytesMut, limit: u32) {
    let whole = HEADER + to_usize(limit);
    assert!(
        buf.len() < whole,
        "{} bytes held unread, a whole message is at most {whole}",
        buf.len()
    );
}

fn to_usize(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}
