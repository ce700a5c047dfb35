//! The worker role: serves streams on command (prologue, paced items, finish) and reports each
//! stream's end exactly once; as a hostile client it floods a frontend with forged OPENs.

use std::sync::Arc;
use std::time::Duration;

use response_plane::{ConnectionInfo, ResponseError};
use runtime_glue::{ResponseService, Role};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Semaphore;
use velo_faults::protocol::{Command, Event, Outcome, forge_ticket, from_line};

use crate::service::{self, ItemOut, RoleArgs, emit};

/// Most forged streams one flood opens.
const MAX_FLOOD: u64 = 100_000;
/// Most forged streams in flight at once.
const MAX_FLOOD_CONCURRENCY: u64 = 4096;
/// Largest padding per item: 1 MiB.
const MAX_ITEM_BYTES: u32 = 1 << 20;

/// One stream to serve.
struct Serve {
    sid: u64,
    items: u64,
    interval: Duration,
    item_bytes: u32,
    delay: Duration,
    info: String,
}

/// Runs the worker role until told to quit or its input ends.
pub(crate) async fn run(args: RoleArgs) -> Result<(), String> {
    let service = service::start(Role::Worker, &args).await?;
    emit(&Event::Ready { addr: None });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match from_line::<Command>(&line) {
            Ok(Command::Serve {
                sid,
                items,
                interval_ms,
                item_bytes,
                delay_ms,
                info,
            }) => {
                let serve = Serve {
                    sid,
                    items,
                    interval: Duration::from_millis(interval_ms),
                    item_bytes: item_bytes.min(MAX_ITEM_BYTES),
                    delay: Duration::from_millis(delay_ms),
                    info,
                };
                tokio::spawn(serve_one(service.clone(), serve));
            }
            Ok(Command::Flood {
                first_sid,
                count,
                concurrency,
                info,
            }) => {
                tokio::spawn(flood(service.clone(), first_sid, count, concurrency, info));
            }
            Ok(Command::Quit) => break,
            Ok(other) => eprintln!("worker: not a worker command: {other:?}"),
            Err(e) => eprintln!("worker: bad command {line:?}: {e}"),
        }
    }
    Ok(())
}

async fn serve_one(service: ResponseService, serve: Serve) {
    let sid = serve.sid;
    let (outcome, items) = send_stream(&service, serve).await;
    emit(&Event::WorkerEnd {
        sid,
        outcome,
        items,
    });
}

/// Sends one stream: how it ended and how many items were sent.
async fn send_stream(service: &ResponseService, s: Serve) -> (Outcome, u64) {
    if !s.delay.is_zero() {
        tokio::time::sleep(s.delay).await;
    }
    let info: ConnectionInfo = match serde_json::from_str(&s.info) {
        Ok(info) => info,
        Err(e) => return (Outcome::Setup(format!("bad connection info: {e}")), 0),
    };
    let pad = "x".repeat(s.item_bytes as usize);
    let mut tx = match service.connect::<ItemOut<'_>>(&info).await {
        Ok(tx) => tx,
        Err(e) => return (Outcome::Setup(e.to_string()), 0),
    };
    if let Err(e) = tx.send_prologue(Ok(())).await {
        return (ended(&e), 0);
    }
    let ctx = tx.context();
    for seq in 0..s.items {
        if !s.interval.is_zero() {
            // Cancel safety: both are plain waits.
            tokio::select! {
                () = tokio::time::sleep(s.interval) => {}
                () = ctx.killed() => return (Outcome::Killed, seq),
            }
        }
        if let Err(e) = tx.send(&ItemOut { seq, pad: &pad }).await {
            return (ended(&e), seq);
        }
    }
    match tx.finish().await {
        Ok(()) => (Outcome::Clean, s.items),
        Err(e) => (ended(&e), s.items),
    }
}

fn ended(e: &ResponseError) -> Outcome {
    if e.is_cancelled() {
        Outcome::Killed
    } else {
        Outcome::Error(e.to_string())
    }
}

/// Opens `count` streams with forged tickets, at most `concurrency` at a time, and reports
/// each once the frontend refused it.
async fn flood(
    service: ResponseService,
    first_sid: u64,
    count: u64,
    concurrency: u64,
    info: String,
) {
    let permits = usize::try_from(concurrency.clamp(1, MAX_FLOOD_CONCURRENCY)).unwrap_or(1);
    let permits = Arc::new(Semaphore::new(permits));
    for i in 0..count.min(MAX_FLOOD) {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let forged = forge_ticket(&info, rand::random(), rand::random());
        let service = service.clone();
        tokio::spawn(async move {
            let outcome = forged_stream(&service, forged).await;
            emit(&Event::WorkerEnd {
                sid: first_sid + i,
                outcome,
                items: 0,
            });
            drop(permit);
        });
    }
}

/// One forged stream: opened, then refused by the frontend (or failing on the way).
async fn forged_stream(service: &ResponseService, forged: Result<String, String>) -> Outcome {
    let info: ConnectionInfo = match forged
        .and_then(|f| serde_json::from_str(&f).map_err(|e| format!("bad connection info: {e}")))
    {
        Ok(info) => info,
        Err(e) => return Outcome::Setup(e),
    };
    let mut tx = match service.connect::<ItemOut<'static>>(&info).await {
        Ok(tx) => tx,
        Err(e) => return Outcome::Setup(e.to_string()),
    };
    if tx.send_prologue(Ok(())).await.is_ok() {
        tx.context().killed().await;
    }
    Outcome::Refused
}
