//! What a mock engine streams: one item per generated token, shaped like an engine's output.

use serde::{Deserialize, Serialize};

/// One generated token, in the shape of Dynamo's `LLMEngineOutput`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineOutput {
    /// The generated token ids (one per pass).
    pub token_ids: Vec<u32>,
    /// Detokenized text of the token.
    pub text: Option<String>,
    /// Cumulative log probability.
    pub cum_log_probs: Option<f64>,
    /// Why generation ended, on the last item only.
    pub finish_reason: Option<String>,
    /// Position of the token in the output.
    pub index: Option<u32>,
}

impl EngineOutput {
    /// Token number `index` of request `request`.
    pub fn token(request: u64, index: u32, last: bool) -> Self {
        // Deterministic, varied token ids and text lengths, so items are 50-150 bytes encoded.
        let id = u32::try_from((request.wrapping_mul(2_654_435_761) ^ u64::from(index)) % 151_936)
            .unwrap_or(0);
        let text = TEXTS[(id as usize) % TEXTS.len()].to_owned();
        Self {
            token_ids: vec![id],
            text: Some(text),
            cum_log_probs: Some(-0.25 * f64::from(index)),
            finish_reason: last.then(|| "length".to_owned()),
            index: Some(index),
        }
    }
}

const TEXTS: [&str; 8] = [
    " the",
    " response",
    " plane",
    ",",
    " streams",
    " tokens",
    " quickly",
    " and reliably across lanes",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_50_to_150_bytes_encoded() {
        for r in 0..50u64 {
            for i in 0..50u32 {
                let item = EngineOutput::token(r, i, i == 49);
                let named = rmp_serde_len(&item);
                assert!((50..=150).contains(&named), "{named} bytes: {item:?}");
            }
        }
    }

    /// The encoded size with the planes' default codec, MessagePack with field names.
    fn rmp_serde_len(item: &EngineOutput) -> usize {
        rmp_serde::to_vec_named(item).map(|v| v.len()).unwrap_or(0)
    }
}
