//! CPU time of a process, per thread group, from `/proc/<pid>/task/*/stat`: the frontend's
//! HTTP side (axum, request handling, SSE shaping, reading the response streams) and its
//! response plane (the lane reader and writer tasks) run on differently named threads when
//! the frontend runs with `--plane-thread`, so their CPU can be told apart.

use std::collections::BTreeMap;

/// Clock ticks per second of `/proc` times (`sysconf(_SC_CLK_TCK)`).
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU seconds (user + system) of each thread name of process `pid`, added up per name.
pub fn by_thread_name(pid: u32) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    let hz = ticks_per_second();
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        if let Some((name, ticks)) = parse_stat(&stat) {
            *out.entry(name).or_insert(0.0) += ticks as f64 / hz;
        }
    }
    out
}

/// The thread name and utime + stime ticks of one `stat` line.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    // Fields after the name start at field 3 (state); utime is field 14, stime 15.
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

/// The thread-name group a thread belongs to: `plane` (`velo-plane*`) or `http` (the rest).
pub fn group(name: &str) -> &'static str {
    if name.starts_with("velo-plane") {
        "plane"
    } else {
        "http"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_the_name_and_cpu_ticks() {
        let line = "123 (velo-plane) S 1 2 3 4 5 6 7 8 9 10 42 8 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_stat(line), Some(("velo-plane".into(), 50)));
        assert_eq!(group("velo-plane"), "plane");
        assert_eq!(group("tokio-runtime-w"), "http");
    }
}
