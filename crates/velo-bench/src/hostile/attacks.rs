//! The attacks, each against the running target while the legitimate load goes on.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use velo_wire::{Batch, Frame, Record, StreamId, Token};

use super::raw::{self, describe, frames, tally};
use super::{INSIDER_INSTANCE, LEGIT_INSTANCE, Target, stats};

/// One attack of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    /// Connections sending random bytes (inside TLS).
    RandomBytes,
    /// A HELLO without the cluster secret's nonce.
    NoSecret,
    /// A HELLO with a nonce, answered with a forged proof.
    WrongSecret,
    /// A plaintext velo HELLO to the TLS listener.
    PlaintextToTls,
    /// A TLS worker to a plaintext listener.
    TlsToPlaintext,
    /// Connections that connect and say nothing, from 16 addresses.
    Silent,
    /// HELLOs sent a byte at a time, after TLS.
    Slowloris,
    /// An insider (it holds the secret) opening a stream tied to another worker, with the
    /// right token.
    WrongWorker,
    /// An insider opening streams with unknown tickets as fast as it can.
    OpenFlood,
    /// A HELLO asking for 1 ms heartbeats.
    TinyIdle,
    /// An insider's OPEN with a 1 MiB prologue.
    BigPrologue,
    /// An insider's frame header announcing 64 MiB.
    BigFrame,
}

impl Attack {
    /// Every attack, in table order.
    pub const ALL: [Self; 12] = [
        Self::RandomBytes,
        Self::NoSecret,
        Self::WrongSecret,
        Self::PlaintextToTls,
        Self::TlsToPlaintext,
        Self::Silent,
        Self::Slowloris,
        Self::WrongWorker,
        Self::OpenFlood,
        Self::TinyIdle,
        Self::BigPrologue,
        Self::BigFrame,
    ];

    /// Its row's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::RandomBytes => "random bytes (in TLS)",
            Self::NoSecret => "HELLO without the secret",
            Self::WrongSecret => "HELLO with a wrong secret",
            Self::PlaintextToTls => "plaintext client to TLS listener",
            Self::TlsToPlaintext => "TLS client to plaintext listener",
            Self::Silent => "silent connections",
            Self::Slowloris => "slowloris HELLO",
            Self::WrongWorker => "valid-token OPEN from another worker",
            Self::OpenFlood => "OPEN/CANCEL flood",
            Self::TinyIdle => "HELLO asking 1 ms heartbeats",
            Self::BigPrologue => "1 MiB prologue",
            Self::BigFrame => "64 MiB frame header",
        }
    }

    /// Runs the attack for about the target's window; returns what the frontend did.
    pub(super) async fn run(self, t: &Target) -> String {
        let started = tokio::time::Instant::now();
        let outcome = match self {
            Self::RandomBytes => probes(t, source(1), |_| Probe::Random).await,
            Self::NoSecret => probes(t, source(2), |_| Probe::NoSecret).await,
            Self::WrongSecret => probes(t, source(3), |_| Probe::WrongSecret).await,
            Self::PlaintextToTls => probes(t, source(4), |_| Probe::Plaintext).await,
            Self::TlsToPlaintext => tls_to_plaintext(t).await,
            Self::Silent => silent(t).await,
            Self::Slowloris => probes(t, source(6), |_| Probe::Slowloris).await,
            Self::WrongWorker => wrong_worker(t).await,
            Self::OpenFlood => open_flood(t).await,
            Self::TinyIdle => probes(t, source(7), |_| Probe::TinyIdle).await,
            Self::BigPrologue => big_prologue(t).await,
            Self::BigFrame => big_frame(t).await,
        };
        // The legitimate load runs for the whole window either way.
        tokio::time::sleep_until(started + t.scale.window).await;
        outcome
    }
}

/// Loopback source address `n` for attackers (the legitimate worker is 127.0.0.1).
fn source(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 10u8.saturating_add(n)))
}

#[derive(Debug, Clone, Copy)]
enum Probe {
    Random,
    NoSecret,
    WrongSecret,
    Plaintext,
    Slowloris,
    TinyIdle,
}

/// `t.scale.probes` connections (or `slowloris`) of one kind, at once; their outcomes tallied.
async fn probes(t: &Target, from: IpAddr, kind: impl Fn(usize) -> Probe) -> String {
    let to = t.frontend.address();
    let n = match kind(0) {
        Probe::Slowloris => t.scale.slowloris,
        _ => t.scale.probes,
    };
    let ca = Arc::new(t.ca());
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (probe, ca) = (kind(i), ca.clone());
            tokio::spawn(async move { probe_one(probe, from, to, &ca).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap_or_else(|e| format!("panicked: {e}")));
    }
    tally(outcomes)
}

async fn probe_one(probe: Probe, from: IpAddr, to: SocketAddr, ca: &std::path::Path) -> String {
    let tcp = match raw::tcp(from, to).await {
        Ok(s) => s,
        Err(e) => return format!("connect failed ({})", e.kind()),
    };
    if let Probe::Plaintext = probe {
        let mut tcp = tcp;
        let hello = raw::bytes(&Frame::Hello(raw::hello(None, 10_000)));
        return describe(&raw::send_and_wait(&mut tcp, &hello).await);
    }
    let mut s = match raw::tls(tcp, ca).await {
        Ok(s) => s,
        Err(e) => return format!("TLS failed ({})", e.kind()),
    };
    let got = match probe {
        Probe::Random => {
            let junk: Vec<u8> = (0..4096).map(|_| rand::random::<u8>()).collect();
            raw::send_and_wait(&mut s, &junk).await
        }
        Probe::NoSecret => {
            let hello = raw::bytes(&Frame::Hello(raw::hello(None, 10_000)));
            raw::send_and_wait(&mut s, &hello).await
        }
        Probe::TinyIdle => {
            let hello = raw::hello(Some(rand::random::<[u8; 32]>()), 1);
            raw::send_and_wait(&mut s, &raw::bytes(&Frame::Hello(hello))).await
        }
        Probe::WrongSecret => {
            let hello = raw::hello(Some(rand::random::<[u8; 32]>()), 10_000);
            let _ = s.write_all(&raw::bytes(&Frame::Hello(hello))).await;
            let answer = frames(&mut s, 2).await;
            let forged = Frame::Auth(velo_wire::Auth {
                mac: rand::random(),
            });
            let mut got = raw::send_and_wait(&mut s, &raw::bytes(&forged)).await;
            got.splice(0..0, answer);
            got
        }
        Probe::Slowloris => slowloris(s).await,
        Probe::Plaintext => unreachable!("handled above"),
    };
    describe(&got)
}

/// Sends a valid HELLO a byte every 250 ms, reading meanwhile.
async fn slowloris<S>(s: S) -> Vec<Frame>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut r, mut w) = tokio::io::split(s);
    let hello = raw::bytes(&Frame::Hello(raw::hello(Some(rand::random()), 10_000)));
    let dribble = tokio::spawn(async move {
        for b in hello {
            if w.write_all(&[b]).await.is_err() || w.flush().await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    let got = frames(&mut r, 4).await;
    dribble.abort();
    got
}

/// Silent connections from 16 addresses, held for the window; each one's fate tallied.
async fn silent(t: &Target) -> String {
    let to = t.frontend.address();
    let n = t.scale.silent;
    let per_source = n.div_ceil(16);
    let mut conns = Vec::with_capacity(n);
    for chunk in 0..n.div_ceil(256) {
        let batch = (chunk * 256..((chunk + 1) * 256).min(n)).map(|i| {
            let from = source(20 + u8::try_from(i / per_source).unwrap_or(0));
            raw::tcp(from, to)
        });
        for c in futures::future::join_all(batch).await {
            conns.extend(c.ok());
        }
    }
    let connected = conns.len();
    let fates: Vec<_> = conns
        .into_iter()
        .map(|mut c| tokio::spawn(async move { describe(&frames(&mut c, 1).await) }))
        .collect();
    let mut outcomes = Vec::new();
    for f in fates {
        outcomes.push(f.await.unwrap_or_default());
    }
    format!("{connected} connected: {}", tally(outcomes))
}

async fn tls_to_plaintext(t: &Target) -> String {
    let worker = t.insider(INSIDER_INSTANCE);
    let mut outcomes = Vec::new();
    for _ in 0..t.scale.probes.min(16) {
        let Ok((info, _pending)) = t.plain.register::<u32>(Default::default()) else {
            continue;
        };
        outcomes.push(match worker.connect::<u32>(&info).await {
            Ok(_) => "served".to_owned(),
            Err(e) if e.to_string().contains("plaintext velo CLOSE") => {
                "refused (worker: frontend answered in plaintext)".to_owned()
            }
            Err(e) => format!("refused ({e})"),
        });
    }
    worker.close();
    tally(outcomes)
}

async fn wrong_worker(t: &Target) -> String {
    let insider = t.insider(INSIDER_INSTANCE);
    let before = stats(&t.frontend).arrivals_wrong_worker;
    let mut pendings = Vec::new();
    for _ in 0..t.scale.probes {
        let Ok((info, pending)) = t.frontend.register::<u32>(Default::default()) else {
            continue;
        };
        if pending.associate(LEGIT_INSTANCE).is_err() {
            continue;
        }
        if let Ok(mut s) = insider.connect::<u32>(&info).await {
            let _ = s.send_prologue(Ok(())).await;
        }
        pendings.push(pending);
    }
    let deadline = tokio::time::Instant::now() + raw::ANSWER_WITHIN;
    let want = before + pendings.len() as u64;
    while stats(&t.frontend).arrivals_wrong_worker < want && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let refused = stats(&t.frontend).arrivals_wrong_worker - before;
    insider.close();
    format!(
        "refused (CANCEL refused) x{refused} of {}; registrations kept waiting",
        pendings.len()
    )
}

async fn open_flood(t: &Target) -> String {
    let Ok((info, _pending)) = t.frontend.register::<u32>(Default::default()) else {
        return "could not register".to_owned();
    };
    let instance = serde_json::from_str::<serde_json::Value>(&info.info)
        .ok()
        .and_then(|v| v.get("instance")?.as_str().map(str::to_owned))
        .and_then(|s| u128::from_str_radix(&s, 16).ok())
        .map(velo_wire::InstanceId::from_u128);
    let Some(instance) = instance else {
        return "no frontend instance in the address".to_owned();
    };
    let tls = velo_tls::ClientTls::new(
        velo_tls::Trust::Ca(t.ca()),
        None,
        None,
        velo_tls::DEFAULT_HANDSHAKE_TIMEOUT,
    )
    .expect("the run's CA loads");
    let session = velo_session::SessionSettings::builder()
        .secret(Some(t.secret()))
        .worker_instance(Some(INSIDER_INSTANCE))
        .build()
        .expect("valid");
    let cfg = velo_tcp::TcpConfig::builder()
        .tls_client(Some(Arc::new(tls)))
        .session(session)
        .build()
        .expect("valid");
    let mux = velo_mux::MuxConfig::builder(velo_mux::Side::Worker)
        .build()
        .expect("valid");
    let worker = velo_tcp::TcpWorker::new(mux, cfg, t.tracker.clone());
    let before = stats(&t.frontend).mux;
    let (mut opened, mut failed_at) = (0u64, None);
    for i in 0..20_000u64 {
        let (ticket, token) = (rand::random::<u64>() | 1, Token(rand::random()));
        let open = worker
            .endpoint()
            .open(t.frontend.address(), instance, ticket, &token, b"{}");
        match open.await {
            Ok(s) => {
                opened += 1;
                // Dropped unfinished: reset at once, the other half of "open and cancel".
                drop(s);
            }
            Err(e) => {
                failed_at = Some((i, e.to_string()));
                break;
            }
        }
    }
    // OPENs go out without a round trip: the frontend may still be reading them.
    let deadline = tokio::time::Instant::now() + raw::ANSWER_WITHIN;
    while stats(&t.frontend).mux.churn_closes == before.churn_closes
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = stats(&t.frontend).mux;
    worker.abort();
    let closes = after.churn_closes - before.churn_closes;
    let refused = after.churn - before.churn;
    match failed_at {
        _ if closes > 0 => format!(
            "closed (churn_limit) x{closes} lanes after {refused} refused OPENs; {opened} sent"
        ),
        Some((i, e)) => format!("opens failed after {i}: {e}"),
        None => format!("not closed after {opened} OPENs"),
    }
}

async fn big_prologue(t: &Target) -> String {
    let lane = raw::insider_lane(source(8), t.frontend.address(), &t.ca(), &t.secret()).await;
    let Ok(mut s) = lane else {
        return "handshake failed".to_owned();
    };
    let open = Record::Open {
        stream: StreamId::new(0, 0),
        ticket: 1,
        token: Token([0; 16]),
        prologue: Bytes::from(vec![b' '; 1 << 20]),
    };
    let got = raw::send_and_wait(
        &mut s,
        &raw::bytes(&Frame::Batch(Batch::from_records(&[open]))),
    )
    .await;
    let cancel = got.iter().find_map(|f| match f {
        Frame::Batch(b) => b.records().find_map(|r| match r {
            Ok(Record::Cancel { code, .. }) => Some(code),
            _ => None,
        }),
        _ => None,
    });
    match cancel {
        Some(code) => format!("stream refused (CANCEL {code}), no stream state kept"),
        None => describe(&got),
    }
}

async fn big_frame(t: &Target) -> String {
    let lane = raw::insider_lane(source(9), t.frontend.address(), &t.ca(), &t.secret()).await;
    let Ok(mut s) = lane else {
        return "handshake failed".to_owned();
    };
    let header = velo_wire::frame_header(velo_wire::FrameKind::Batch, 64 << 20);
    describe(&raw::send_and_wait(&mut s, &header).await)
}
