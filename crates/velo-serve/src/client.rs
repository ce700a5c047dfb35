//! A small HTTP/1.1 client (hyper) with an SSE parser: what the end-to-end tests and the load
//! generator talk to velo-serve with, the way an OpenAI client does. A [`Conn`] is one kept-
//! alive connection; dropping it (or a [`Response`] still streaming) closes the socket, which is
//! how a client disconnects.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Largest SSE event or plain body read, in bytes.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Why a request failed on the client side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Connecting failed.
    #[error("connect: {0}")]
    Connect(#[source] std::io::Error),
    /// HTTP failed (the connection broke, a malformed response).
    #[error("http: {0}")]
    Http(#[from] hyper::Error),
    /// The request could not be built.
    #[error("request: {0}")]
    Request(#[from] hyper::http::Error),
    /// A body or event larger than [`MAX_BODY_BYTES`].
    #[error("response larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    /// The body is not UTF-8.
    #[error("response is not UTF-8")]
    NotUtf8,
}

/// One HTTP/1.1 connection.
pub struct Conn {
    addr: SocketAddr,
    sender: SendRequest<Full<Bytes>>,
    task: JoinHandle<()>,
}

impl Conn {
    /// Connects to `addr`.
    ///
    /// # Errors
    ///
    /// [`ClientError::Connect`], [`ClientError::Http`].
    pub async fn open(addr: SocketAddr) -> Result<Self, ClientError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(ClientError::Connect)?;
        stream.set_nodelay(true).map_err(ClientError::Connect)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self { addr, sender, task })
    }

    /// Whether another request can be sent on this connection.
    pub fn is_open(&self) -> bool {
        !self.sender.is_closed()
    }

    /// Sends a request with an optional JSON body.
    ///
    /// # Errors
    ///
    /// [`ClientError`].
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        json: Option<String>,
    ) -> Result<Response, ClientError> {
        self.sender.ready().await?;
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string())
            .header("accept", "*/*");
        if json.is_some() {
            req = req.header("content-type", "application/json");
        }
        let body = Full::new(json.map(Bytes::from).unwrap_or_default());
        let response = self.sender.send_request(req.body(body)?).await?;
        let (parts, body) = response.into_parts();
        Ok(Response {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
            buf: BytesMut::new(),
            done: false,
        })
    }

    /// `POST path` with a JSON body.
    ///
    /// # Errors
    ///
    /// [`ClientError`].
    pub async fn post(&mut self, path: &str, json: &str) -> Result<Response, ClientError> {
        self.send("POST", path, Some(json.to_owned())).await
    }

    /// `GET path`.
    ///
    /// # Errors
    ///
    /// [`ClientError`].
    pub async fn get(&mut self, path: &str) -> Result<Response, ClientError> {
        self.send("GET", path, None).await
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A response whose body is read as text or as SSE events.
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers.
    pub headers: hyper::HeaderMap,
    body: Incoming,
    buf: BytesMut,
    done: bool,
}

/// One SSE event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined by newlines.
    pub data: String,
}

impl Response {
    /// A header's value, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The whole body as text.
    ///
    /// # Errors
    ///
    /// [`ClientError`].
    pub async fn text(mut self) -> Result<String, ClientError> {
        while self.fill().await? {}
        String::from_utf8(self.buf.to_vec()).map_err(|_| ClientError::NotUtf8)
    }

    /// The next SSE event; `None` at the end of the body.
    ///
    /// # Errors
    ///
    /// [`ClientError`] (a connection that broke mid-stream included).
    pub async fn next_event(&mut self) -> Result<Option<SseEvent>, ClientError> {
        loop {
            if let Some(end) = find(&self.buf, b"\n\n") {
                let raw = self.buf.split_to(end + 2);
                let text = std::str::from_utf8(&raw[..end]).map_err(|_| ClientError::NotUtf8)?;
                if let Some(event) = parse_event(text) {
                    return Ok(Some(event));
                }
                continue;
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// Reads one more frame into the buffer; `false` at the end.
    async fn fill(&mut self) -> Result<bool, ClientError> {
        if self.done {
            return Ok(false);
        }
        loop {
            match self.body.frame().await {
                None => {
                    self.done = true;
                    return Ok(false);
                }
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if self.buf.len() + data.len() > MAX_BODY_BYTES {
                            return Err(ClientError::TooLarge);
                        }
                        self.buf.extend_from_slice(&data);
                        return Ok(true);
                    }
                }
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Parses one SSE event block; `None` for a block of comments only.
fn parse_event(block: &str) -> Option<SseEvent> {
    let mut event = None;
    let mut data: Option<String> = None;
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event = Some(value.to_owned()),
            "data" => match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_owned()),
            },
            _ => {}
        }
    }
    data.map(|data| SseEvent { event, data })
}

/// `GET path` on a fresh connection, with its status and body, within `timeout`.
///
/// # Errors
///
/// [`ClientError`]; a timeout is [`ClientError::Connect`] with `TimedOut`.
pub async fn get_text(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), ClientError> {
    let timed_out = || ClientError::Connect(std::io::ErrorKind::TimedOut.into());
    tokio::time::timeout(timeout, async {
        let mut conn = Conn::open(addr).await?;
        let r = conn.get(path).await?;
        let status = r.status;
        Ok((status, r.text().await?))
    })
    .await
    .map_err(|_| timed_out())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_blocks_parse_into_events() {
        assert_eq!(
            parse_event("data: {\"a\":1}"),
            Some(SseEvent {
                event: None,
                data: "{\"a\":1}".into()
            })
        );
        assert_eq!(
            parse_event("event: error\ndata: x\ndata: y"),
            Some(SseEvent {
                event: Some("error".into()),
                data: "x\ny".into()
            })
        );
        assert_eq!(parse_event(": keep-alive"), None);
    }
}
