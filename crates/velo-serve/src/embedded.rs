//! The one-command start: a frontend in this process and mock worker processes it spawns (the
//! same binary's `worker` role), all on loopback, found through discovery in a private
//! directory unless `DYN_FILE_KV` names one.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use velo_serve::cli::{PlaneHost, ServeArgs};
use velo_serve::discovery::{ENV_BACKEND, ENV_FILE_KV};
use velo_serve::frontend::Frontend;

use super::{GRACE, Result};

/// How long the start waits for every worker to be discovered.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) async fn run(args: ServeArgs) -> Result {
    let private = std::env::var_os(ENV_FILE_KV)
        .is_none()
        .then(|| std::env::temp_dir().join(format!("velo-serve-{}", std::process::id())));
    let r = serve(&args, private.clone()).await;
    if let Some(dir) = private {
        let _ = std::fs::remove_dir_all(dir);
    }
    r
}

async fn serve(args: &ServeArgs, private: Option<PathBuf>) -> Result {
    let mut config = args.frontend.config(PlaneHost::Loopback)?;
    if let Some(dir) = &private {
        config.discovery.root.clone_from(dir);
    }
    let root = config.discovery.root.clone();
    let plane = config.service.response_plane().plane().name();
    let frontend = Frontend::start(config).await?;
    let mut children = Vec::new();
    for _ in 0..args.workers {
        children.push(spawn_worker(args, plane, &root)?);
    }
    let started = Instant::now();
    while frontend.state().pool.len() < args.workers as usize && started.elapsed() < READY_TIMEOUT {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let found = frontend.state().pool.len();
    println!(
        "velo-serve: serving model `{}` at http://{}/v1 (response plane {plane}, {found} of {} workers up)",
        args.frontend.model,
        frontend.address(),
        args.workers
    );
    println!(
        "try: curl -N http://{}/v1/chat/completions -H 'content-type: application/json' -d '{{\"model\":\"{}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"max_tokens\":8,\"stream\":true}}'",
        frontend.address(),
        args.frontend.model
    );
    terminated().await;
    for c in &children {
        terminate(c);
    }
    for mut c in children {
        if tokio::time::timeout(GRACE * 2, c.wait()).await.is_err() {
            let _ = c.kill().await;
        }
    }
    let _ = frontend.shutdown().await;
    Ok(())
}

fn spawn_worker(args: &ServeArgs, plane: &str, root: &std::path::Path) -> Result<Child> {
    let exe: PathBuf = std::env::current_exe()?;
    let e = &args.engine;
    let mut cmd = Command::new(exe);
    cmd.arg("worker")
        .args(["--engines", &e.engines.to_string()])
        .args(["--speedup", &e.speedup.to_string()])
        .args(["--max-requests", &args.work_limits.max_requests.to_string()])
        .args([
            "--max-request-connections",
            &args.work_limits.max_request_connections.to_string(),
        ])
        .args([
            "--lease-ttl-ms",
            &args.frontend.discovery.lease_ttl_ms.to_string(),
        ])
        .env(ENV_BACKEND, "file")
        .env(ENV_FILE_KV, root)
        .env(response_plane::ENV_PLANE, plane)
        .arg("--exit-with-stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    if e.flush_per_pass {
        cmd.arg("--flush-per-pass");
    }
    Ok(cmd.spawn()?)
}

/// Asks a child to exit cleanly (it leaves discovery and drains).
fn terminate(child: &Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: sending a signal to a child we spawned and have not reaped.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn terminated() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = async {
            match &mut term {
                Some(t) => { t.recv().await; }
                None => std::future::pending().await,
            }
        } => {}
    }
}
