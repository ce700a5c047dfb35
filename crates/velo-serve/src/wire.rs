//! What crosses the response plane, item by item, in the shape Dynamo's workers send: a
//! `NetworkStreamWrapper` around an `Annotated<LLMEngineOutput>`, MessagePack with field names
//! (the plane's default codec). The types are written here from Dynamo's field names and serde
//! shape (REFERENCE.md section 7); `None` fields of `Annotated` are skipped, an engine's finish
//! reason is an externally tagged enum (`"eos"`, `"length"`, `{"error": "..."}`), and a stream
//! ends with an item whose `complete_final` is set and which carries no data.

use serde::{Deserialize, Serialize};

/// One item on the plane: the engine's output, or (last) the `complete_final` marker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkStreamWrapper<T> {
    /// The item; absent on the final marker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<T>,
    /// Set on the last item of a stream that ended cleanly.
    pub complete_final: bool,
}

/// Dynamo's annotated response: data, or an event (an engine error is `event: "error"` with
/// the message in `comment`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Annotated<T> {
    /// The payload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<T>,
    /// The response id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// An event name (`"error"` for an engine error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Comment lines (an error's message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<Vec<String>>,
}

/// The event name of an engine error.
pub const ERROR_EVENT: &str = "error";

impl<T> Annotated<T> {
    /// Plain data.
    pub fn data(data: T) -> Self {
        Self {
            data: Some(data),
            id: None,
            event: None,
            comment: None,
        }
    }

    /// An engine error with `message`.
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            data: None,
            id: None,
            event: Some(ERROR_EVENT.to_owned()),
            comment: Some(vec![message.into()]),
        }
    }

    /// The error message, when this is an error event.
    pub fn error_message(&self) -> Option<String> {
        (self.event.as_deref() == Some(ERROR_EVENT)).then(|| {
            self.comment
                .as_ref()
                .map_or_else(|| "engine error".to_owned(), |c| c.join("; "))
        })
    }
}

/// Why an engine stopped generating, as Dynamo's `FinishReason` serializes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishReason {
    /// The model emitted its end-of-sequence token.
    #[serde(rename = "eos")]
    EoS,
    /// `max_tokens` was reached.
    #[serde(rename = "length")]
    Length,
    /// A stop string or token matched.
    #[serde(rename = "stop")]
    Stop,
    /// The engine failed.
    #[serde(rename = "error")]
    Error(String),
    /// The request was cancelled.
    #[serde(rename = "cancelled", alias = "abort")]
    Cancelled,
    /// A content filter stopped it.
    #[serde(rename = "content_filter")]
    ContentFilter,
}

impl FinishReason {
    /// The OpenAI `finish_reason` Dynamo maps this to: `eos`, `stop` and `cancelled` are
    /// `"stop"`, `length` is `"length"`; an error is not a finish reason (it becomes an error
    /// event), so it maps to `None`.
    pub fn openai(&self) -> Option<&'static str> {
        match self {
            Self::EoS | Self::Stop | Self::Cancelled => Some("stop"),
            Self::Length => Some("length"),
            Self::ContentFilter => Some("content_filter"),
            Self::Error(_) => None,
        }
    }
}

/// What the output is (Dynamo's `OutputType`): always text here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputType {
    /// Text.
    #[default]
    Text,
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CompletionUsage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Both.
    pub total_tokens: u32,
}

impl CompletionUsage {
    /// Usage of `prompt_tokens` in and `completion_tokens` out.
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
        }
    }
}

/// One engine step's output (Dynamo's `LLMEngineOutput`): the fields a text engine fills.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LLMEngineOutput {
    /// New token ids.
    pub token_ids: Vec<u32>,
    /// Their detokenized pieces, when the engine detokenizes per token.
    pub tokens: Option<Vec<Option<String>>>,
    /// The decoded text of the new tokens.
    pub text: Option<String>,
    /// Always text.
    #[serde(default)]
    pub output_type: OutputType,
    /// Cumulative log probability.
    pub cum_log_probs: Option<f64>,
    /// Per-token log probabilities.
    pub log_probs: Option<Vec<f64>>,
    /// Top log probabilities per token (unused by the mock engine: always `None`).
    pub top_logprobs: Option<Vec<Vec<serde_json::Value>>>,
    /// Set on the last output.
    pub finish_reason: Option<FinishReason>,
    /// The choice index.
    pub index: Option<u32>,
    /// Token counts, on the last output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_usage: Option<CompletionUsage>,
}

/// The item type of a velo-serve response stream.
pub type StreamItem = NetworkStreamWrapper<Annotated<LLMEngineOutput>>;

impl StreamItem {
    /// The `complete_final` marker that ends a clean stream.
    pub fn complete_final() -> Self {
        Self {
            data: None,
            complete_final: true,
        }
    }

    /// One engine output.
    pub fn output(output: LLMEngineOutput) -> Self {
        Self {
            data: Some(Annotated::data(output)),
            complete_final: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(finish: Option<FinishReason>) -> LLMEngineOutput {
        LLMEngineOutput {
            token_ids: vec![42],
            tokens: None,
            text: Some(" the".into()),
            output_type: OutputType::Text,
            cum_log_probs: Some(-0.5),
            log_probs: None,
            top_logprobs: None,
            finish_reason: finish,
            index: None,
            completion_usage: None,
        }
    }

    #[test]
    fn an_item_is_named_msgpack_with_dynamos_field_names_and_none_annotations_skipped() {
        let item = StreamItem::output(token(Some(FinishReason::Length)));
        let bytes = rmp_serde::to_vec_named(&item).unwrap();
        let back: serde_json::Value = rmp_serde::from_slice(&bytes).unwrap();
        let expect = serde_json::json!({
            "data": {"data": {
                "token_ids": [42], "tokens": null, "text": " the", "output_type": "text",
                "cum_log_probs": -0.5, "log_probs": null, "top_logprobs": null,
                "finish_reason": "length", "index": null
            }},
            "complete_final": false
        });
        assert_eq!(back, expect);
        let typed: StreamItem = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(typed, item);
    }

    #[test]
    fn the_final_marker_carries_no_data_and_errors_are_annotated_events() {
        let end = serde_json::to_value(StreamItem::complete_final()).unwrap();
        assert_eq!(end, serde_json::json!({"complete_final": true}));
        let err = Annotated::<LLMEngineOutput>::error("boom");
        assert_eq!(
            serde_json::to_value(&err).unwrap(),
            serde_json::json!({"event": "error", "comment": ["boom"]})
        );
        assert_eq!(err.error_message().as_deref(), Some("boom"));
        let reason = serde_json::to_value(FinishReason::Error("x".into())).unwrap();
        assert_eq!(reason, serde_json::json!({"error": "x"}));
    }

    #[test]
    fn finish_reasons_map_as_dynamo_maps_them() {
        for (r, openai) in [
            (FinishReason::EoS, Some("stop")),
            (FinishReason::Stop, Some("stop")),
            (FinishReason::Cancelled, Some("stop")),
            (FinishReason::Length, Some("length")),
            (FinishReason::Error("e".into()), None),
        ] {
            assert_eq!(r.openai(), openai, "{r:?}");
        }
        let abort: FinishReason = serde_json::from_str("\"abort\"").unwrap();
        assert_eq!(abort, FinishReason::Cancelled);
    }
}
