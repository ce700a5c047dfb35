//! `velo-serve`: see the crate docs and `--help`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use velo_serve::cli::{Cli, Command, PlaneHost, WorkerArgs};
use velo_serve::frontend::Frontend;
use velo_serve::worker::Worker;

mod embedded;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,velo_serve=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("velo-serve: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            None => embedded::run(cli.serve).await,
            Some(Command::Frontend(args)) => frontend(args).await,
            Some(Command::Worker(args)) => worker(args).await,
            Some(Command::Load(args)) => velo_serve::load::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("velo-serve: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Time open answers get at shutdown.
const GRACE: Duration = Duration::from_secs(5);

async fn frontend(args: velo_serve::cli::FrontendArgs) -> Result {
    let config = args.config(PlaneHost::Routable)?;
    let f = Frontend::start(config).await?;
    println!("velo-serve frontend: http://{}/v1", f.address());
    embedded::terminated().await;
    let report = f.shutdown().await;
    eprintln!("velo-serve frontend: shutdown {}", report.outcome());
    Ok(())
}

async fn worker(args: WorkerArgs) -> Result {
    let config = args.config()?;
    let w = Worker::start(config).await?;
    println!(
        "velo-serve worker: instance {:x}, requests on {}",
        w.instance_id(),
        w.address()
    );
    if args.exit_with_stdin {
        // Cancel safety: both branches only wait.
        tokio::select! {
            () = embedded::terminated() => {}
            () = stdin_closed() => {}
        }
    } else {
        embedded::terminated().await;
    }
    let report = w.shutdown().await;
    eprintln!("velo-serve worker: shutdown {}", report.outcome());
    Ok(())
}

/// Resolves when standard input ends (or fails).
async fn stdin_closed() {
    use tokio::io::AsyncReadExt as _;
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    while let Ok(n) = stdin.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}
