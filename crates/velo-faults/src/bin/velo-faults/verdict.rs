//! Judging a run: detection time against its bound, victims that ended exactly once or are
//! left hanging, streams meant to finish that delivered every item, ITL and frontend memory.

use std::time::Duration;

use tokio::time::Instant;
use velo_faults::protocol::{Outcome, ReadMode};

use crate::run::RunOpts;
use crate::scenarios::{Group, Inject, Role, Scenario};
use crate::world::{Stream, World};

/// Examples of each kind of failure kept for the report.
const EXAMPLES: usize = 2;

/// What the baseline of a plane measured, for the other rows to compare with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Baseline {
    pub(crate) itl_p99_ms: Option<f64>,
    pub(crate) rss_peak_kib: u64,
}

/// One row of the table.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) scenario: &'static str,
    pub(crate) plane: String,
    /// Why the scenario did not run.
    pub(crate) skipped: Option<String>,
    pub(crate) detection: Option<Duration>,
    pub(crate) bound: Option<Duration>,
    pub(crate) affected: usize,
    pub(crate) ended_once: usize,
    pub(crate) hanging: usize,
    /// Streams meant to finish, and those that delivered every item.
    pub(crate) finishers: usize,
    pub(crate) delivered: usize,
    pub(crate) itl_p99_ms: Option<f64>,
    pub(crate) base_itl_p99_ms: Option<f64>,
    pub(crate) rss_peak_kib: u64,
    pub(crate) failures: Vec<String>,
    /// What else the reader should know.
    pub(crate) notes: Vec<String>,
}

impl Row {
    fn empty(sc: &Scenario, plane: &str) -> Self {
        Self {
            scenario: sc.name,
            plane: plane.to_owned(),
            skipped: None,
            detection: None,
            bound: None,
            affected: 0,
            ended_once: 0,
            hanging: 0,
            finishers: 0,
            delivered: 0,
            itl_p99_ms: None,
            base_itl_p99_ms: None,
            rss_peak_kib: 0,
            failures: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// A scenario that could not run here, and why.
    pub(crate) fn skipped(sc: &Scenario, plane: &str, why: String) -> Self {
        Self {
            skipped: Some(why),
            ..Self::empty(sc, plane)
        }
    }

    /// A scenario the harness itself could not carry out (a failure).
    pub(crate) fn broken(sc: &Scenario, plane: &str, why: String) -> Self {
        Self {
            failures: vec![format!("the harness failed: {why}")],
            ..Self::empty(sc, plane)
        }
    }

    /// What the baseline gives the rows after it.
    pub(crate) fn baseline(&self) -> Baseline {
        Baseline {
            itl_p99_ms: self.itl_p99_ms,
            rss_peak_kib: self.rss_peak_kib,
        }
    }
}

/// Judges a finished run.
pub(crate) fn judge(
    sc: &Scenario,
    plane: &str,
    w: &World,
    t_fault: Instant,
    opts: &RunOpts,
    base: Option<&Baseline>,
) -> Row {
    let mut row = Row::empty(sc, plane);
    row.bound = opts.bound(sc.bound);
    row.rss_peak_kib = w.rss_peak_kib;
    row.base_itl_p99_ms = base.and_then(|b| b.itl_p99_ms);
    judge_victims(sc, w, t_fault, &mut row);
    judge_finishers(w, &mut row);
    if row.bound.is_none() {
        // Nothing had to end: the time to the last end is no detection.
        row.detection = None;
    }
    if let (Some(d), Some(b)) = (row.detection, row.bound)
        && d > b
    {
        row.failures.push(format!(
            "detection took {:.2} s, over its bound of {:.2} s",
            d.as_secs_f64(),
            b.as_secs_f64()
        ));
    }
    if let (Some(margin), Some(base)) = (sc.rss_margin_mib, base) {
        let limit = base.rss_peak_kib + margin * 1024;
        if w.rss_peak_kib > limit {
            row.failures.push(format!(
                "frontend peak RSS {} MiB over the baseline's {} MiB + {margin} MiB",
                w.rss_peak_kib / 1024,
                base.rss_peak_kib / 1024
            ));
        }
    }
    if sc.inject == Inject::Shutdown {
        judge_shutdown(w, &mut row);
    }
    note_unread(w, &mut row);
    row
}

/// How far the worker of a never-read stream got before it had to wait: the plane's
/// backpressure, in items and bytes.
fn note_unread(w: &World, row: &mut Row) {
    for s in w.streams.values() {
        let g = &w.groups[s.group];
        if g.mode != ReadMode::NoRead {
            continue;
        }
        if let Some((_, end)) = s.worker.first() {
            let mib = (end.items * u64::from(g.item_bytes)) as f64 / (1024.0 * 1024.0);
            row.notes.push(format!(
                "the unread stream's worker had sent {} of {} items ({mib:.1} MiB) when the \
                 frontend dropped it",
                end.items, g.items
            ));
        }
    }
}

/// Victims: each must end exactly once on every observed side (and truthfully), within the
/// bound; one that has not is left hanging.
fn judge_victims(sc: &Scenario, w: &World, t_fault: Instant, row: &mut Row) {
    let (mut hanging, mut wrong) = (Vec::new(), Vec::new());
    for (sid, s) in w.streams.iter().filter(|(_, s)| is_victim(w, s)) {
        row.affected += 1;
        let g = &w.groups[s.group];
        let fe_missing = sc.observe.frontend && s.frontend.is_empty();
        let wk_missing = sc.observe.worker && s.worker.is_empty();
        if fe_missing || wk_missing {
            row.hanging += 1;
            hanging.push(format!(
                "{sid} ({})",
                missing_side(s, fe_missing, wk_missing)
            ));
            continue;
        }
        let mut ends: Vec<Instant> = Vec::new();
        if sc.observe.frontend {
            ends.extend(s.frontend.first().map(|e| e.0));
        }
        if sc.observe.worker {
            ends.extend(s.worker.first().map(|e| e.0));
        }
        if let Some(last) = ends.into_iter().max() {
            let d = last.saturating_duration_since(t_fault);
            row.detection = Some(row.detection.map_or(d, |m| m.max(d)));
        }
        match ended_rightly(sc, g, s) {
            Ok(()) => row.ended_once += 1,
            Err(why) => wrong.push(format!("{sid}: {why}")),
        }
    }
    if row.hanging > 0 {
        row.failures.push(format!(
            "{} of {} affected streams left hanging, e.g. {}",
            row.hanging,
            row.affected,
            examples(&hanging)
        ));
    }
    if !wrong.is_empty() {
        row.failures.push(format!(
            "{} affected streams did not end exactly once and truthfully, e.g. {}",
            wrong.len(),
            examples(&wrong)
        ));
    }
}

fn is_victim(w: &World, s: &Stream) -> bool {
    w.groups[s.group].role == Role::Victim
}

/// Which side never saw the stream end, and what the other side saw.
fn missing_side(s: &Stream, frontend: bool, worker: bool) -> String {
    let other = |end: Option<(&Outcome, u64)>| {
        end.map_or_else(String::new, |(o, n)| {
            format!("; it was {} after {n} items", describe(o))
        })
    };
    match (frontend, worker) {
        (true, true) => "no end on either side".to_owned(),
        (true, false) => format!(
            "no end on the frontend{}",
            other(s.worker.first().map(|(_, e)| (&e.outcome, e.items)))
                .replace("it was", "the worker's was")
        ),
        _ => format!(
            "no end on the worker{}",
            other(s.frontend.first().map(|(_, e)| (&e.outcome, e.items)))
                .replace("it was", "the frontend's was")
        ),
    }
}

/// Whether a victim that ended did so once per observed side, without lying about it: no
/// contract break, no clean end short of its items, and every item when it must complete.
fn ended_rightly(sc: &Scenario, g: &Group, s: &Stream) -> Result<(), String> {
    if sc.observe.frontend && s.frontend.len() != 1 {
        return Err(format!("{} ends on the frontend", s.frontend.len()));
    }
    if sc.observe.worker && s.worker.len() != 1 {
        return Err(format!("{} ends on the worker", s.worker.len()));
    }
    let fe = s.frontend.first().map(|(_, e)| (&e.outcome, e.items));
    let wk = s.worker.first().map(|(_, e)| (&e.outcome, e.items));
    for (side, end) in [("frontend", fe), ("worker", wk)] {
        let Some((outcome, items)) = end else {
            continue;
        };
        if let Outcome::Bad(why) = outcome {
            return Err(format!("{side}: {why}"));
        }
        if *outcome == Outcome::Clean && items < g.items {
            return Err(format!(
                "{side}: a clean end after {items} of {} items",
                g.items
            ));
        }
        if g.complete && (*outcome != Outcome::Clean || items != g.items) {
            return Err(format!(
                "{side}: {} after {items} of {} items",
                describe(outcome),
                g.items
            ));
        }
    }
    Ok(())
}

/// Streams meant to finish: one clean end on each side with every item; their ITL p99.
fn judge_finishers(w: &World, row: &mut Row) {
    let mut undelivered = Vec::new();
    let mut itl: Vec<u64> = Vec::new();
    for (sid, s) in w.streams.iter().filter(|(_, s)| w.groups[s.group].complete) {
        row.finishers += 1;
        let want = w.groups[s.group].items;
        match delivered(s, want) {
            Ok(itl_us) => {
                row.delivered += 1;
                itl.push(itl_us);
            }
            Err(why) => undelivered.push(format!("{sid}: {why}")),
        }
    }
    row.itl_p99_ms = p99(&mut itl).map(|us| us as f64 / 1000.0);
    if !undelivered.is_empty() {
        row.failures.push(format!(
            "{} of {} streams meant to finish did not deliver every item, e.g. {}",
            undelivered.len(),
            row.finishers,
            examples(&undelivered)
        ));
    }
}

/// The stream's ITL if it was delivered in full, once, on both sides.
fn delivered(s: &Stream, want: u64) -> Result<u64, String> {
    let ([(_, fe)], [(_, wk)]) = (s.frontend.as_slice(), s.worker.as_slice()) else {
        return Err(format!(
            "{} ends on the frontend, {} on the worker",
            s.frontend.len(),
            s.worker.len()
        ));
    };
    if fe.outcome != Outcome::Clean || fe.items != want {
        return Err(format!(
            "frontend: {} after {} of {want}",
            describe(&fe.outcome),
            fe.items
        ));
    }
    if wk.outcome != Outcome::Clean || wk.items != want {
        return Err(format!(
            "worker: {} after {} of {want}",
            describe(&wk.outcome),
            wk.items
        ));
    }
    Ok(fe.itl_us)
}

/// Go-away: a registration after shutdown began is refused, and shutdown returns cleanly.
fn judge_shutdown(w: &World, row: &mut Row) {
    match w.late_register.as_deref() {
        Some("closed") => {}
        Some(other) => row.failures.push(format!(
            "a registration after shutdown began was not refused as closed: {other}"
        )),
        None => row.failures.push("shutdown never began".into()),
    }
    match &w.shutdown_done {
        Some((outcome, _)) if outcome == "clean" => {}
        Some((outcome, ms)) => row
            .failures
            .push(format!("shutdown ended `{outcome}` after {ms} ms")),
        None => row.failures.push("shutdown did not return".into()),
    }
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Setup(m) | Outcome::Error(m) | Outcome::Bad(m) => format!("{} ({m})", o.label()),
        other => other.label().to_owned(),
    }
}

fn examples(items: &[String]) -> String {
    items
        .iter()
        .take(EXAMPLES)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ")
}

/// The 99th percentile (nearest rank) of `v`.
fn p99(v: &mut [u64]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let rank = (v.len() * 99).div_ceil(100).max(1);
    v.get(rank - 1).copied()
}
