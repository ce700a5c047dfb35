//! The request channel: frontend to worker process, one TCP connection per worker process,
//! length-prefixed JSON. Cheap next to what is measured, and never the bottleneck: requests
//! are written in batches by one task per connection.

use std::net::SocketAddr;

use bytes::{Buf, BytesMut};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Largest request accepted, in bytes.
const MAX_REQUEST: usize = 1 << 20;
/// Requests queued per connection before senders wait.
const QUEUE: usize = 16_384;

/// One inference request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// Unique id.
    pub id: u64,
    /// Which mock worker of the process serves it.
    pub worker: u32,
    /// Prompt length in tokens.
    pub isl: u32,
    /// Output length in tokens.
    pub osl: u32,
    /// The response stream's address (the plane's own format).
    pub info: String,
}

/// The frontend's side: a queue feeding one connection.
#[derive(Clone)]
pub struct RequestSender {
    tx: mpsc::Sender<Request>,
}

impl RequestSender {
    /// Connects to a worker process and starts the task that writes its requests.
    ///
    /// # Errors
    ///
    /// The connection's I/O error.
    pub async fn connect(addr: SocketAddr) -> std::io::Result<Self> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (tx, mut rx) = mpsc::channel::<Request>(QUEUE);
        tokio::spawn(async move {
            let mut out = Vec::with_capacity(64 * 1024);
            while let Some(first) = rx.recv().await {
                out.clear();
                push(&mut out, &first);
                // Whatever else is queued goes in the same write.
                while let Ok(r) = rx.try_recv() {
                    push(&mut out, &r);
                    if out.len() > 256 * 1024 {
                        break;
                    }
                }
                if stream.write_all(&out).await.is_err() {
                    return;
                }
            }
        });
        Ok(Self { tx })
    }

    /// Queues a request.
    ///
    /// # Errors
    ///
    /// When the connection is gone.
    pub async fn send(&self, r: Request) -> Result<(), String> {
        self.tx
            .send(r)
            .await
            .map_err(|_| "request channel closed".to_owned())
    }
}

fn push(out: &mut Vec<u8>, r: &Request) {
    let body = serde_json::to_vec(r).expect("a request always serializes");
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&body);
}

/// Reads requests from one frontend connection and hands each to `deliver`.
pub async fn serve(mut stream: TcpStream, mut deliver: impl FnMut(Request)) {
    let _ = stream.set_nodelay(true);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        while buf.len() >= 4 {
            let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if len > MAX_REQUEST {
                eprintln!("request of {len} bytes exceeds {MAX_REQUEST}: closing");
                return;
            }
            if buf.len() < 4 + len {
                break;
            }
            buf.advance(4);
            let body = buf.split_to(len);
            match serde_json::from_slice::<Request>(&body) {
                Ok(r) => deliver(r),
                Err(e) => {
                    eprintln!("bad request: {e}");
                    return;
                }
            }
        }
        buf.reserve(64 * 1024);
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
