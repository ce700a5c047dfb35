//! `ConnectionInfo`: a stream's address, created by the frontend and carried in the request.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::{Cause, Codec, InvalidInfo, ResponseError};

/// Where a worker sends a stream's response: a transport name plus a JSON string, as in
/// Dynamo. It travels inside the request (whose header is capped at 128 KiB); ours is about
/// 200 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionInfo {
    /// The plane and transport: `tcp` (classic), `velo-tcp` or `velo-ucx`.
    pub transport: String,
    /// JSON: the frontend address and instance, the stream ticket and token, the codec.
    pub info: String,
}

/// Transport names in [`ConnectionInfo::transport`].
pub(crate) const CLASSIC: &str = "tcp";
pub(crate) const VELO_TCP: &str = "velo-tcp";
pub(crate) const VELO_UCX: &str = "velo-ucx";

/// Protocol version carried in every address; a worker of another version refuses it.
pub(crate) const ADDRESS_VERSION: u8 = 3;

/// The JSON inside [`ConnectionInfo::info`], the same for every plane: everything a worker
/// needs to send the first record without a round trip.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StreamAddress {
    /// Protocol version (3).
    pub(crate) v: u8,
    /// The frontend's listener.
    pub(crate) addr: SocketAddr,
    /// The frontend's instance id, 32 hex digits.
    pub(crate) instance: String,
    /// The registration key (slot and generation).
    pub(crate) ticket: u64,
    /// The stream's secret, 32 hex digits.
    pub(crate) token: String,
    /// How items are encoded.
    pub(crate) codec: Codec,
}

impl StreamAddress {
    pub(crate) fn to_info(&self, transport: &str) -> ConnectionInfo {
        ConnectionInfo {
            transport: transport.to_owned(),
            info: serde_json::to_string(self).expect("an address always serializes"),
        }
    }

    pub(crate) fn parse(info: &ConnectionInfo) -> Result<Self, ResponseError> {
        let bad = ResponseError::InvalidConnectionInfo;
        let a: Self =
            serde_json::from_str(&info.info).map_err(|e| bad(InvalidInfo::Json(Cause::json(e))))?;
        if a.v != ADDRESS_VERSION {
            return Err(bad(InvalidInfo::Version {
                got: a.v,
                supported: ADDRESS_VERSION,
            }));
        }
        Ok(a)
    }

    pub(crate) fn instance_id(&self) -> Result<velo_wire::InstanceId, ResponseError> {
        parse_hex(&self.instance)
            .filter(|&v| v != 0)
            .map(velo_wire::InstanceId::from_u128)
            .ok_or_else(|| {
                ResponseError::InvalidConnectionInfo(InvalidInfo::Instance(self.instance.clone()))
            })
    }

    pub(crate) fn token(&self) -> Result<[u8; 16], ResponseError> {
        parse_token(&self.token).ok_or(ResponseError::InvalidConnectionInfo(InvalidInfo::Token))
    }
}

/// 1 to 32 hex digits and nothing else. `u128::from_str_radix` alone also takes a leading
/// `+`, so "+0010..." would read as "00010...": a second spelling of the same id.
fn parse_hex(s: &str) -> Option<u128> {
    let digits = !s.is_empty() && s.len() <= 32 && s.bytes().all(|b| b.is_ascii_hexdigit());
    digits.then(|| u128::from_str_radix(s, 16).ok()).flatten()
}

/// A stream token: exactly 32 hex digits.
pub(crate) fn parse_token(s: &str) -> Option<[u8; 16]> {
    (s.len() == 32)
        .then(|| parse_hex(s))
        .flatten()
        .map(u128::to_be_bytes)
}

pub(crate) fn hex_token(token: &[u8; 16]) -> String {
    format!("{:032x}", u128::from_be_bytes(*token))
}
