//! A TLS/plaintext mismatch between a classic worker and its frontend, told on both sides
//! rather than left to a dropped connection or a handshake timeout.
//!
//! - A TLS frontend reads a connection's first byte before its TLS handshake: a byte that
//!   begins no TLS handshake record is a plaintext worker, answered with a plaintext
//!   `REQUIRES_TLS` message that worker reads as a typed refusal.
//! - A plaintext frontend whose first message fails to parse and begins with a TLS handshake
//!   record is a TLS worker, answered with a plaintext `NO_TLS` message: the worker's TLS
//!   handshake fails at once on its first byte (no TLS record type), which the worker reads
//!   as "the frontend answered in plaintext".
//!
//! Either frontend counts the mismatch (`classic_tls_mismatches`), then lingers a bounded time
//! for the worker to close first, so its own close is no reset that could discard the answer.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use velo_tls::TLS_HANDSHAKE_RECORD;
use velo_tls::tokio_rustls::rustls;

use super::frame;

/// Most bytes a refused worker may still send while the frontend lingers.
const MAX_LINGER_BYTES: usize = 64 * 1024;

/// Whether `first`, a connection's first byte, begins a TLS handshake record.
pub(crate) fn begins_tls(first: [u8; 1]) -> bool {
    first == [TLS_HANDSHAKE_RECORD]
}

/// Whether a classic message that failed to parse, `buf`, is a TLS ClientHello.
pub(crate) fn is_client_hello(buf: &[u8]) -> bool {
    buf.first() == Some(&TLS_HANDSHAKE_RECORD)
}

/// Refuses a worker with the other TLS setting: sends a control message of `kind`
/// (`REQUIRES_TLS`, `NO_TLS`) in plaintext, ends the sending side, and reads what the worker
/// still sends until it closes, for at most `linger` and [`MAX_LINGER_BYTES`].
pub(crate) async fn refuse<S>(stream: &mut S, kind: u8, linger: Duration)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let told = async {
        stream.write_all(&frame::header(kind, 0)).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < MAX_LINGER_BYTES {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        io::Result::Ok(())
    };
    if let Ok(Err(e)) = tokio::time::timeout(linger, told).await {
        tracing::debug!(error = %e, "refusing a classic worker over a TLS mismatch failed");
    }
}

/// Whether a TLS client handshake failed because the frontend answered with bytes that
/// begin no TLS record: a plaintext frontend (ours sends `NO_TLS`).
pub(crate) fn answered_in_plaintext(e: &io::Error) -> bool {
    use rustls::InvalidMessage::{InvalidContentType, UnknownProtocolVersion};
    let rustls = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>());
    matches!(
        rustls,
        Some(rustls::Error::InvalidMessage(
            InvalidContentType | UnknownProtocolVersion
        ))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_classic_refusal_begins_no_tls_record() {
        for kind in [frame::REQUIRES_TLS, frame::NO_TLS] {
            let first = frame::header(kind, 0).first().copied();
            assert!(!begins_tls([first.unwrap()]), "kind {kind:#04x}");
            // TLS record types are 20..=24.
            assert!(!(20..=24).contains(&first.unwrap()));
        }
        assert!(is_client_hello(&[0x16, 0x03, 0x01, 0x02, 0x00]));
        assert!(!is_client_hello(&frame::header(frame::HANDSHAKE, 40)));
    }
}
