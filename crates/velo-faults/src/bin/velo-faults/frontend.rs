//! The frontend role: registers streams on command, reads them, and reports each stream's end
//! exactly once.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use response_plane::{PendingResponse, ResponseStream};
use response_plane::{RegisterOptions, ResponseError};
use runtime_glue::{ResponseService, Role};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use velo_faults::protocol::{Command, Event, Outcome, ReadMode, from_line};

use crate::service::{self, ItemIn, RoleArgs, emit};

/// Tries at registering after shutdown began, until one is refused.
const LATE_REGISTER_TRIES: u32 = 50;
/// Pause between those tries.
const LATE_REGISTER_PAUSE: Duration = Duration::from_millis(5);

/// Runs the frontend role until told to quit or its input ends.
pub(crate) async fn run(args: RoleArgs) -> Result<(), String> {
    let service = service::start(Role::Frontend, &args).await?;
    let addr = service
        .frontend()
        .map(response_plane::FrontendPlane::address);
    emit(&Event::Ready { addr });
    let mut kills: HashMap<u64, Signals> = HashMap::new();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match from_line::<Command>(&line) {
            Ok(Command::Open { sid, mode }) => open(&service, sid, mode, &mut kills),
            Ok(Command::Kill { sid }) => {
                if let Some(s) = kills.remove(&sid) {
                    s.kill.cancel();
                }
            }
            Ok(Command::Failed { sid }) => {
                if let Some(s) = kills.get(&sid) {
                    s.failed.cancel();
                }
            }
            Ok(Command::Shutdown) => {
                tokio::spawn(shut_down(service.clone()));
            }
            Ok(Command::Quit) => break,
            Ok(other) => eprintln!("frontend: not a frontend command: {other:?}"),
            Err(e) => eprintln!("frontend: bad command {line:?}: {e}"),
        }
    }
    Ok(())
}

/// What the harness can tell a stream's follower.
#[derive(Clone, Default)]
struct Signals {
    /// Drop the stream now.
    kill: CancellationToken,
    /// Its request failed on the worker: give up waiting for the prologue.
    failed: CancellationToken,
}

/// Registers stream `sid`, reports its connection info, and follows it in a task.
fn open(service: &ResponseService, sid: u64, mode: ReadMode, kills: &mut HashMap<u64, Signals>) {
    let registered = service
        .register::<ItemIn>(RegisterOptions::default())
        .map_err(|e| e.to_string())
        .and_then(|(info, pending)| {
            let info = serde_json::to_string(&info).map_err(|e| e.to_string())?;
            Ok((info, pending))
        });
    match registered {
        Err(e) => emit(&end(sid, Outcome::Setup(e), 0, 0)),
        Ok((info, pending)) => {
            emit(&Event::Info { sid, info });
            let signals = Signals::default();
            kills.insert(sid, signals.clone());
            tokio::spawn(follow(pending, sid, mode, signals));
        }
    }
}

/// Waits for the stream's prologue and reads it as `mode` says; reports its end once.
async fn follow(pending: PendingResponse<ItemIn>, sid: u64, mode: ReadMode, signals: Signals) {
    let Signals { kill, failed } = signals;
    if mode == ReadMode::Hold {
        kill.cancelled().await;
        drop(pending);
        return emit(&end(sid, Outcome::Killed, 0, 0));
    }
    // Cancel safety: dropping `established` drops the registration, which is what a kill
    // before the prologue means.
    let established = tokio::select! {
        r = pending.established() => r,
        () = kill.cancelled() => return emit(&end(sid, Outcome::Killed, 0, 0)),
        () = failed.cancelled() => {
            let why = "the request failed on the worker before its prologue".to_owned();
            return emit(&end(sid, Outcome::Setup(why), 0, 0));
        }
    };
    let mut rx = match established {
        Ok(rx) => rx,
        Err(e) => return emit(&end(sid, Outcome::Setup(e.to_string()), 0, 0)),
    };
    if mode == ReadMode::NoRead {
        kill.cancelled().await;
        rx.kill();
        return emit(&end(sid, Outcome::Killed, 0, 0));
    }
    let (outcome, items, itl_us) = read_all(&mut rx, &kill).await;
    emit(&end(sid, outcome, items, itl_us));
}

/// Reads until the stream ends or is killed: how it ended, the items received in order, and
/// the mean gap between them in microseconds.
async fn read_all(
    rx: &mut ResponseStream<ItemIn>,
    kill: &CancellationToken,
) -> (Outcome, u64, u64) {
    let (mut n, mut first, mut last) = (0u64, None::<Instant>, None::<Instant>);
    let mut ended: Option<Outcome> = None;
    loop {
        // Cancel safety: `next` on a response stream loses no item when dropped.
        let next = tokio::select! {
            item = rx.next() => item,
            () = kill.cancelled() => {
                rx.kill();
                ended = Some(Outcome::Killed);
                break;
            }
        };
        match next {
            None => break,
            Some(_) if ended.is_some() => {
                ended = Some(Outcome::Bad("something after the stream's end".into()));
                break;
            }
            Some(Err(e)) => ended = Some(Outcome::Error(e.to_string())),
            Some(Ok(item)) if item.seq != n => {
                ended = Some(Outcome::Bad(format!("item {} where {n} was due", item.seq)));
                rx.kill();
                break;
            }
            Some(Ok(_)) => {
                n += 1;
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
            }
        }
    }
    let itl_us = match (first, last) {
        (Some(f), Some(l)) if n > 1 => {
            u64::try_from((l - f).as_micros() / u128::from(n - 1)).unwrap_or(u64::MAX)
        }
        _ => 0,
    };
    (ended.unwrap_or(Outcome::Clean), n, itl_us)
}

/// Shuts the service down; reports that it began (and whether a registration right after
/// was refused) and how it ended.
async fn shut_down(service: ResponseService) {
    let started = Instant::now();
    let shutting = {
        let service = service.clone();
        tokio::spawn(async move { service.shutdown().await })
    };
    let mut late = String::from("accepted");
    for _ in 0..LATE_REGISTER_TRIES {
        tokio::time::sleep(LATE_REGISTER_PAUSE).await;
        match service.register::<ItemIn>(RegisterOptions::default()) {
            Ok(_) => continue,
            Err(ResponseError::Closed) => {
                late = "closed".into();
                break;
            }
            Err(e) => {
                late = e.to_string();
                break;
            }
        }
    }
    emit(&Event::ShutdownBegan {
        late_register: late,
    });
    let outcome = match shutting.await {
        Ok(report) => report.outcome().to_owned(),
        Err(e) => format!("shutdown task failed: {e}"),
    };
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    emit(&Event::ShutdownDone {
        outcome,
        elapsed_ms,
    });
}

fn end(sid: u64, outcome: Outcome, items: u64, itl_us: u64) -> Event {
    Event::End {
        sid,
        outcome,
        items,
        itl_us,
    }
}
