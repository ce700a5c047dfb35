//! The answer's shape, as OpenAI and Dynamo send it: `chat.completion.chunk` (or
//! `text_completion`) SSE events, one per engine output, `role` only on the first chunk, the
//! finish reason on the last token's chunk, a usage chunk (empty `choices`) when
//! `stream_options.include_usage` is set, and `data: [DONE]`; or one `chat.completion` /
//! `text_completion` object when not streaming.

use bytes::Bytes;
use serde::Serialize;

use super::error::ApiError;
use super::request::{Endpoint, Job};
use crate::wire::CompletionUsage;

/// The SSE event that ends a stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Shapes one request's answer.
#[derive(Debug)]
pub struct Shaper {
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
    include_usage: bool,
    role_sent: bool,
}

#[derive(Serialize)]
struct Chunk<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: C,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<CompletionUsage>>,
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    finish_reason: Option<&'a str>,
    logprobs: Option<()>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    content: &'a str,
}

#[derive(Serialize)]
struct TextChoice<'a> {
    index: u32,
    text: &'a str,
    finish_reason: Option<&'a str>,
    logprobs: Option<()>,
}

#[derive(Serialize)]
struct FullChatChoice<'a> {
    index: u32,
    message: Message<'a>,
    finish_reason: Option<&'a str>,
    logprobs: Option<()>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct ErrorEvent<'a> {
    error: super::error::Object<'a>,
}

impl Shaper {
    /// A shaper for `job`, whose response id is `id` (32 hex digits).
    pub fn new(job: &Job, id: &str) -> Self {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let prefix = match job.endpoint {
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completion => "cmpl-",
        };
        Self {
            id: format!("{prefix}{id}"),
            created,
            model: job.model.clone(),
            endpoint: job.endpoint,
            include_usage: job.include_usage,
            role_sent: false,
        }
    }

    /// The response id (`chatcmpl-...` or `cmpl-...`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// One SSE event for `text` (and the finish reason, on the last).
    pub fn token(&mut self, text: &str, finish_reason: Option<&str>) -> Bytes {
        let usage = self.include_usage.then_some(None);
        let json = match self.endpoint {
            Endpoint::Chat => {
                let role = (!self.role_sent).then_some("assistant");
                self.role_sent = true;
                let choice = ChatChoice {
                    index: 0,
                    delta: Delta {
                        role,
                        content: text,
                    },
                    finish_reason,
                    logprobs: None,
                };
                self.json([choice], usage)
            }
            Endpoint::Completion => {
                let choice = TextChoice {
                    index: 0,
                    text,
                    finish_reason,
                    logprobs: None,
                };
                self.json([choice], usage)
            }
        };
        sse(&json)
    }

    /// The usage chunk (empty `choices`), sent before `[DONE]` when asked for.
    pub fn usage(&self, usage: CompletionUsage) -> Option<Bytes> {
        self.include_usage
            .then(|| sse(&self.json::<[(); 0]>([], Some(Some(usage)))))
    }

    /// An SSE error event: `event: error` and the OpenAI error object (what OpenAI's clients
    /// raise on).
    pub fn error(error: &ApiError) -> Bytes {
        let json = serde_json::to_string(&ErrorEvent {
            error: error.object(),
        })
        .unwrap_or_default();
        let mut out = Vec::with_capacity(json.len() + 24);
        out.extend_from_slice(b"event: error\ndata: ");
        out.extend_from_slice(json.as_bytes());
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }

    /// The whole answer as one object (not streaming).
    pub fn full(&self, text: &str, finish_reason: Option<&str>, usage: CompletionUsage) -> String {
        let usage = Some(Some(usage));
        match self.endpoint {
            Endpoint::Chat => {
                let choice = FullChatChoice {
                    index: 0,
                    message: Message {
                        role: "assistant",
                        content: text,
                    },
                    finish_reason,
                    logprobs: None,
                };
                self.json_object("chat.completion", [choice], usage)
            }
            Endpoint::Completion => {
                let choice = TextChoice {
                    index: 0,
                    text,
                    finish_reason,
                    logprobs: None,
                };
                self.json_object("text_completion", [choice], usage)
            }
        }
    }

    fn json<C: Serialize>(&self, choices: C, usage: Option<Option<CompletionUsage>>) -> String {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        };
        self.json_object(object, choices, usage)
    }

    fn json_object<C: Serialize>(
        &self,
        object: &'static str,
        choices: C,
        usage: Option<Option<CompletionUsage>>,
    ) -> String {
        let chunk = Chunk {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            choices,
            usage,
        };
        // Plain structs of strings and numbers always serialize.
        serde_json::to_string(&chunk).unwrap_or_default()
    }
}

fn sse(json: &str) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json.as_bytes());
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}
