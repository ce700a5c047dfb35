//! The prologue: the first thing on every stream, always JSON.

use serde::{Deserialize, Serialize};

use crate::{Cause, Disconnect, ProtocolViolation, ResponseError, TypedError};

#[derive(Serialize, Deserialize)]
struct Wire {
    error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    typed_error: Option<TypedError>,
}

/// The prologue of a stream its worker abandoned before answering: empty (a real prologue is
/// never empty). A velo worker whose sender is dropped before its prologue opens the stream
/// with it and resets the stream at once, so the frontend's pending handle ends
/// `Disconnected` (retryable) instead of waiting; see `docs/protocol.md`, OPEN.
pub(crate) const ABANDONED: &[u8] = b"";

/// The JSON bytes of a prologue: `{"error":null}` or `{"error":"msg","typed_error":{...}}`.
pub(crate) fn encode(result: &Result<(), TypedError>) -> Vec<u8> {
    let wire = match result {
        Ok(()) => Wire {
            error: None,
            typed_error: None,
        },
        Err(e) => Wire {
            error: Some(e.to_string()),
            typed_error: Some(e.clone()),
        },
    };
    serde_json::to_vec(&wire).expect("a prologue always serializes")
}

/// Parses a prologue: `Ok(())` for success, the worker's refusal as `Refused`, an
/// [`ABANDONED`] stream as `Disconnected` (the request never reached the engine's answer, so
/// another worker may take it).
pub(crate) fn decode(bytes: &[u8]) -> Result<(), ResponseError> {
    if bytes == ABANDONED {
        return Err(ResponseError::Disconnected(Disconnect::Abandoned));
    }
    let wire: Wire = serde_json::from_slice(bytes)
        .map_err(|e| ResponseError::Protocol(ProtocolViolation::Prologue(Cause::json(e))))?;
    match (wire.error, wire.typed_error) {
        (None, _) => Ok(()),
        (Some(_), Some(cause)) => Err(ResponseError::Refused { cause }),
        (Some(message), None) => Err(ResponseError::Refused {
            cause: TypedError::new("Error", message),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_is_the_exact_dynamo_json() {
        assert_eq!(encode(&Ok(())), br#"{"error":null}"#);
        assert_eq!(decode(br#"{"error":null}"#), Ok(()));
    }

    #[test]
    fn an_error_prologue_carries_the_typed_cause() {
        let cause = TypedError::new("EngineRefused", "queue full");
        let bytes = encode(&Err(cause.clone()));
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"error":"EngineRefused: queue full","typed_error":{"kind":"EngineRefused","message":"queue full","retryable":false}}"#
        );
        assert_eq!(decode(&bytes), Err(ResponseError::Refused { cause }));
    }

    #[test]
    fn an_empty_prologue_is_a_retryable_disconnect_never_a_refusal() {
        let err = decode(ABANDONED).unwrap_err();
        assert_eq!(err, ResponseError::Disconnected(Disconnect::Abandoned));
        assert!(err.is_retryable() && !err.is_remote());
    }

    #[test]
    fn garbage_is_a_protocol_error() {
        assert!(matches!(
            decode(b"nope"),
            Err(ResponseError::Protocol(ProtocolViolation::Prologue(_)))
        ));
    }
}
