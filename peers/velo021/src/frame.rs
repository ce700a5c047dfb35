//! What travels on a velo 0.21 anchor, in the shapes Dynamo's Velo plane uses, declared here
//! (this workspace cannot link dynamo-runtime: tokio versions conflict).
//!
//! - The anchor carries [`ResponseFrame`]s, which velo serializes inside its own
//!   `StreamFrame::Item` record: one prologue, then one `Data` per item.
//! - `Data` holds one item already encoded by the request's payload codec, msgpack with field
//!   names: a `NetworkStreamWrapper { data: Some(Annotated { data: Some(item) }),
//!   complete_final: false }`, then a last `{ complete_final: true }`. These are the same
//!   bytes the Dynamo arms put on their wires (absent `Option`s are skipped there too).
//! - The connection info a request carries is [`ResponseAddress`] as JSON.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use velo::PeerInfo;
use velo::StreamOpenTicket;
use velo::streaming::StreamAnchorHandle;
use velo_bench::item::EngineOutput;

/// The version field of Dynamo's Velo connection info.
pub(crate) const ADDRESS_VERSION: u32 = 2;

/// One record on the anchor.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) enum ResponseFrame {
    /// Exactly one, first.
    Prologue(Prologue),
    /// One item, encoded by the request's payload codec.
    Data(Bytes),
}

/// The stream's prologue: `error: None` means the worker accepted the request.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) struct Prologue {
    pub(crate) error: Option<String>,
}

/// Where the worker opens the response stream: the frontend node, its pre-bound anchor and
/// the ticket that lets the worker open it without a round trip.
#[derive(Serialize, Deserialize)]
pub(crate) struct ResponseAddress {
    pub(crate) version: u32,
    pub(crate) peer: PeerInfo,
    pub(crate) anchor: StreamAnchorHandle,
    pub(crate) ticket: StreamOpenTicket,
}

/// Dynamo's per-item envelope.
#[derive(Serialize, Deserialize)]
pub(crate) struct NetworkStreamWrapper<U> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) data: Option<U>,
    pub(crate) complete_final: bool,
}

/// Dynamo's `Annotated` with only its data set (its other fields are skipped when absent).
#[derive(Serialize, Deserialize)]
pub(crate) struct Annotated<R> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) data: Option<R>,
}

/// The encoded `Data` of item `item`.
pub(crate) fn encode_item(item: &EngineOutput) -> Result<Bytes, String> {
    encode(&NetworkStreamWrapper {
        data: Some(Annotated { data: Some(item) }),
        complete_final: false,
    })
}

/// The encoded `Data` that ends generation.
pub(crate) fn encode_final() -> Result<Bytes, String> {
    encode(&NetworkStreamWrapper::<Annotated<&EngineOutput>> {
        data: None,
        complete_final: true,
    })
}

fn encode<T: Serialize>(w: &T) -> Result<Bytes, String> {
    rmp_serde::to_vec_named(w)
        .map(Bytes::from)
        .map_err(|e| e.to_string())
}

/// What one `Data` says: an item, or the end of generation.
pub(crate) enum Decoded {
    Item(EngineOutput),
    Final,
}

/// Decodes one `Data`.
pub(crate) fn decode(bytes: &[u8]) -> Result<Decoded, String> {
    let w: NetworkStreamWrapper<Annotated<EngineOutput>> =
        rmp_serde::from_slice(bytes).map_err(|e| format!("item: {e}"))?;
    match (w.complete_final, w.data.and_then(|a| a.data)) {
        (true, None) => Ok(Decoded::Final),
        (false, Some(item)) => Ok(Decoded::Item(item)),
        (true, Some(_)) => Err("data on the complete_final item".into()),
        (false, None) => Err("an item without data".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_round_trip_and_the_final_item_ends() {
        let item = EngineOutput::token(7, 3, false);
        let Ok(Decoded::Item(back)) = decode(&encode_item(&item).unwrap()) else {
            panic!("not an item");
        };
        assert_eq!(back, item);
        assert!(matches!(
            decode(&encode_final().unwrap()),
            Ok(Decoded::Final)
        ));
    }
}
