//! Faults for the soak (`--faults`): a `velo-faults proxy` process sits between the worker
//! and the frontend for a share of the streams, and a thread injects a random fault every
//! few seconds: a reset of every proxied connection, a cut after a random number of bytes, a
//! stall of up to a few seconds (longer than the idle timeout or not), or the proxy killed
//! with SIGKILL and restarted on a new port. Each fault is recorded as a window; a proxied
//! stream whose life overlaps a window (plus [`SETTLE`]) counts as faulted: it must still end
//! exactly once, but may end early. Every other stream is held to the soak's usual oracle.
//!
//! The proxy is a separate process, so runtime-glue does not depend on the crate above it.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use response_plane::ConnectionInfo;

/// The plane's idle timeout while faults are injected: 2 s, so stalls of up to
/// [`MAX_STALL_MS`] sometimes outlast it and sometimes do not.
pub(crate) const FAULT_IDLE: Duration = Duration::from_secs(2);
/// How long after a fault a stream may still feel it: detection (the idle timeout), the
/// lane's close grace and a reconnection's backoff.
const SETTLE: Duration = Duration::from_secs(5);
/// Pause between faults: 2 to 5 s.
const GAP_MS: (u64, u64) = (2_000, 5_000);
/// Longest stall, ms.
const MAX_STALL_MS: u64 = 3_000;
/// How long a reset or a cut stays in force before the proxy passes again.
const FLASH: Duration = Duration::from_millis(100);
/// Largest cut, bytes.
const MAX_CUT: u64 = 64 * 1024;
/// Fault windows kept: older ones no longer overlap any running stream.
const MAX_WINDOWS: usize = 4096;

/// Kinds of fault, for the summary.
pub(crate) const KINDS: [&str; 4] = ["reset", "cut", "stall", "proxy_restart"];

/// The running injector.
pub(crate) struct Faults {
    state: Arc<State>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct State {
    proxy_addr: Mutex<Option<SocketAddr>>,
    /// (start, end) of each fault; `None` while it lasts.
    windows: Mutex<VecDeque<(Instant, Option<Instant>)>>,
    counts: [AtomicU64; 4],
}

impl Faults {
    /// Starts the proxy (`proxy_bin proxy --upstream <frontend>`) and the injector thread,
    /// which injects until `deadline`.
    pub(crate) fn start(
        proxy_bin: &str,
        frontend: SocketAddr,
        kinds: Vec<usize>,
        seed: u64,
        deadline: Instant,
    ) -> Result<Self, String> {
        let (proxy, addr) = Proxy::spawn(proxy_bin, frontend)?;
        let state = Arc::new(State {
            proxy_addr: Mutex::new(Some(addr)),
            windows: Mutex::new(VecDeque::new()),
            counts: Default::default(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop, bin) = (state.clone(), stop.clone(), proxy_bin.to_owned());
            let plan = Plan {
                kinds,
                seed,
                deadline,
            };
            std::thread::spawn(move || inject(&state, proxy, &bin, frontend, &plan, &stop))
        };
        Ok(Self {
            state,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// `info` pointed at the proxy (unchanged if the proxy is between restarts).
    pub(crate) fn via_proxy(&self, info: &ConnectionInfo) -> ConnectionInfo {
        let addr = *lock(&self.state.proxy_addr);
        addr.and_then(|a| rewrite_addr(info, a))
            .unwrap_or_else(|| info.clone())
    }

    /// Whether a fault overlapped `[start, end]` (each fault counting until [`SETTLE`] after
    /// it ended).
    pub(crate) fn overlaps(&self, start: Instant, end: Instant) -> bool {
        lock(&self.state.windows)
            .iter()
            .any(|&(from, to)| from <= end && to.is_none_or(|to| to + SETTLE >= start))
    }

    /// Stops injecting, lets the proxy pass again and stops it; returns the fault counts.
    pub(crate) fn stop(&self) -> [u64; 4] {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        std::array::from_fn(|i| self.state.counts[i].load(Ordering::Relaxed))
    }
}

/// What the injector does: which kinds of fault (indexes into [`KINDS`]), from what seed,
/// until when.
struct Plan {
    kinds: Vec<usize>,
    seed: u64,
    deadline: Instant,
}

/// Indexes into [`KINDS`] of the comma-separated names in `list` (`all`: every kind).
pub(crate) fn parse_kinds(list: &str) -> Result<Vec<usize>, String> {
    if list == "all" {
        return Ok((0..KINDS.len()).collect());
    }
    list.split(',')
        .map(|k| {
            KINDS
                .iter()
                .position(|n| *n == k.trim())
                .ok_or_else(|| format!("unknown fault `{k}` ({})", KINDS.join(", ")))
        })
        .collect()
}

/// The injector: a random fault every [`GAP_MS`], until the deadline or `stop`.
fn inject(
    state: &State,
    mut proxy: Proxy,
    bin: &str,
    frontend: SocketAddr,
    plan: &Plan,
    stop: &AtomicBool,
) {
    let (mut rng, deadline) = (super::Rng(plan.seed), plan.deadline);
    let origin = Instant::now();
    while Instant::now() < deadline && !stop.load(Ordering::Acquire) {
        let gap = Duration::from_millis(GAP_MS.0 + rng.below(GAP_MS.1 - GAP_MS.0));
        if !pause(gap, deadline, stop) {
            break;
        }
        let pick = usize::try_from(rng.below(plan.kinds.len() as u64)).unwrap_or(0);
        let kind = plan.kinds.get(pick).copied().unwrap_or(0);
        let start = Instant::now();
        eprintln!(
            "soak: {:>6.1} s  fault: {}",
            (start - origin).as_secs_f64(),
            KINDS.get(kind).copied().unwrap_or("?")
        );
        open_window(state, start);
        match kind {
            0 => flash(&mut proxy, "both reset"),
            1 => {
                let dir = if rng.below(2) == 0 { "up" } else { "down" };
                flash(&mut proxy, &format!("{dir} cut {}", 1 + rng.below(MAX_CUT)));
            }
            2 => {
                proxy.send("both stall");
                pause(
                    Duration::from_millis(rng.below(MAX_STALL_MS)),
                    deadline,
                    stop,
                );
                proxy.send("both pass");
            }
            _ => match restart(state, &mut proxy, bin, frontend) {
                Ok(()) => {}
                Err(e) => eprintln!("soak: restarting the proxy failed: {e}"),
            },
        }
        state.counts[kind].fetch_add(1, Ordering::Relaxed);
        close_window(state, start);
    }
    proxy.send("both pass");
    proxy.quit();
}

fn open_window(state: &State, start: Instant) {
    let mut w = lock(&state.windows);
    if w.len() >= MAX_WINDOWS {
        w.pop_front();
    }
    w.push_back((start, None));
}

fn close_window(state: &State, start: Instant) {
    let now = Instant::now();
    for w in lock(&state.windows).iter_mut().rev() {
        if w.0 == start {
            w.1 = Some(now);
            break;
        }
    }
}

/// A fault for [`FLASH`], then pass again.
fn flash(proxy: &mut Proxy, command: &str) {
    proxy.send(command);
    std::thread::sleep(FLASH);
    proxy.send("both pass");
}

/// SIGKILL the proxy and start a new one on a new port.
fn restart(
    state: &State,
    proxy: &mut Proxy,
    bin: &str,
    frontend: SocketAddr,
) -> Result<(), String> {
    *lock(&state.proxy_addr) = None;
    proxy.kill();
    let (fresh, addr) = Proxy::spawn(bin, frontend)?;
    *proxy = fresh;
    *lock(&state.proxy_addr) = Some(addr);
    Ok(())
}

/// Sleeps `d` in short steps; `false` if the deadline passed or `stop` was set meanwhile.
fn pause(d: Duration, deadline: Instant, stop: &AtomicBool) -> bool {
    const STEP: Duration = Duration::from_millis(50);
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::Acquire) || Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(STEP.min(until.saturating_duration_since(Instant::now())));
    }
    true
}

/// A `velo-faults proxy` process.
struct Proxy {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Proxy {
    fn spawn(bin: &str, frontend: SocketAddr) -> Result<(Self, SocketAddr), String> {
        let mut child = Command::new(bin)
            .args(["proxy", "--upstream", &frontend.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{bin}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let addr = line
            .trim()
            .strip_prefix("LISTEN ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("the proxy said {line:?}, expected LISTEN <addr>"))?;
        let stdin = child.stdin.take();
        Ok((Self { child, stdin }, addr))
    }

    fn send(&mut self, command: &str) {
        if let Some(stdin) = &mut self.stdin
            && writeln!(stdin, "{command}").is_err()
        {
            self.stdin = None;
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn quit(mut self) {
        self.send("quit");
        self.stdin = None;
        let _ = self.child.wait();
    }
}

/// `info` with its frontend address replaced by `addr`.
fn rewrite_addr(info: &ConnectionInfo, addr: SocketAddr) -> Option<ConnectionInfo> {
    let mut inner: serde_json::Value = serde_json::from_str(&info.info).ok()?;
    *inner.get_mut("addr")? = serde_json::Value::String(addr.to_string());
    Some(ConnectionInfo {
        transport: info.transport.clone(),
        info: inner.to_string(),
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
