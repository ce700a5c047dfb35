//! Request bodies of `POST /v1/chat/completions` and `POST /v1/completions`, parsed and
//! checked into a [`Job`]: what the engine must do and how the answer is shaped. Unknown
//! fields are accepted and ignored (clients send sampling settings a mock engine has no use
//! for); a malformed body or a request that cannot be served is an [`ApiError`] (400).

use serde::Deserialize;

use super::error::ApiError;
use super::tokenizer;

/// Which endpoint a job came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

impl Endpoint {
    /// The request field holding the endpoint's prompt.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Self::Chat => "messages",
            Self::Completion => "prompt",
        }
    }

    /// The endpoint's label in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat_completions",
            Self::Completion => "completions",
        }
    }
}

/// How a mock generation ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The mock model reaches its end-of-sequence token before the token limit.
    Eos,
    /// The token limit is reached (always, with `ignore_eos`).
    Length,
}

/// The service's limits on a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most tokens one request may ask to generate.
    pub max_tokens: u32,
    /// Most prompt plus generated tokens.
    pub context_tokens: u32,
}

/// A checked request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// The model named.
    pub model: String,
    /// Stream the answer as SSE.
    pub stream: bool,
    /// Send a usage chunk before `[DONE]`.
    pub include_usage: bool,
    /// Prompt tokens ([`tokenizer`]).
    pub prompt_tokens: u32,
    /// Tokens the engine generates.
    pub output_tokens: u32,
    /// How generation ends.
    pub ending: Ending,
}

/// The mock model's own answer length without `ignore_eos`: 16 to 256 tokens, a function of
/// the prompt, so the same prompt always gets an answer of the same length.
pub const NATURAL_MIN_TOKENS: u32 = 16;
/// See [`NATURAL_MIN_TOKENS`].
pub const NATURAL_SPAN_TOKENS: u32 = 241;

#[derive(Deserialize)]
struct Common {
    model: String,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    ignore_eos: Option<bool>,
    #[serde(default)]
    nvext: Option<NvExt>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct NvExt {
    #[serde(default)]
    ignore_eos: Option<bool>,
}

#[derive(Deserialize)]
struct ChatBody {
    #[serde(flatten)]
    common: Common,
    messages: Vec<Message>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct CompletionBody {
    #[serde(flatten)]
    common: Common,
    prompt: Prompt,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    Batches(Vec<Vec<u32>>),
}

/// Parses and checks a request body for `endpoint`, served as `model` within `limits`.
///
/// # Errors
///
/// 400 for a body that is not the JSON the endpoint takes or that asks for too many tokens,
/// 404 for another model.
pub fn parse(
    endpoint: Endpoint,
    body: &[u8],
    model: &str,
    limits: Limits,
) -> Result<Job, ApiError> {
    let (common, prompt_tokens, digest) = read_body(endpoint, body)?;
    if common.model != model {
        return Err(ApiError::model_not_found(&common.model));
    }
    let prompt_tokens = u32::try_from(prompt_tokens)
        .ok()
        .filter(|&t| t <= limits.context_tokens)
        .ok_or_else(|| too_long(endpoint, prompt_tokens, limits))?;
    let limit = output_limit(endpoint, &common, prompt_tokens, limits)?;
    let ignore_eos = common
        .ignore_eos
        .or_else(|| common.nvext.as_ref().and_then(|n| n.ignore_eos))
        .unwrap_or(false);
    let natural =
        NATURAL_MIN_TOKENS + u32::try_from(digest % u64::from(NATURAL_SPAN_TOKENS)).unwrap_or(0);
    let (output_tokens, ending) = if ignore_eos || natural >= limit {
        (limit, Ending::Length)
    } else {
        (natural, Ending::Eos)
    };
    Ok(Job {
        endpoint,
        model: common.model,
        stream: common.stream.unwrap_or(false),
        include_usage: common
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        prompt_tokens,
        output_tokens,
        ending,
    })
}

/// The body's common fields, its prompt tokens and a digest of the prompt.
fn read_body(endpoint: Endpoint, body: &[u8]) -> Result<(Common, u64, u64), ApiError> {
    Ok(match endpoint {
        Endpoint::Chat => {
            let b: ChatBody = serde_json::from_slice(body).map_err(bad_json)?;
            let (tokens, digest) = chat_prompt(&b.messages)?;
            (b.common, tokens, digest)
        }
        Endpoint::Completion => {
            let b: CompletionBody = serde_json::from_slice(body).map_err(bad_json)?;
            let (tokens, digest) = completion_prompt(&b.prompt)?;
            (b.common, tokens, digest)
        }
    })
}

/// The most tokens the request may generate: what it asks (`max_completion_tokens`, else
/// `max_tokens`), checked against the service's limit and the room left in the context.
fn output_limit(
    endpoint: Endpoint,
    common: &Common,
    prompt_tokens: u32,
    limits: Limits,
) -> Result<u32, ApiError> {
    let asked = match (common.max_completion_tokens, common.max_tokens) {
        (Some(n), _) => Some((n, "max_completion_tokens")),
        (None, Some(n)) => Some((n, "max_tokens")),
        (None, None) => None,
    };
    // `parse` checked that the prompt fits the context.
    let room = limits.context_tokens.saturating_sub(prompt_tokens);
    let limit = match asked {
        Some((0, param)) => {
            let message = format!("{param} must be at least 1");
            return Err(ApiError::invalid(message, Some(param)));
        }
        Some((n, param)) if n > u64::from(limits.max_tokens) => {
            let most = limits.max_tokens;
            let message =
                format!("{param} is {n}; this service generates at most {most} tokens per request");
            return Err(ApiError::invalid(message, Some(param)));
        }
        Some((n, param)) if n > u64::from(room) => {
            let context = limits.context_tokens;
            let message = format!(
                "this model's context is {context} tokens; the prompt has {prompt_tokens} and {param} asks for {n}"
            );
            return Err(ApiError::invalid_code(
                message,
                Some(param),
                "context_length_exceeded",
            ));
        }
        // Checked above: within `limits.max_tokens`, a u32.
        Some((n, _)) => u32::try_from(n).unwrap_or(limits.max_tokens),
        None => limits.max_tokens.min(room),
    };
    if limit == 0 {
        return Err(too_long(endpoint, u64::from(prompt_tokens), limits));
    }
    Ok(limit)
}

fn bad_json(e: serde_json::Error) -> ApiError {
    ApiError::invalid(format!("invalid request body: {e}"), None)
}

/// 400: the prompt fills the context; the error names the endpoint's prompt field.
fn too_long(endpoint: Endpoint, prompt_tokens: u64, limits: Limits) -> ApiError {
    ApiError::invalid_code(
        format!(
            "this model's context is {} tokens; the prompt has {prompt_tokens}",
            limits.context_tokens
        ),
        Some(endpoint.prompt_param()),
        "context_length_exceeded",
    )
}

/// Prompt tokens of a chat and a digest of its text.
fn chat_prompt(messages: &[Message]) -> Result<(u64, u64), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let mut tokens = u64::from(tokenizer::REPLY_PRIMER_TOKENS);
    let mut digest = Fnv::new();
    for m in messages {
        tokens += u64::from(tokenizer::TOKENS_PER_MESSAGE);
        if let Some(role) = &m.role {
            digest.add(role.as_bytes());
        }
        match &m.content {
            Some(Content::Text(t)) => {
                tokens += tokenizer::count(t);
                digest.add(t.as_bytes());
            }
            Some(Content::Parts(parts)) => {
                for t in parts.iter().filter_map(|p| p.text.as_deref()) {
                    tokens += tokenizer::count(t);
                    digest.add(t.as_bytes());
                }
            }
            None => {}
        }
    }
    Ok((tokens, digest.0))
}

/// Prompt tokens of a completion request and a digest of its prompt.
fn completion_prompt(prompt: &Prompt) -> Result<(u64, u64), ApiError> {
    let mut digest = Fnv::new();
    let tokens = match prompt {
        Prompt::Text(t) => {
            digest.add(t.as_bytes());
            tokenizer::count(t)
        }
        Prompt::Texts(v) if v.len() == 1 => {
            digest.add(v[0].as_bytes());
            tokenizer::count(&v[0])
        }
        Prompt::Tokens(ids) => {
            for id in ids {
                digest.add(&id.to_le_bytes());
            }
            u64::try_from(ids.len()).unwrap_or(u64::MAX)
        }
        Prompt::Batches(b) if b.len() == 1 => {
            for id in &b[0] {
                digest.add(&id.to_le_bytes());
            }
            u64::try_from(b[0].len()).unwrap_or(u64::MAX)
        }
        Prompt::Texts(_) | Prompt::Batches(_) => {
            return Err(ApiError::invalid(
                "batched prompts are not supported: send one prompt per request",
                Some("prompt"),
            ));
        }
    };
    Ok((tokens, digest.0))
}

/// FNV-1a, for a stable digest of the prompt.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn add(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_tokens: 1000,
        context_tokens: 2000,
    };

    fn chat(body: serde_json::Value) -> Result<Job, ApiError> {
        parse(Endpoint::Chat, body.to_string().as_bytes(), "m", LIMITS)
    }

    #[test]
    fn ignore_eos_generates_exactly_max_tokens_wherever_it_is_given() {
        let msgs = serde_json::json!([{"role": "user", "content": "Hello there"}]);
        for body in [
            serde_json::json!({"model": "m", "messages": msgs, "max_tokens": 300, "ignore_eos": true}),
            serde_json::json!({"model": "m", "messages": msgs, "max_completion_tokens": 300, "nvext": {"ignore_eos": true}}),
        ] {
            let job = chat(body).unwrap();
            assert_eq!((job.output_tokens, job.ending), (300, Ending::Length));
        }
        let job =
            chat(serde_json::json!({"model": "m", "messages": msgs, "max_tokens": 300})).unwrap();
        assert!(
            job.output_tokens < 300 && job.ending == Ending::Eos,
            "{job:?}"
        );
        assert_eq!(job.prompt_tokens, 3 + 3 + 2);
    }

    #[test]
    fn too_many_tokens_and_bad_bodies_are_400s_naming_the_field() {
        let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
        let e = chat(serde_json::json!({"model": "m", "messages": msgs, "max_tokens": 1001}))
            .unwrap_err();
        assert_eq!((e.status.as_u16(), e.param), (400, Some("max_tokens")));
        let e =
            chat(serde_json::json!({"model": "m", "messages": msgs, "max_tokens": 0})).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        let e = chat(serde_json::json!({"model": "m", "messages": msgs, "max_tokens": -3}))
            .unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        let e = chat(serde_json::json!({"model": "m", "messages": []})).unwrap_err();
        assert_eq!(e.param, Some("messages"));
        let e = parse(Endpoint::Chat, b"{not json", "m", LIMITS).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        let e = chat(serde_json::json!({"model": "other", "messages": msgs})).unwrap_err();
        assert_eq!(e.status.as_u16(), 404);
        let long = "word ".repeat(1990);
        let e = chat(serde_json::json!({"model": "m", "messages": [{"role": "user", "content": long}], "max_tokens": 100})).unwrap_err();
        assert_eq!(e.code, Some("context_length_exceeded"));
    }

    /// A prompt longer than the context is blamed on the field that holds it: `messages` for
    /// a chat, `prompt` for a completion.
    #[test]
    fn a_prompt_over_the_context_names_the_endpoints_prompt_field() {
        let long = "word ".repeat(usize::try_from(LIMITS.context_tokens).unwrap() + 10);
        let msgs = serde_json::json!([{"role": "user", "content": long}]);
        let e = chat(serde_json::json!({"model": "m", "messages": msgs})).unwrap_err();
        assert_eq!(
            (e.code, e.param),
            (Some("context_length_exceeded"), Some("messages"))
        );
        let body = serde_json::json!({"model": "m", "prompt": long});
        let e = parse(
            Endpoint::Completion,
            body.to_string().as_bytes(),
            "m",
            LIMITS,
        )
        .unwrap_err();
        assert_eq!(
            (e.code, e.param),
            (Some("context_length_exceeded"), Some("prompt"))
        );
    }

    #[test]
    fn completion_prompts_are_text_or_token_ids() {
        let p = |prompt: serde_json::Value| {
            let body = serde_json::json!({"model": "m", "prompt": prompt, "max_tokens": 5});
            parse(
                Endpoint::Completion,
                body.to_string().as_bytes(),
                "m",
                LIMITS,
            )
        };
        assert_eq!(
            p(serde_json::json!("one two three")).unwrap().prompt_tokens,
            3
        );
        assert_eq!(p(serde_json::json!([1, 2, 3, 4])).unwrap().prompt_tokens, 4);
        assert_eq!(p(serde_json::json!(["a b"])).unwrap().prompt_tokens, 2);
        assert_eq!(
            p(serde_json::json!(["a", "b"])).unwrap_err().param,
            Some("prompt")
        );
    }
}
