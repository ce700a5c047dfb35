//! `check-layers`: dependency edges between workspace crates follow the layering, and the
//! sans-IO core stays free of runtime, I/O, metrics and native crates (STYLE.md section 1).

use crate::Result;
use crate::metadata::{self, DepKind};

/// The layering, lowest first. A crate may depend on any crate of a strictly lower rank.
const LAYERS: &[(&str, u8)] = &[
    ("velo-wire", 0),
    ("velo-mux", 1),
    ("velo-session", 2),
    // Beside velo-session, depending on none of our crates: TLS for the TCP transport and for
    // response-plane's classic plane.
    ("velo-tls", 2),
    ("velo-tcp", 3),
    ("velo-ucx", 3),
    ("response-plane", 4),
    ("runtime-glue", 5),
    ("velo-bench", 6),
    ("velo-faults", 6),
    ("velo-serve", 7),
];

const ARROW: &str = "velo-wire <- velo-mux <- {velo-session, velo-tls} <- {velo-tcp, velo-ucx} \
                     <- response-plane <- runtime-glue <- {velo-bench, velo-faults} \
                     (velo-bench <- velo-serve)";

/// Outside the layering: tooling that may use any crate.
const TOOLING: &[&str] = &["xtask"];

/// Crates nothing else may depend on. (velo-serve runs velo-bench's mock engine, so velo-bench
/// sits one below it.)
const TOPS: &[&str] = &["xtask", "velo-faults", "velo-serve"];

/// Crates whose normal dependency closure must stay clean.
const SANS_IO_CORE: &[&str] = &["velo-wire", "velo-mux"];

pub(crate) fn run() -> Result {
    let (ws, graph) = metadata::with_graph()?;
    let mut problems = Vec::new();
    let mut edges = 0;
    for pkg in &ws.members {
        if place(&pkg.name).is_none() {
            problems.push(format!(
                "{}: not in the layer table; add it to LAYERS in xtask/src/layers.rs",
                pkg.name
            ));
        }
        for dep in pkg.deps.iter().filter(|d| ws.member(&d.name).is_some()) {
            edges += 1;
            problems.extend(check_edge(&pkg.name, &dep.name, dep.kind));
        }
    }
    let mut closure_len = 0;
    for &core in SANS_IO_CORE {
        let closure = graph.closure(core);
        closure_len += closure.len();
        for path in closure {
            problems.extend(check_core_dep(&path));
        }
    }
    if problems.is_empty() {
        println!(
            "check-layers: ok ({} crates, {edges} edges between them; {} crates checked in \
             the closure of {})",
            ws.members.len(),
            closure_len,
            SANS_IO_CORE.join(", "),
        );
        return Ok(());
    }
    for problem in &problems {
        eprintln!("{problem}");
    }
    Err(format!(
        "check-layers: {} violation(s) of the layering",
        problems.len()
    )
    .into())
}

/// Where a crate sits: `Some(Some(rank))` in the layering, `Some(None)` for tooling.
fn place(name: &str) -> Option<Option<u8>> {
    if TOOLING.contains(&name) {
        return Some(None);
    }
    LAYERS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, rank)| Some(rank))
}

/// Why the edge `from -> to` between workspace crates is not allowed, if it is not.
fn check_edge(from: &str, to: &str, kind: DepKind) -> Option<String> {
    if from == to {
        // A dev-dependency on itself turns on test-only features; cargo rejects other kinds.
        return None;
    }
    let dev = if kind == DepKind::Dev { " (dev)" } else { "" };
    if TOPS.contains(&to) {
        return Some(format!("{from} -> {to}{dev}: nothing may depend on {to}"));
    }
    let (Some(from_place), Some(Some(to_rank))) = (place(from), place(to)) else {
        return None; // Unknown crates are reported once, by name.
    };
    let Some(from_rank) = from_place else {
        return None; // Tooling may use any crate.
    };
    if from_rank == to_rank {
        return Some(format!(
            "{from} -> {to}{dev}: {from} and {to} must not depend on each other"
        ));
    }
    if from_rank < to_rank {
        let why = match kind {
            DepKind::Dev => "dev-dependencies may point down the layering, never up",
            DepKind::Normal | DepKind::Build => "a crate depends only on crates below it",
        };
        return Some(format!(
            "{from} -> {to}{dev}: {from} is below {to} and {why} ({ARROW})"
        ));
    }
    None
}

/// Why the last crate of `path` (a normal dependency path from a sans-IO crate) is banned.
fn check_core_dep(path: &[String]) -> Option<String> {
    let (Some(core), Some(dep)) = (path.first(), path.last()) else {
        return None;
    };
    let reason = banned(dep)?;
    let via = if path.len() > 2 {
        format!(" (via {})", path.join(" -> "))
    } else {
        String::new()
    };
    Some(format!(
        "{core} -> {dep}: the sans-IO core must not depend on {reason}{via}"
    ))
}

/// The kind of crate `name` is, when the sans-IO core must not depend on it.
fn banned(name: &str) -> Option<&'static str> {
    const RUNTIME_IO: &[&str] = &["tokio", "mio", "socket2", "libc", "futures", "hyper"];
    if RUNTIME_IO.contains(&name) {
        Some("runtime or I/O crates")
    } else if name.starts_with("opentelemetry") || name.starts_with("prometheus") {
        Some("metrics crates (only runtime-glue exports metrics)")
    } else if name.ends_with("-sys") {
        Some("native (-sys) crates")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(from: &str, to: &str, kind: DepKind, expect: Option<&str>) {
        assert_eq!(
            check_edge(from, to, kind).as_deref(),
            expect,
            "{from} -> {to} ({kind:?})"
        );
    }

    #[test]
    fn edges_may_point_down_the_layering() {
        check("velo-mux", "velo-wire", DepKind::Normal, None);
        check("velo-bench", "velo-wire", DepKind::Normal, None);
        check("response-plane", "velo-ucx", DepKind::Build, None);
        check("velo-tcp", "velo-mux", DepKind::Dev, None);
        check("velo-wire", "velo-wire", DepKind::Dev, None);
        check("xtask", "velo-wire", DepKind::Normal, None);
    }

    #[test]
    fn edges_up_or_sideways_are_violations() {
        let up = "velo-wire -> velo-mux: velo-wire is below velo-mux and a crate depends only \
                  on crates below it";
        let got = check_edge("velo-wire", "velo-mux", DepKind::Normal).unwrap_or_default();
        assert!(got.starts_with(up), "{got}");
        let got = check_edge("velo-mux", "response-plane", DepKind::Dev).unwrap_or_default();
        assert!(
            got.starts_with("velo-mux -> response-plane (dev): velo-mux is below"),
            "{got}"
        );
        check(
            "velo-tcp",
            "velo-ucx",
            DepKind::Dev,
            Some("velo-tcp -> velo-ucx (dev): velo-tcp and velo-ucx must not depend on each other"),
        );
        check(
            "runtime-glue",
            "xtask",
            DepKind::Dev,
            Some("runtime-glue -> xtask (dev): nothing may depend on xtask"),
        );
        check(
            "xtask",
            "velo-serve",
            DepKind::Normal,
            Some("xtask -> velo-serve: nothing may depend on velo-serve"),
        );
        check("velo-serve", "velo-bench", DepKind::Normal, None);
    }

    #[test]
    fn core_closure_bans_runtime_metrics_and_native_crates() {
        let path = |p: &[&str]| p.iter().map(|&s| s.to_owned()).collect::<Vec<_>>();
        assert_eq!(
            check_core_dep(&path(&["velo-mux", "tokio"])).as_deref(),
            Some("velo-mux -> tokio: the sans-IO core must not depend on runtime or I/O crates")
        );
        assert_eq!(
            check_core_dep(&path(&["velo-wire", "bytes", "ucx1-sys"])).as_deref(),
            Some(
                "velo-wire -> ucx1-sys: the sans-IO core must not depend on native (-sys) crates \
                 (via velo-wire -> bytes -> ucx1-sys)"
            )
        );
        assert!(banned("opentelemetry_sdk").is_some());
        assert!(banned("prometheus-client").is_some());
        assert_eq!(banned("bytes"), None);
        assert_eq!(banned("futures-core"), None);
    }
}
