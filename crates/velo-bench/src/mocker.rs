//! Dynamo's mocker timing model (REFERENCE.md section 5), as pure functions.

use std::time::Duration;

/// Most requests running in one engine at once.
pub const MAX_RUNNING: usize = 256;
/// Most tokens one forward pass batches (prefill tokens of newly admitted requests).
pub const MAX_BATCHED_TOKENS: u32 = 8192;
/// KV-cache capacity in tokens: the mocker's default 16,384 blocks of 64 tokens.
pub const KV_CAPACITY_TOKENS: u64 = 16_384 * 64;

/// Prefill time of a pass with `t` new prompt tokens, in ms (before the speedup).
pub fn prefill_ms(t: u32) -> f64 {
    let t = f64::from(t);
    4.21e-7 * t * t + 0.01518 * t + 16.5
}

/// Decode time of a pass at KV-cache utilisation `p` (0..1), in ms (before the speedup),
/// floored at 1 ms.
pub fn decode_ms(p: f64) -> f64 {
    let p = p.clamp(0.0, 1.0);
    (-25.74 * p * p + 54.01 * p + 5.74).max(1.0)
}

/// The duration of one forward pass: decode of the running batch, plus prefill when
/// `new_tokens` prompt tokens were admitted, divided by `speedup`.
pub fn pass_time(new_tokens: u32, kv_tokens: u64, speedup: f64) -> Duration {
    // Lossless enough: KV token counts stay far below 2^52.
    #[allow(clippy::cast_precision_loss)]
    let p = kv_tokens as f64 / KV_CAPACITY_TOKENS as f64;
    let mut ms = decode_ms(p);
    if new_tokens > 0 {
        ms += prefill_ms(new_tokens);
    }
    Duration::from_secs_f64(ms / speedup.max(0.001) / 1000.0)
}

/// The prefill part of a pass that admitted `new_tokens` prompt tokens (zero when none),
/// divided by `speedup`.
pub fn prefill_time(new_tokens: u32, speedup: f64) -> Duration {
    if new_tokens == 0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(prefill_ms(new_tokens) / speedup.max(0.001) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_pass_takes_0_57_to_3_4_ms_at_speedup_10() {
        let empty = pass_time(0, 0, 10.0);
        let full = pass_time(0, KV_CAPACITY_TOKENS, 10.0);
        assert!(
            (empty.as_secs_f64() * 1000.0 - 0.574).abs() < 0.001,
            "{empty:?}"
        );
        assert!(
            (full.as_secs_f64() * 1000.0 - 3.401).abs() < 0.001,
            "{full:?}"
        );
    }

    #[test]
    fn prefill_follows_the_polynomial() {
        assert!((prefill_ms(0) - 16.5).abs() < 1e-9);
        assert!((prefill_ms(1000) - (0.421 + 15.18 + 16.5)).abs() < 1e-9);
        assert!(pass_time(1000, 0, 10.0) > pass_time(0, 0, 10.0));
        let prefill = pass_time(1000, 0, 10.0) - pass_time(0, 0, 10.0);
        assert!((prefill.as_secs_f64() - prefill_time(1000, 10.0).as_secs_f64()).abs() < 1e-9);
        assert_eq!(prefill_time(0, 10.0), Duration::ZERO);
    }

    #[test]
    fn decode_is_floored_at_one_ms() {
        assert!(decode_ms(-5.0) >= 1.0);
        assert_eq!(decode_ms(0.0), 5.74);
    }
}
