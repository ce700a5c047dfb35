//! The request channel: frontend to worker process, one TCP connection per worker process,
//! length-prefixed frames. Cheap next to what is measured, and never the bottleneck: requests
//! are written in batches by one task per connection.
//!
//! A frame is opaque to the channel: our planes and Velo 0.21 send a [`Request`] as JSON,
//! Dynamo's TCP plane sends the two-part envelope its router builds around the request.

use bytes::{Buf, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Largest frame accepted, in bytes.
const MAX_FRAME: usize = 1 << 20;
/// Frames queued per connection before senders wait.
const QUEUE: usize = 16_384;
/// Bytes gathered into one write, at most (a frame never splits).
const MAX_WRITE: usize = 256 * 1024;
/// Bytes reserved per read.
const READ_CHUNK: usize = 64 * 1024;

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
    /// The response stream's address (the plane's own format; empty where the plane carries
    /// it in its own envelope).
    pub info: String,
}

impl Request {
    /// The JSON form our planes put on the channel.
    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("a request always serializes"))
    }

    /// Parses the JSON form.
    ///
    /// # Errors
    ///
    /// The JSON error, as text.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("bad request: {e}"))
    }
}

/// The frontend's side: a queue feeding one connection.
#[derive(Clone)]
pub struct RequestSender {
    tx: mpsc::Sender<Bytes>,
}

impl RequestSender {
    /// Connects to a worker process and starts the task that writes its requests.
    ///
    /// # Errors
    ///
    /// The connection's I/O error.
    pub async fn connect(addr: &str) -> std::io::Result<Self> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (tx, mut rx) = mpsc::channel::<Bytes>(QUEUE);
        tokio::spawn(async move {
            let mut out = Vec::with_capacity(READ_CHUNK);
            while let Some(first) = rx.recv().await {
                out.clear();
                push(&mut out, &first);
                // Whatever else is queued goes in the same write.
                while let Ok(frame) = rx.try_recv() {
                    push(&mut out, &frame);
                    if out.len() > MAX_WRITE {
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

    /// Connects to every worker process, in order.
    ///
    /// # Errors
    ///
    /// The first connection that fails, naming its address.
    pub async fn connect_all(addrs: &[String]) -> Result<Vec<Self>, String> {
        let mut out = Vec::with_capacity(addrs.len());
        for a in addrs {
            out.push(Self::connect(a).await.map_err(|e| format!("{a}: {e}"))?);
        }
        Ok(out)
    }

    /// Queues a request in its JSON form.
    ///
    /// # Errors
    ///
    /// When the connection is gone.
    pub async fn send(&self, r: &Request) -> Result<(), String> {
        self.send_frame(r.encode()).await
    }

    /// Queues one opaque frame.
    ///
    /// # Errors
    ///
    /// When the connection is gone, or the frame is larger than the channel accepts.
    pub async fn send_frame(&self, frame: Bytes) -> Result<(), String> {
        if frame.len() > MAX_FRAME {
            return Err(format!(
                "request of {} bytes exceeds {MAX_FRAME}",
                frame.len()
            ));
        }
        self.tx
            .send(frame)
            .await
            .map_err(|_| "request channel closed".to_owned())
    }
}

fn push(out: &mut Vec<u8>, frame: &[u8]) {
    // `send_frame` bounds the length by MAX_FRAME, far below u32::MAX.
    let len = u32::try_from(frame.len()).expect("frames are at most MAX_FRAME bytes");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(frame);
}

/// Reads frames from one frontend connection and hands each to `deliver`.
pub async fn serve(mut stream: TcpStream, mut deliver: impl FnMut(Bytes)) {
    let _ = stream.set_nodelay(true);
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        while buf.len() >= 4 {
            let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if len > MAX_FRAME {
                eprintln!("request of {len} bytes exceeds {MAX_FRAME}: closing");
                return;
            }
            if buf.len() < 4 + len {
                break;
            }
            buf.advance(4);
            deliver(buf.split_to(len).freeze());
        }
        buf.reserve(READ_CHUNK);
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
