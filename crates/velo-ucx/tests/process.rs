//! Scenarios that need a process of their own: a worker process killed mid-stream, a frontend
//! restarted on the same port (the contract's story), and an idle transport's CPU time. The test binary re-runs itself as the helper process
//! (an ignored test that does nothing unless started by its parent). Every wait is bounded.

#![cfg(feature = "ucx")]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Ucx;
use tokio_util::task::TaskTracker;
use velo_mux::StreamEnd;
use velo_session::contract::{
    self, Frontend, PROLOGUE, TOKEN, Worker, eventually, next_item, send_now, take, within,
};
use velo_wire::InstanceId;
/// Selects what the helper process does.
const HELPER: &str = "VELO_UCX_TEST_HELPER";
/// The frontend the helper worker streams to: `addr instance`.
const HELPER_TARGET: &str = "VELO_UCX_TEST_TARGET";
/// Streams the helper worker opens.
const STREAMS: u64 = 8;

/// Runs this test binary's ignored test `name` as a child process with `env`.
fn helper(name: &str, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--include-ignored", "--nocapture"])
        .env(HELPER, name)
        .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn the helper process")
}

/// Runs this test binary's ignored test `name` as a child process with `env` to its end
/// (bounded), and fails unless it succeeded.
async fn run_helper(name: &str, env: &[(&str, String)]) {
    let mut child = helper(name, env);
    let status = within(name, tokio::task::spawn_blocking(move || child.wait()))
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "the helper process {name} failed: {status}"
    );
}

/// Waits (bounded) for the child to print `READY`.
async fn ready(child: &mut Child) {
    let out = child.stdout.take().unwrap();
    within(
        "helper ready",
        tokio::task::spawn_blocking(move || {
            for line in BufReader::new(out).lines() {
                if line.unwrap_or_default().trim() == "READY" {
                    return;
                }
            }
            panic!("the helper exited before it was ready");
        }),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_killed_mid_stream_ends_its_streams_as_lost_once() {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = contract::frontend(&Ucx::default(), &tracker).await;
    let target = format!("{} {}", frontend.addr(), frontend.instance());
    let mut child = helper("streaming_worker_process", &[(HELPER_TARGET, target)]);
    ready(&mut child).await;
    let mut receivers = Vec::new();
    for _ in 0..STREAMS {
        let mut r = take(&mut inbox).await;
        assert_eq!(next_item(&mut r).await, &b"first"[..]);
        receivers.push(r);
    }
    // Mid-stream: items keep coming until the process dies.
    child.kill().expect("SIGKILL the worker process");
    let _ = child.wait();
    for mut r in receivers {
        let end = within("end", async {
            loop {
                match r.recv().await {
                    Some(Ok(_)) => continue,
                    other => break other,
                }
            }
        })
        .await;
        assert!(matches!(end, Some(Err(StreamEnd::Lost(_)))), "{end:?}");
        assert_eq!(within("then nothing", r.recv()).await, None, "ends once");
    }
    // The driver may fail the lanes (a send failing) before it counts the endpoint errors.
    eventually("an endpoint error is counted", || {
        frontend.transport().stats().endpoint_errors >= 1
    })
    .await;
}

/// The worker process of the test above: opens streams, sends one item on each, says READY,
/// then keeps sending until it is killed (or 30 s pass).
#[test]
#[ignore = "helper process of a_worker_process_killed_mid_stream_ends_its_streams_as_lost_once"]
fn streaming_worker_process() {
    if std::env::var(HELPER).as_deref() != Ok("streaming_worker_process") {
        return;
    }
    let target = std::env::var(HELPER_TARGET).unwrap();
    let (addr, instance) = target.split_once(' ').unwrap();
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let instance = InstanceId::from_u128(u128::from_str_radix(instance, 16).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let tracker = TaskTracker::new();
        let worker = contract::worker(&Ucx::default(), &tracker);
        let mut streams = Vec::new();
        for t in 0..STREAMS {
            let open = worker.endpoint().open(addr, instance, t, &TOKEN, PROLOGUE);
            let mut s = within("opening", open).await.unwrap();
            s.send(b"first").await.unwrap();
            streams.push(s);
        }
        worker.endpoint().flush();
        println!("READY");
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            for s in &mut streams {
                let _ = s.try_send(b"more");
            }
            worker.endpoint().flush();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_restarted_under_a_new_instance_id_is_prepared_again() {
    // The contract's story (left out of `contract.rs`): UCX reads its connection managers'
    // settings only from the environment, so rebinding the port of the frontend that just
    // died (its connections in TIME_WAIT) needs UCX_TCP_CM_REUSEADDR=y in the process: the
    // story runs in a process of its own.
    let reuse = [("UCX_TCP_CM_REUSEADDR", "y".to_owned())];
    run_helper("restart_scenario", &reuse).await;
}

#[test]
#[ignore = "helper process of a_frontend_restarted_under_a_new_instance_id_is_prepared_again"]
fn restart_scenario() {
    if std::env::var(HELPER).as_deref() != Ok("restart_scenario") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(
        contract::a_frontend_restarted_under_a_new_instance_id_is_prepared_again(Ucx::default()),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transports_in_the_environment_without_a_network_transport_are_a_startup_error() {
    // A configured list is refused when the configuration is built; the environment's
    // `UCX_TLS` only when UCX starts, in a process whose environment says so.
    let no_network = [("UCX_TLS", "sm,self".to_owned())];
    run_helper("no_network_transport", &no_network).await;
}

#[test]
#[ignore = "helper process of transports_in_the_environment_without_a_network_transport_are_a_startup_error"]
fn no_network_transport() {
    if std::env::var(HELPER).as_deref() != Ok("no_network_transport") {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mux = velo_mux::MuxConfig::builder(velo_mux::Side::Worker)
        .build()
        .unwrap();
    let err = velo_ucx::UcxWorker::new(mux, velo_ucx::UcxConfig::default(), TaskTracker::new())
        .err()
        .expect("refused");
    assert!(
        matches!(&err, velo_ucx::UcxError::Transports { tls } if tls == "sm,self"),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("UCX initialisation failed: UCX_TLS=sm,self names no network transport"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_transport_burns_no_cpu() {
    // In a process of its own, so the CPU time measured is only the idle transport's: every
    // thread (both drivers, UCX's own threads) while a connection is up and nothing flows,
    // with each progress engine.
    run_helper("idle_process", &[]).await;
}

/// How long each engine idles (at least: the window is measured).
const IDLE_WINDOW: Duration = Duration::from_millis(1500);
/// Idle budget, as a share of the measured window (a whole core is 1.0): timers and UCX's
/// keepalive cost well under 0.1%; a busy-polling engine burns about a whole core, and still
/// a large share of one on a loaded machine.
const IDLE_CPU_SHARE: f64 = 0.03;
/// How long the transport's counters must stay unchanged before the window starts.
const SETTLED_FOR: Duration = Duration::from_millis(100);

#[test]
#[ignore = "helper process of an_idle_transport_burns_no_cpu"]
fn idle_process() {
    if std::env::var(HELPER).as_deref() != Ok("idle_process") {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for engine in [
        velo_ucx::ProgressEngine::Task,
        velo_ucx::ProgressEngine::Thread,
    ] {
        rt.block_on(idle_window(engine));
    }
}

async fn idle_window(engine: velo_ucx::ProgressEngine) {
    let tracker = TaskTracker::new();
    let net = Ucx {
        cfg: velo_ucx::UcxConfig::loopback()
            .to_builder()
            .engine(engine)
            .build()
            .unwrap(),
    };
    let (frontend, mut inbox) = contract::frontend(&net, &tracker).await;
    let worker = contract::worker(&net, &tracker);
    let mut s = contract::open(&worker, &frontend, 1).await;
    send_now(&mut s, b"x").await;
    let mut r = take(&mut inbox).await;
    assert_eq!(next_item(&mut r).await, &b"x"[..]);
    // Set-up done: every lane attached, and nothing moving (messages, engine wakeups, mux
    // records) for a while.
    let counters = || {
        (
            frontend.handshake_stats(),
            worker.endpoint().handshake_stats(),
            frontend.endpoint().stats(),
            frontend.transport().stats(),
            worker.0.stats(),
        )
    };
    within("the transport settles", async {
        let mut last = counters();
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let now = counters();
            if now != last {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() >= SETTLED_FOR && now.0.lanes_accepted == now.1.lanes_dialed {
                break;
            }
        }
    })
    .await;
    let (before, started) = (cpu_time(), Instant::now());
    tokio::time::sleep(IDLE_WINDOW).await;
    let (used, window) = (cpu_time() - before, started.elapsed());
    let share = used.as_secs_f64() / window.as_secs_f64();
    println!(
        "{engine:?} engine idle for {window:?} with a connection up: {used:?} of CPU (all threads), {:.2}% of a core",
        share * 100.0
    );
    assert!(
        share < IDLE_CPU_SHARE,
        "{engine:?} engine: {used:?} of CPU over {window:?} while idle ({:.1}% of a core, budget {:.1}%): is it polling?",
        share * 100.0,
        IDLE_CPU_SHARE * 100.0
    );
    assert!(
        worker
            .endpoint()
            .peers()
            .pop()
            .is_some_and(|p| p.is_alive())
    );
    frontend.abort();
    worker.0.abort();
    // The drivers (a task, or a thread the tracker accounts for) tear UCX down: they must be
    // done before the next engine's UCX is made or the process exits. Not waiting, UCX's
    // teardown raced the next setup or the exit under load (its own assertions, `async.c`,
    // `vfs_obj.c`, and heap corruption: 1 in 8 to 1 in 30 runs beside two busy loops).
    tracker.close();
    within("the transport's tasks ending", tracker.wait()).await;
}

/// User plus system CPU time of this process (every thread).
fn cpu_time() -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct we own; RUSAGE_SELF is always valid.
    let ru = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()), 0);
        ru.assume_init()
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap())
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap())
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
