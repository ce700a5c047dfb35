//! `velo-faults proxy`: a fault proxy driven over standard input (see
//! `velo_faults::proxy::parse_control`), for a process that cannot link the library (the
//! soak). Prints `LISTEN <addr>` once it listens; errors go to standard error.

use std::net::SocketAddr;

use tokio::io::{AsyncBufReadExt, BufReader};
use velo_faults::proxy::{Control, FaultProxy, Faults, ProxyConfig, parse_control};

/// The proxy's command line.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ProxyArgs {
    /// Where connections are forwarded (a loopback address).
    #[arg(long)]
    pub(crate) upstream: SocketAddr,
}

/// Runs the proxy until `quit` or the end of its input.
pub(crate) async fn run(args: ProxyArgs) -> Result<(), String> {
    let proxy = FaultProxy::bind(args.upstream, ProxyConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    println!("LISTEN {}", proxy.local_addr());
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match parse_control(&line) {
            Ok(Control::Set(None, fault)) => proxy.set_both(Faults {
                to_upstream: fault,
                to_client: fault,
            }),
            Ok(Control::Set(Some(dir), fault)) => proxy.set(dir, fault),
            Ok(Control::Upstream(addr)) => {
                if let Err(e) = proxy.set_upstream(addr) {
                    eprintln!("proxy: {e}");
                }
            }
            Ok(Control::Quit) => break,
            Err(e) => eprintln!("proxy: {line:?}: {e}"),
        }
    }
    proxy.shutdown().await;
    Ok(())
}
