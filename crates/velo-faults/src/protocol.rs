//! The line protocol between the harness and the processes it runs: one JSON object per line,
//! commands on the role's standard input, events on its standard output.
//!
//! A frontend role answers [`Command::Open`] with [`Event::Info`] (the stream's connection
//! info, which the harness hands to a worker role in [`Command::Serve`]) and reports every
//! stream's end once with [`Event::End`]; a worker role reports every stream it served once
//! with [`Event::WorkerEnd`].

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// How a frontend role treats a registered stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadMode {
    /// Wait for the prologue and read every item promptly.
    Read,
    /// Wait for the prologue, then never read (a slow consumer) until killed.
    NoRead,
    /// Never even wait for the prologue (the registration stays pending) until killed.
    Hold,
}

/// A command to a role process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Frontend: register stream `sid`; answer with [`Event::Info`].
    Open {
        /// The harness's stream id.
        sid: u64,
        /// How to read it.
        mode: ReadMode,
    },
    /// Frontend: drop stream `sid` (kill it).
    Kill {
        /// The stream.
        sid: u64,
    },
    /// Frontend: the request of stream `sid` failed on its worker (as a request plane would
    /// report): drop the registration if it still waits for its prologue.
    Failed {
        /// The stream.
        sid: u64,
    },
    /// Frontend: shut the service down (go-away, grace, teardown); answer with
    /// [`Event::ShutdownBegan`] and [`Event::ShutdownDone`].
    Shutdown,
    /// Worker: serve one stream.
    Serve {
        /// The harness's stream id.
        sid: u64,
        /// Items to send, then finish.
        items: u64,
        /// Pause before each item, ms (0: as fast as credit allows).
        interval_ms: u64,
        /// Padding per item, bytes.
        item_bytes: u32,
        /// Wait this long before connecting, ms.
        delay_ms: u64,
        /// The stream's `ConnectionInfo`, as JSON.
        info: String,
    },
    /// Worker: open `count` streams with forged (unknown) tickets to the frontend of
    /// `info`, at most `concurrency` at a time; each is reported with sid `first_sid + i`.
    Flood {
        /// The first forged stream's sid.
        first_sid: u64,
        /// Streams to forge.
        count: u64,
        /// Forged streams in flight at most.
        concurrency: u64,
        /// A genuine `ConnectionInfo` of that frontend, as JSON.
        info: String,
    },
    /// Exit now.
    Quit,
}

/// How a stream ended, as one side saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "how", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    /// The clean end (frontend: after the final item; worker: `finish` succeeded).
    Clean,
    /// Killed by the harness (frontend), or by the frontend (worker).
    Killed,
    /// A forged stream the frontend refused.
    Refused,
    /// The stream could not be set up.
    Setup(String),
    /// The stream ended with an error.
    Error(String),
    /// The stream broke the contract (an item out of order, or after the end).
    Bad(String),
}

impl Outcome {
    /// A short label for tables.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Clean => "clean",
            Self::Killed => "killed",
            Self::Refused => "refused",
            Self::Setup(_) => "setup",
            Self::Error(_) => "error",
            Self::Bad(_) => "bad",
        }
    }
}

/// An event from a role process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// The role is up; a frontend says where its plane listens.
    Ready {
        /// The frontend's advertised address (workers: none).
        addr: Option<SocketAddr>,
    },
    /// Frontend: stream `sid` is registered; `info` is its `ConnectionInfo` as JSON.
    Info {
        /// The stream.
        sid: u64,
        /// The connection info.
        info: String,
    },
    /// Frontend: stream `sid` ended.
    End {
        /// The stream.
        sid: u64,
        /// How.
        outcome: Outcome,
        /// Items received, in order.
        items: u64,
        /// Mean gap between consecutive items, microseconds (0 under two items).
        itl_us: u64,
    },
    /// Worker: stream `sid` ended.
    WorkerEnd {
        /// The stream.
        sid: u64,
        /// How.
        outcome: Outcome,
        /// Items sent.
        items: u64,
    },
    /// Frontend: shutdown began; whether a registration made right after was refused.
    ShutdownBegan {
        /// `closed` when refused as it must be, else what happened.
        late_register: String,
    },
    /// Frontend: shutdown returned.
    ShutdownDone {
        /// The report's outcome label.
        outcome: String,
        /// How long it took, ms.
        elapsed_ms: u64,
    },
}

/// One protocol line (no newline) for `value`.
pub fn to_line<T: Serialize>(value: &T) -> String {
    // Plain enums of strings and integers always serialize.
    serde_json::to_string(value).unwrap_or_default()
}

/// Parses a protocol line.
///
/// # Errors
///
/// The JSON error, for a line that is not one of `T`.
pub fn from_line<T: serde::de::DeserializeOwned>(line: &str) -> Result<T, serde_json::Error> {
    serde_json::from_str(line.trim())
}

/// Rewrites the frontend address inside a `ConnectionInfo` (JSON, whose `info` field is itself
/// JSON with an `addr`), so that the worker connects to `addr` instead (a fault proxy).
///
/// # Errors
///
/// A message when `info` is not a connection info with an address.
pub fn rewrite_addr(info: &str, addr: SocketAddr) -> Result<String, String> {
    let mut outer: serde_json::Value = serde_json::from_str(info).map_err(|e| e.to_string())?;
    let inner_text = outer
        .get("info")
        .and_then(serde_json::Value::as_str)
        .ok_or("no `info` string in the connection info")?;
    let mut inner: serde_json::Value =
        serde_json::from_str(inner_text).map_err(|e| e.to_string())?;
    let slot = inner
        .get_mut("addr")
        .ok_or("no `addr` in the stream address")?;
    *slot = serde_json::Value::String(addr.to_string());
    outer["info"] = serde_json::Value::String(inner.to_string());
    Ok(outer.to_string())
}

/// Replaces the ticket and token inside a `ConnectionInfo` (see [`rewrite_addr`]) with
/// `ticket` and `token` (32 hex digits): a stream the frontend never registered.
///
/// # Errors
///
/// A message when `info` is not a connection info.
pub fn forge_ticket(info: &str, ticket: u64, token: u128) -> Result<String, String> {
    let mut outer: serde_json::Value = serde_json::from_str(info).map_err(|e| e.to_string())?;
    let inner_text = outer
        .get("info")
        .and_then(serde_json::Value::as_str)
        .ok_or("no `info` string in the connection info")?;
    let mut inner: serde_json::Value =
        serde_json::from_str(inner_text).map_err(|e| e.to_string())?;
    inner["ticket"] = serde_json::Value::from(ticket);
    inner["token"] = serde_json::Value::String(format!("{token:032x}"));
    outer["info"] = serde_json::Value::String(inner.to_string());
    Ok(outer.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = r#"{"transport":"velo-tcp","info":"{\"v\":3,\"addr\":\"127.0.0.1:4000\",\"instance\":\"ab\",\"ticket\":7,\"token\":\"00\",\"codec\":\"msgpack\"}"}"#;

    fn inner(info: &str) -> serde_json::Value {
        let outer: serde_json::Value = serde_json::from_str(info).unwrap();
        serde_json::from_str(outer["info"].as_str().unwrap()).unwrap()
    }

    #[test]
    fn rewriting_the_address_keeps_everything_else() {
        let out = rewrite_addr(INFO, "127.0.0.1:5000".parse().unwrap()).unwrap();
        let a = inner(&out);
        assert_eq!(a["addr"], "127.0.0.1:5000");
        assert_eq!((a["ticket"].as_u64(), a["v"].as_u64()), (Some(7), Some(3)));
        assert!(rewrite_addr("{}", "127.0.0.1:1".parse().unwrap()).is_err());
    }

    #[test]
    fn forged_tickets_replace_ticket_and_token() {
        let out = forge_ticket(INFO, 99, 0xabc).unwrap();
        let a = inner(&out);
        assert_eq!(a["ticket"].as_u64(), Some(99));
        assert_eq!(a["token"].as_str().map(str::len), Some(32));
        assert_eq!(a["addr"], "127.0.0.1:4000");
    }

    #[test]
    fn lines_round_trip() {
        let ev = Event::End {
            sid: 3,
            outcome: Outcome::Error("lane lost: idle".into()),
            items: 5,
            itl_us: 20_000,
        };
        assert_eq!(from_line::<Event>(&to_line(&ev)).unwrap(), ev);
        let cmd = Command::Open {
            sid: 1,
            mode: ReadMode::NoRead,
        };
        assert_eq!(from_line::<Command>(&to_line(&cmd)).unwrap(), cmd);
        assert!(from_line::<Command>("{\"cmd\":\"nope\"}").is_err());
    }
}
