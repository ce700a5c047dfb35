//! How items are encoded: MessagePack with field names, or JSON (the request's choice).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{Cause, ResponseError};

/// The encoding of a stream's items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// MessagePack with field names (`rmp_serde` named), compact and self-describing.
    #[default]
    Msgpack,
    /// JSON.
    Json,
}

impl Codec {
    /// Encodes `item` into `buf` (cleared first, so its allocation is reused per item).
    pub(crate) fn encode<T: Serialize>(
        self,
        item: &T,
        buf: &mut Vec<u8>,
    ) -> Result<(), ResponseError> {
        buf.clear();
        let r = match self {
            Self::Msgpack => {
                rmp_serde::encode::write_named(buf, item).map_err(Cause::msgpack_encode)
            }
            Self::Json => serde_json::to_writer(&mut *buf, item).map_err(Cause::json),
        };
        r.map_err(ResponseError::Encode)
    }

    /// Decodes one item (MessagePack: see [`crate::msgpack`] for the reader and its fallback).
    pub(crate) fn decode<T: DeserializeOwned>(self, bytes: &[u8]) -> Result<T, ResponseError> {
        let r = match self {
            Self::Msgpack => crate::msgpack::from_slice(bytes).map_err(Cause::msgpack_decode),
            Self::Json => serde_json::from_slice(bytes).map_err(Cause::json),
        };
        r.map_err(ResponseError::Decode)
    }
}
