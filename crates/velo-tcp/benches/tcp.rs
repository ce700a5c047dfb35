//! TCP lanes over loopback: records per second, TCP segments per record (`/proc/net/snmp`
//! OutSegs, both directions) and CPU per record of each side, for 1 and 1,024 concurrent
//! streams of 100-byte items, with 1 and 4 lanes, under the 5 ms and the greedy flush policy.
//!
//! The frontend and the worker each run on their own single-threaded runtime (their own OS
//! thread), as two processes would. Producers send as fast as credit allows.
//!
//! `cargo bench -p velo-tcp --bench tcp [-- --secs N]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::task::TaskTracker;
use velo_mux::{FlushPolicy, MuxConfig, Side};
use velo_session::FrontendParts;
use velo_session::bench::{self, EachItem, Stop, ThreadCpu, Timing};
use velo_tcp::{TcpConfig, TcpWorker};
use velo_wire::Token;

const ITEM: [u8; 100] = [7; 100];

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

struct Outcome {
    records_per_s: f64,
    segs_per_record: f64,
    frontend_ns_per_record: f64,
    worker_ns_per_record: f64,
    records_per_batch: f64,
}

fn run(streams: u64, lanes: u16, policy: FlushPolicy, timing: Timing) -> Outcome {
    let delivered = Arc::new(AtomicU64::new(0));
    let stop = Stop::default();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (ftid_tx, ftid_rx) = std::sync::mpsc::channel();
    let (wtid_tx, wtid_rx) = std::sync::mpsc::channel();
    let (stats_tx, stats_rx) = std::sync::mpsc::channel();
    let frontend = {
        let (delivered, stop) = (delivered.clone(), stop.clone());
        bench::spawn_side(move || async move {
            ftid_tx.send(ThreadCpu::current()).unwrap();
            let tracker = TaskTracker::new();
            let mux = MuxConfig::builder(Side::Frontend).build().unwrap();
            let acceptor = EachItem(move |_: &[u8]| {
                delivered.fetch_add(1, Ordering::Relaxed);
            });
            let parts = FrontendParts::new(mux, Arc::new(acceptor), tracker.clone());
            let addr = "127.0.0.1:0".parse().unwrap();
            let f = velo_tcp::bind_frontend(addr, TcpConfig::default(), parts)
                .await
                .unwrap();
            addr_tx.send((f.local_addr(), f.instance())).unwrap();
            stop.wait().await;
            f.abort();
        })
    };
    let (addr, id) = addr_rx.recv().unwrap();
    let worker = {
        let stop = stop.clone();
        bench::spawn_side(move || async move {
            wtid_tx.send(ThreadCpu::current()).unwrap();
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
                    while !stop.is_set() {
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
        })
    };
    let (ftid, wtid) = (ftid_rx.recv().unwrap(), wtid_rx.recv().unwrap());
    timing.warm_up();
    let w = timing.window(|| {
        (
            delivered.load(Ordering::Relaxed),
            out_segs(),
            ftid.seconds(),
            wtid.seconds(),
        )
    });
    stop.set();
    let stats = stats_rx
        .recv_timeout(Duration::from_secs(30))
        .ok()
        .flatten();
    worker.join().unwrap();
    frontend.join().unwrap();
    let ((r0, s0, f0, w0), (r1, s1, f1, w1)) = (w.start, w.end);
    let records = (r1 - r0) as f64;
    let per = |cpu: f64| cpu * 1e9 / records.max(1.0);
    Outcome {
        records_per_s: records / w.elapsed.as_secs_f64(),
        segs_per_record: (s1 - s0) as f64 / records.max(1.0),
        frontend_ns_per_record: per(f1 - f0),
        worker_ns_per_record: per(w1 - w0),
        records_per_batch: stats.map_or(0.0, |s| {
            s.records_sent as f64 / s.batches_sent.max(1) as f64
        }),
    }
}

fn main() {
    let timing = Timing::from_args();
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
                let o = run(streams, lanes, policy, timing);
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
