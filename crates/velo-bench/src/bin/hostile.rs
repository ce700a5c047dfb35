//! The hostile-peer suite at full scale (`cargo xtask hostile [ATTACK...]`): attacks a running
//! frontend over loopback while a legitimate worker streams alongside, and prints one table.
//! Each argument picks the attacks whose name contains it (case-insensitive); none picks all.

use std::process::ExitCode;

use velo_bench::hostile::{Attack, Scale, Target};

fn main() -> ExitCode {
    let picks: Vec<String> = std::env::args().skip(1).map(|a| a.to_lowercase()).collect();
    let attacks: Vec<Attack> = Attack::ALL
        .into_iter()
        .filter(|a| picks.is_empty() || picks.iter().any(|p| a.name().contains(p.as_str())))
        .collect();
    if attacks.is_empty() {
        let names: Vec<_> = Attack::ALL.iter().map(|a| a.name()).collect();
        eprintln!(
            "no attack matches {picks:?}; the attacks are: {}",
            names.join("; ")
        );
        return ExitCode::FAILURE;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let report = runtime.block_on(async {
        let target = Target::start(Scale::full()).await;
        let report = target.run(&attacks).await;
        target.shutdown().await;
        report
    });
    print!("{}", report.table());
    ExitCode::SUCCESS
}
