//! One request, start to end: sent on the plane, its stream read to the end, and what it
//! measured recorded in the window it belongs to.

use std::time::Duration;

use tokio::time::Instant;

use super::stats::Timings;
use super::{BUCKET_MS, FrontendOpts, MAX_BUCKETS, Shared};
use crate::adapter::{BenchFrontend, BenchStream};
use crate::reqplane::Request;

/// Runs request `id`, which arrived at `t0` (a closed loop: when it was sent; an open loop:
/// its scheduled arrival), and records it in the windows it touched.
pub(super) async fn serve<F: BenchFrontend>(
    plane: &F,
    shared: &Shared,
    opts: &FrontendOpts,
    id: u64,
    t0: Instant,
) {
    let started = shared.window();
    if let Some(step) = started {
        shared.pending(step, id, t0);
    }
    let mut track = Track::new(shared.start, started, opts.osl);
    let outcome = one_request(plane, shared, opts, id, &mut track).await;
    shared.on_request_done();
    let ended = shared.window();
    shared.record(id, t0, &outcome, started, ended, &mut track);
}

/// What a request counts while its items come in: tokens per window, tokens per time bucket
/// since the load started, and the gaps between its items.
pub(super) struct Track {
    start: Instant,
    /// The window (step) the current token count belongs to, and the count.
    pub(super) window: Option<usize>,
    pub(super) window_tokens: u64,
    /// Tokens per [`BUCKET`] from bucket `first_bucket` on.
    pub(super) first_bucket: usize,
    pub(super) buckets: Vec<u64>,
    /// The index in `buckets` of the last item's bucket.
    bucket: usize,
    /// Gaps between consecutive items, us (kept only for a request started in a window).
    pub(super) gaps: Vec<u32>,
    keep_gaps: bool,
    /// Window token counts to flush when the window changed mid-request: (step, tokens).
    pub(super) spilled: Vec<(usize, u64)>,
}

impl Track {
    /// A request started in window `started` (if any) that expects `osl` items: its gaps are
    /// kept in room made once, so recording an item allocates nothing.
    fn new(start: Instant, started: Option<usize>, osl: u32) -> Self {
        let keep_gaps = started.is_some();
        let room = if keep_gaps {
            usize::try_from(osl).unwrap_or(0)
        } else {
            0
        };
        Self {
            start,
            window: started,
            window_tokens: 0,
            first_bucket: usize::MAX,
            buckets: Vec::new(),
            bucket: 0,
            gaps: Vec::with_capacity(room),
            keep_gaps,
            spilled: Vec::new(),
        }
    }

    /// `tokens` arrived at `now`, `gap` after the previous item (if any), while window
    /// `window` was open (or none). `delivery` says whether `now` was read for this item;
    /// an item that came with the one before it has that one's time, so its bucket is that
    /// one's too (the bench's own cost per item stays a few adds, for every arm).
    fn on_item(
        &mut self,
        now: Instant,
        delivery: bool,
        tokens: u64,
        gap: Option<Duration>,
        window: Option<usize>,
    ) {
        if window != self.window {
            if let Some(w) = self.window {
                self.spilled.push((w, self.window_tokens));
            }
            self.window = window;
            self.window_tokens = 0;
        }
        self.window_tokens += tokens;
        if delivery || self.buckets.is_empty() {
            self.bucket = self.bucket_of(now);
        }
        let i = self.bucket;
        if self.buckets.len() <= i {
            self.buckets.resize(i + 1, 0);
        }
        self.buckets[i] += tokens;
        if let (true, Some(g)) = (self.keep_gaps, gap) {
            self.gaps
                .push(u32::try_from(g.as_micros()).unwrap_or(u32::MAX));
        }
    }

    /// The index in `buckets` of the bucket `now` falls in (setting `first_bucket` on the
    /// first call).
    fn bucket_of(&mut self, now: Instant) -> usize {
        let since = u64::try_from((now - self.start).as_millis()).unwrap_or(u64::MAX);
        let bucket = usize::try_from(since / BUCKET_MS)
            .unwrap_or(MAX_BUCKETS)
            .min(MAX_BUCKETS);
        if self.first_bucket == usize::MAX {
            self.first_bucket = bucket;
        }
        bucket.saturating_sub(self.first_bucket)
    }
}

/// The stream's next item, and whether it had to wait for it (its future was pending once).
async fn next_noting_wait<S: BenchStream>(
    stream: &mut S,
) -> (Option<Result<crate::item::EngineOutput, String>>, bool) {
    let mut next = std::pin::pin!(stream.next_item());
    let mut waited = false;
    let item = std::future::poll_fn(|cx| {
        let polled = next.as_mut().poll(cx);
        waited |= polled.is_pending();
        polled
    })
    .await;
    (item, waited)
}

/// Sends one request and reads its stream to the end.
async fn one_request<F: BenchFrontend>(
    plane: &F,
    shared: &Shared,
    opts: &FrontendOpts,
    id: u64,
    track: &mut Track,
) -> Result<Timings, String> {
    let per = u64::from(opts.engines_per_process.max(1));
    let targets = u64::try_from(opts.worker_processes.max(1)).unwrap_or(1) * per;
    let target = id % targets;
    let request = Request {
        id,
        worker: u32::try_from(target % per).unwrap_or(0),
        isl: opts.isl,
        osl: opts.osl,
        info: String::new(),
    };
    let process = usize::try_from(target / per).unwrap_or(0);
    let mut stream = plane.request(process, request).await?;
    let established = Instant::now();
    let mut first = None;
    let mut last = established;
    let mut n = 0u64;
    loop {
        let (item, waited) = next_noting_wait(&mut stream).await;
        let Some(item) = item else { break };
        let item = item?;
        // An item that was ready when asked for arrived with the one before it (the plane
        // delivered them together; reading them took well under a microsecond), so it gets
        // that one's time: one clock read per delivery, not per item, for every arm.
        let delivery = waited || first.is_none();
        let now = if delivery { Instant::now() } else { last };
        let tokens = item.token_ids.len() as u64;
        let gap = match (first.is_some(), delivery) {
            (false, _) => None,
            (true, true) => Some(now - last),
            (true, false) => Some(Duration::ZERO),
        };
        track.on_item(now, delivery, tokens, gap, shared.window());
        n += tokens;
        first.get_or_insert(now);
        last = now;
    }
    if n < u64::from(opts.osl) {
        return Err(format!("stream ended after {n} of {} tokens", opts.osl));
    }
    Ok(Timings {
        established,
        first: first.unwrap_or(last),
        last,
        tokens: n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_of_one_delivery_count_in_its_bucket_and_a_later_delivery_in_its_own() {
        let start = Instant::now();
        let mut track = Track::new(start, Some(0), 8);
        let at = |ms| start + Duration::from_millis(ms);
        // A delivery of three items 150 ms in (bucket 1), then one 250 ms in (bucket 2).
        track.on_item(at(150), true, 1, None, Some(0));
        track.on_item(at(150), false, 2, Some(Duration::ZERO), Some(0));
        track.on_item(at(150), false, 1, Some(Duration::ZERO), Some(0));
        track.on_item(at(250), true, 1, Some(Duration::from_millis(100)), Some(0));
        assert_eq!(track.first_bucket, 1);
        assert_eq!(track.buckets, [4, 1]);
        assert_eq!(track.window_tokens, 5);
        assert_eq!(track.gaps, [0, 0, 100_000]);
    }

    #[test]
    fn a_request_that_spans_windows_spills_each_window_s_tokens() {
        let start = Instant::now();
        let mut track = Track::new(start, Some(0), 4);
        track.on_item(start, true, 2, None, Some(0));
        track.on_item(start, false, 1, Some(Duration::ZERO), Some(1));
        assert_eq!(track.spilled, [(0, 2)]);
        assert_eq!((track.window, track.window_tokens), (Some(1), 1));
    }
}
