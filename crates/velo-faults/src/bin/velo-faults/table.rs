//! The one table of a run, and the failures under it.

use std::time::Duration;

use crate::verdict::Row;

/// Prints the table and the failures; returns how many rows failed.
pub(crate) fn print(rows: &[Row]) -> usize {
    println!(
        "{:<22} {:<5} {:>9} {:>7} {:>8} {:>10} {:>7} {:>11} {:>17} {:>7}  verdict",
        "scenario",
        "plane",
        "detect s",
        "bound s",
        "affected",
        "ended once",
        "hanging",
        "delivered",
        "ITL p99 ms (base)",
        "FE MiB",
    );
    for r in rows {
        print_row(r);
    }
    let failed: Vec<&Row> = rows.iter().filter(|r| !r.failures.is_empty()).collect();
    let skipped: Vec<&Row> = rows.iter().filter(|r| r.skipped.is_some()).collect();
    for r in &skipped {
        println!(
            "SKIPPED {} / {}: {}",
            r.scenario,
            r.plane,
            r.skipped.as_deref().unwrap_or_default()
        );
    }
    for r in rows {
        for n in &r.notes {
            println!("NOTE {} / {}: {n}", r.scenario, r.plane);
        }
    }
    for r in &failed {
        for f in &r.failures {
            println!("FAILED {} / {}: {f}", r.scenario, r.plane);
        }
    }
    failed.len()
}

fn print_row(r: &Row) {
    if r.skipped.is_some() {
        println!("{:<22} {:<5} {:>88}  skipped", r.scenario, r.plane, "");
        return;
    }
    let victims = |n: usize| {
        if r.affected == 0 {
            "-".to_owned()
        } else {
            n.to_string()
        }
    };
    let delivered = if r.finishers == 0 {
        "-".to_owned()
    } else {
        format!("{}/{}", r.delivered, r.finishers)
    };
    let itl = match (r.itl_p99_ms, r.base_itl_p99_ms) {
        (None, _) => "-".to_owned(),
        (Some(v), None) => format!("{v:.1}"),
        (Some(v), Some(b)) => format!("{v:.1} ({b:.1})"),
    };
    let verdict = if r.failures.is_empty() { "ok" } else { "FAIL" };
    println!(
        "{:<22} {:<5} {:>9} {:>7} {:>8} {:>10} {:>7} {:>11} {:>17} {:>7.1}  {verdict}",
        r.scenario,
        r.plane,
        secs(r.detection, r.hanging > 0),
        secs(r.bound, false),
        victims(r.affected),
        victims(r.ended_once),
        victims(r.hanging),
        delivered,
        itl,
        r.rss_peak_kib as f64 / 1024.0,
    );
}

/// Seconds with two decimals; `hang` marks a detection that never completed.
fn secs(d: Option<Duration>, hang: bool) -> String {
    match (d, hang) {
        (_, true) => "never".to_owned(),
        (None, false) => "-".to_owned(),
        (Some(d), false) => format!("{:.2}", d.as_secs_f64()),
    }
}
