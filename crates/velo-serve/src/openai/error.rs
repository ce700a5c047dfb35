//! OpenAI-style error responses: `{"error": {"message", "type", "param", "code"}}` with the
//! HTTP status that goes with them.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Seconds a client is told to wait after a 503 (`Retry-After`).
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// An error answered to an HTTP client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `not_found_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<&'static str>,
    /// A machine-readable code, if one applies.
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Object<'a>,
}

/// The error object, as OpenAI sends it (also inside an SSE error event).
#[derive(Serialize)]
pub(crate) struct Object<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// 400: the request is malformed or asks for what cannot be served.
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    /// 400 with a code.
    pub fn invalid_code(
        message: impl Into<String>,
        param: Option<&'static str>,
        code: &'static str,
    ) -> Self {
        Self {
            code: Some(code),
            ..Self::invalid(message, param)
        }
    }

    /// 404: no such model.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{model}` does not exist"),
            kind: "not_found_error",
            param: Some("model"),
            code: Some("model_not_found"),
        }
    }

    /// 503: too much load right now; the client should retry after [`RETRY_AFTER_SECONDS`].
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "service_unavailable",
            param: None,
            code: Some("overloaded"),
        }
    }

    /// 500 (or another 5xx): the service failed.
    pub fn internal(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind: "internal_error",
            param: None,
            code: None,
        }
    }

    /// The error object.
    pub(crate) fn object(&self) -> Object<'_> {
        Object {
            message: &self.message,
            kind: self.kind,
            param: self.param,
            code: self.code,
        }
    }

    /// The JSON body `{"error": {...}}`.
    pub fn body(&self) -> String {
        let body = Body {
            error: self.object(),
        };
        serde_json::to_string(&body).unwrap_or_else(|_| String::from("{\"error\":{}}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body()).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}
