//! The hostile-peer suite at full scale (`cargo xtask hostile`): attacks a running frontend
//! over loopback while a legitimate worker streams alongside, and prints one table.

use velo_bench::hostile::{Attack, Scale, Target};

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let report = runtime.block_on(async {
        let target = Target::start(Scale::full()).await;
        let report = target.run(&Attack::ALL).await;
        target.shutdown().await;
        report
    });
    print!("{}", report.table());
}
