//! Fuzz entry points of response-plane, shared by `fuzz/` (cargo-fuzz) and the corpus replay
//! test (`tests/fuzz_replay.rs`). Behind the private `__fuzz` feature; not an API.
//!
//! - [`parsers`] is the `prologue` target: what a peer or a request hands this crate to
//!   parse, selected by the first byte: a stream's prologue, a typed item in each codec
//!   (MessagePack with field names, JSON; the fast MessagePack reader checked against
//!   `rmp_serde`), a stream address from a request, and the
//!   plane's environment settings.
//! - [`classic_stream`] is the `classic_reader` target (in `classic.rs`): the bytes of one
//!   classic-plane connection as the frontend reads them, or the frontend's control messages
//!   as the worker reads them.

mod classic;

pub use classic::classic_stream;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use crate::config::{
    ENV_BATCH_MS, ENV_HOST, ENV_MAX_MESSAGE_SIZE, ENV_PLANE, ENV_PORT, ENV_TRANSPORT,
};
use crate::info::{CLASSIC, ConnectionInfo, StreamAddress, VELO_TCP, VELO_UCX};
use crate::{Batching, Codec, ResponseError, ResponsePlaneConfig, TypedError, prologue};

/// An item shaped like the ones engines stream (Dynamo's `LLMEngineOutput`), so the typed
/// decoders see nested sequences, options, strings and floats; also the item of the codec
/// bench and of the MessagePack reader's tests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct Item {
    pub token_ids: Vec<u32>,
    pub text: Option<String>,
    pub cum_log_probs: Option<f64>,
    pub finish_reason: Option<String>,
    pub index: Option<u32>,
}

/// The environment variables the plane reads, in the order the fuzzer's values fill them.
const ENV_VARS: [&str; 6] = [
    ENV_PLANE,
    ENV_TRANSPORT,
    ENV_BATCH_MS,
    ENV_HOST,
    ENV_PORT,
    ENV_MAX_MESSAGE_SIZE,
];

/// Separates the fuzzer's environment values (a byte UTF-8 never contains).
const ENV_SEPARATOR: u8 = 0xff;

/// The parser `data[0]` selects, on the rest of `data`.
///
/// # Panics
///
/// When a parser panics, accepts what its encoder cannot reproduce, or accepts settings
/// outside their documented range.
pub fn parsers(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector % 5 {
        0 => check_prologue(rest),
        1 => check_item(Codec::Msgpack, rest),
        2 => check_item(Codec::Json, rest),
        3 => check_address(rest),
        _ => check_env(rest),
    }
}

/// A prologue decodes to success, a typed refusal, or a protocol error; success and
/// refusals re-encode to a prologue that decodes to the same.
fn check_prologue(bytes: &[u8]) {
    let decoded = prologue::decode(bytes);
    let again = match &decoded {
        Ok(()) => prologue::decode(&prologue::encode(&Ok(()))),
        Err(ResponseError::Refused { cause }) => {
            prologue::decode(&prologue::encode(&Err(cause.clone())))
        }
        Err(_) => return,
    };
    assert_eq!(decoded, again, "a prologue does not survive re-encoding");
}

/// Decodes one MessagePack item as a stream does (the codec bench's entry point).
///
/// # Errors
///
/// When the bytes are not a MessagePack encoding of `T`.
pub fn decode_msgpack<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ResponseError> {
    Codec::Msgpack.decode(bytes)
}

/// An item decodes (or is refused) in `codec`, as does any value, whatever its nesting; a
/// decoded item re-encodes to bytes that decode again (and, in MessagePack, re-encode
/// identically).
fn check_item(codec: Codec, bytes: &[u8]) {
    if codec == Codec::Msgpack {
        fast_reader_agrees::<Item>(bytes);
        fast_reader_agrees::<serde_json::Value>(bytes);
        fast_reader_agrees::<TypedError>(bytes);
    }
    let _: Result<IgnoredAny, ResponseError> = codec.decode(bytes);
    let _: Result<TypedError, ResponseError> = codec.decode(bytes);
    let Ok(item) = codec.decode::<Item>(bytes) else {
        return;
    };
    let mut first = Vec::new();
    codec
        .encode(&item, &mut first)
        .expect("a decoded item encodes");
    let again: Item = codec
        .decode(&first)
        .unwrap_or_else(|e| panic!("re-encoded item does not decode: {e}"));
    if codec == Codec::Msgpack {
        let mut second = Vec::new();
        codec
            .encode(&again, &mut second)
            .expect("a decoded item encodes");
        assert_eq!(first, second, "MessagePack re-encoding is not stable");
    }
}

/// Whatever the fast MessagePack reader decodes, `rmp_serde` decodes to the same value.
fn fast_reader_agrees<T: serde::de::DeserializeOwned + std::fmt::Debug>(bytes: &[u8]) {
    if let Some(value) = crate::msgpack::fast::<T>(bytes) {
        let reference = rmp_serde::from_slice::<T>(bytes).map_err(|e| e.to_string());
        assert_eq!(
            format!("{:?}", Ok::<_, String>(value)),
            format!("{reference:?}"),
            "the fast MessagePack reader disagrees with rmp_serde"
        );
    }
}

/// A stream address (the JSON a worker finds in a request) parses or is refused; its ids
/// parse or are refused; a parsed address re-serializes to itself.
fn check_address(bytes: &[u8]) {
    let Some((&which, json)) = bytes.split_first() else {
        return;
    };
    let transport = [CLASSIC, VELO_TCP, VELO_UCX][usize::from(which) % 3];
    let info = ConnectionInfo {
        transport: transport.to_owned(),
        info: String::from_utf8_lossy(json).into_owned(),
    };
    let Ok(address) = StreamAddress::parse(&info) else {
        return;
    };
    let _ = address.instance_id();
    if let Ok(token) = address.token() {
        let canonical = crate::info::hex_token(&token) == address.token.to_ascii_lowercase();
        assert!(
            canonical,
            "token {:?} is not canonical hex: it re-encodes as {:?}",
            address.token,
            crate::info::hex_token(&token)
        );
    }
    let again = StreamAddress::parse(&address.to_info(transport));
    assert_eq!(
        again.ok(),
        Some(address),
        "an address does not survive re-encoding"
    );
}

/// The plane's settings from an environment of fuzzer-chosen values: refused, or within
/// every documented range.
fn check_env(bytes: &[u8]) {
    let values: Vec<Option<String>> = bytes
        .split(|&b| b == ENV_SEPARATOR)
        .map(|v| (!v.is_empty()).then(|| String::from_utf8_lossy(v).into_owned()))
        .collect();
    let lookup = |var: &str| {
        let i = ENV_VARS.iter().position(|&v| v == var)?;
        values.get(i).cloned().flatten()
    };
    let Ok(config) = ResponsePlaneConfig::from_lookup(lookup) else {
        return;
    };
    assert!(
        (velo_wire::MIN_MAX_FRAME_LEN..=1 << 30).contains(&config.max_message_size()),
        "max message size {} accepted",
        config.max_message_size()
    );
    if let Batching::Delay(d) = config.batching() {
        assert!(
            d.as_millis() >= 1 && d.as_millis() <= u128::from(crate::config::MAX_BATCH_MS),
            "batching delay {d:?} accepted"
        );
    }
}
