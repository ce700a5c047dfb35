//! TCP lanes over loopback: records per second, TCP segments per record (`/proc/net/snmp`
//! OutSegs, both directions) and CPU per record of each side, for 1 and 1,024 concurrent
//! streams of 100-byte items, with 1 and 4 lanes, under the 5 ms and the greedy flush policy.
//!
//! The frontend and the worker each run on their own single-threaded runtime (their own OS
//! thread), as two processes would. Producers send as fast as credit allows.
//!
//! `cargo bench -p velo-tcp --bench tcp [-- --secs N]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::task::TaskTracker;
use velo_mux::{FlushPolicy, MuxConfig, Side};
use velo_session::{Acceptor, IncomingStream};
use velo_tcp::{TcpConfig, TcpFrontend, TcpWorker};
use velo_wire::Token;

const ITEM: [u8; 100] = [7; 100];

struct Counting(Arc<AtomicU64>);

impl Acceptor for Counting {
    fn accept(&self, incoming: IncomingStream) {
        let mut stream = incoming.accept();
        let delivered = self.0.clone();
        tokio::spawn(async move {
            while let Some(Ok(_)) = stream.recv().await {
                delivered.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

/// Total OutSegs of the host's TCP stack.
fn out_segs() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (Some(names), Some(values)) = (tcp.next(), tcp.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "OutSegs")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) of thread `tid` of this process, in seconds.
fn thread_cpu(tid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the ")".
    (ticks(11) + ticks(12)) / 100.0
}

fn current_tid() -> String {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

struct Outcome {
    records_per_s: f64,
    segs_per_record: f64,
    frontend_ns_per_record: f64,
    worker_ns_per_record: f64,
    records_per_batch: f64,
}

fn run(
    streams: u64,
    lanes: u16,
    policy: FlushPolicy,
    warmup: Duration,
    measure: Duration,
) -> Outcome {
    let delivered = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (ftid_tx, ftid_rx) = std::sync::mpsc::channel();
    let (wtid_tx, wtid_rx) = std::sync::mpsc::channel();
    let (stats_tx, stats_rx) = std::sync::mpsc::channel();
    let frontend = {
        let (delivered, stop) = (delivered.clone(), stop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                ftid_tx.send(current_tid()).unwrap();
                let tracker = TaskTracker::new();
                let mux = MuxConfig::builder(Side::Frontend).build().unwrap();
                let f = TcpFrontend::bind(
                    "127.0.0.1:0".parse().unwrap(),
                    mux,
                    TcpConfig::default(),
                    Arc::new(Counting(delivered)),
                    tracker.clone(),
                )
                .await
                .unwrap();
                addr_tx.send((f.local_addr(), f.instance())).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                f.abort();
            });
        })
    };
    let (addr, id) = addr_rx.recv().unwrap();
    let worker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                wtid_tx.send(current_tid()).unwrap();
                let tracker = TaskTracker::new();
                let mux = MuxConfig::builder(Side::Worker)
                    .lanes(lanes)
                    .flush(policy)
                    .build()
                    .unwrap();
                let w = TcpWorker::new(mux, TcpConfig::default(), tracker.clone());
                let mut tasks = Vec::new();
                for t in 0..streams {
                    let mut s = w
                        .endpoint()
                        .open(addr, id, t, &Token([0; 16]), b"{\"error\":null}")
                        .await
                        .unwrap();
                    let stop = stop.clone();
                    tasks.push(tokio::spawn(async move {
                        while !stop.load(Ordering::Relaxed) {
                            if s.send(&ITEM).await.is_err() {
                                break;
                            }
                        }
                    }));
                }
                let peer = w.endpoint().peers().pop();
                for t in tasks {
                    let _ = t.await;
                }
                stats_tx.send(peer.map(|p| p.stats())).unwrap();
                w.endpoint().abort();
            });
        })
    };
    let (ftid, wtid) = (ftid_rx.recv().unwrap(), wtid_rx.recv().unwrap());
    std::thread::sleep(warmup);
    let (r0, s0, f0, w0, t0) = (
        delivered.load(Ordering::Relaxed),
        out_segs(),
        thread_cpu(&ftid),
        thread_cpu(&wtid),
        Instant::now(),
    );
    std::thread::sleep(measure);
    let (r1, s1, f1, w1, t1) = (
        delivered.load(Ordering::Relaxed),
        out_segs(),
        thread_cpu(&ftid),
        thread_cpu(&wtid),
        Instant::now(),
    );
    stop.store(true, Ordering::Relaxed);
    let stats = stats_rx
        .recv_timeout(Duration::from_secs(30))
        .ok()
        .flatten();
    worker.join().unwrap();
    frontend.join().unwrap();
    let records = (r1 - r0) as f64;
    let per = |cpu: f64| cpu * 1e9 / records.max(1.0);
    Outcome {
        records_per_s: records / (t1 - t0).as_secs_f64(),
        segs_per_record: (s1 - s0) as f64 / records.max(1.0),
        frontend_ns_per_record: per(f1 - f0),
        worker_ns_per_record: per(w1 - w0),
        records_per_batch: stats.map_or(0.0, |s| {
            s.records_sent as f64 / s.batches_sent.max(1) as f64
        }),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs = args
        .iter()
        .position(|a| a == "--secs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    // `cargo test --benches` runs benches with `--bench`-less args; keep that quick.
    let quick = !args.iter().any(|a| a == "--bench");
    let (warmup, measure) = if quick {
        (Duration::from_millis(100), Duration::from_millis(300))
    } else {
        (Duration::from_millis(700), Duration::from_secs_f64(secs))
    };
    println!(
        "| streams | lanes | flush | records/s | TCP segs/record | frontend ns/record | worker ns/record | records/batch |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|");
    for streams in [1u64, 1024] {
        for lanes in [1u16, 4] {
            for (name, policy) in [
                ("5 ms", FlushPolicy::default()),
                ("greedy", FlushPolicy::greedy()),
            ] {
                let o = run(streams, lanes, policy, warmup, measure);
                println!(
                    "| {streams} | {lanes} | {name} | {:.0} | {:.3} | {:.0} | {:.0} | {:.1} |",
                    o.records_per_s,
                    o.segs_per_record,
                    o.frontend_ns_per_record,
                    o.worker_ns_per_record,
                    o.records_per_batch
                );
            }
        }
    }
}
