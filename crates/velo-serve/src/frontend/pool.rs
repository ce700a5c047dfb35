//! The workers this frontend routes to, as discovery reports them. Each has a request-plane
//! connection and an in-flight count; requests go to the least loaded one.
//!
//! When a worker leaves (its discovery record was deleted or expired, or its request-plane
//! connection was lost) it stops taking requests at once, the response plane ends every
//! stream still waiting for its prologue there (`cancel_instance_streams`: they fail with
//! `Disconnected` and are retried on another worker; the instance is tombstoned for 5 s, so a
//! registration racing the removal fails at once), and streams it is generating get
//! [`REMOVAL_GRACE`] to finish before they are ended with an error the client sees.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use response_plane::FrontendPlane;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::discovery::watch::{Change, Forget};
use crate::work::{ConnectError, RequestAuth, WorkChannel};

/// How long a removed worker's open streams may keep generating before they are ended.
pub const REMOVAL_GRACE: Duration = Duration::from_secs(10);
/// The pause before a worker that could not be reached, or whose connection was lost, is
/// tried again; it doubles with each failure in a row, up to [`RETRY_PAUSE_MAX`]. A crashed
/// worker's record stays in discovery until it expires: without a pause, each rescan would
/// dial it again at once.
pub const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between tries of one worker; a connection that lived this long counts
/// as a success, so the next loss starts again from [`RETRY_PAUSE`].
pub const RETRY_PAUSE_MAX: Duration = Duration::from_secs(5);

/// One worker.
#[derive(Debug)]
pub struct WorkerEntry {
    /// Its discovery instance id.
    pub id: u64,
    /// Its request plane.
    pub channel: WorkChannel,
    in_flight: AtomicU64,
    /// Fires [`REMOVAL_GRACE`] after the worker left: its open streams end.
    pub gone: CancellationToken,
}

/// A request counted against a worker until dropped.
#[derive(Debug)]
pub struct Assigned(pub Arc<WorkerEntry>);

impl Drop for Assigned {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The routable workers.
#[derive(Debug)]
pub struct Pool {
    members: RwLock<Members>,
    turn: AtomicUsize,
    removal_grace: Duration,
    /// Numbers each addition of a worker (see [`Members::wanted`]).
    additions: AtomicU64,
    /// Failures in a row per worker discovery lists (tries that could not connect, or
    /// connections lost soon after), for the pause before the next try.
    failures: Mutex<HashMap<u64, u32>>,
}

#[derive(Debug, Default)]
struct Members {
    /// The routable workers, by instance id.
    workers: HashMap<u64, Arc<WorkerEntry>>,
    /// The workers discovery lists, each with the number of its latest addition: a connection
    /// that completes after its worker left (or for an older addition) is never routed to.
    wanted: HashMap<u64, u64>,
}

impl Pool {
    /// An empty pool; removed workers' streams get `removal_grace`.
    pub fn new(removal_grace: Duration) -> Arc<Self> {
        Arc::new(Self {
            members: RwLock::new(Members::default()),
            turn: AtomicUsize::new(0),
            removal_grace,
            additions: AtomicU64::new(0),
            failures: Mutex::new(HashMap::new()),
        })
    }

    /// Workers routable right now.
    pub fn len(&self) -> usize {
        self.read().workers.len()
    }

    /// Whether no worker is routable.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids of the routable workers.
    pub fn ids(&self) -> Vec<u64> {
        self.read().workers.keys().copied().collect()
    }

    /// The least loaded worker not in `tried` (ties broken in turn), counted as assigned.
    pub fn pick(&self, tried: &[u64]) -> Option<Assigned> {
        let members = self.read();
        let workers = &members.workers;
        let n = workers.len();
        if n == 0 {
            return None;
        }
        let start = self.turn.fetch_add(1, Ordering::Relaxed) % n;
        let best = workers
            .values()
            .cycle()
            .skip(start)
            .take(n)
            .filter(|w| !tried.contains(&w.id))
            .min_by_key(|w| w.in_flight.load(Ordering::Relaxed))?
            .clone();
        best.in_flight.fetch_add(1, Ordering::AcqRel);
        Some(Assigned(best))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Members> {
        self.members.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Members> {
        self.members.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Discovery added worker `id`: returns the number of this addition, which its
    /// connection presents to [`insert`](Self::insert).
    fn want(&self, id: u64) -> u64 {
        let addition = self.additions.fetch_add(1, Ordering::Relaxed);
        self.write().wanted.insert(id, addition);
        addition
    }

    /// Routes to `entry`, connected for `addition`, if its worker is still wanted for that
    /// addition; else closes its channel (it left while it was being connected) and returns
    /// `false`.
    fn insert(&self, entry: Arc<WorkerEntry>, addition: u64) -> bool {
        let mut members = self.write();
        if members.wanted.get(&entry.id) != Some(&addition) {
            drop(members);
            entry.channel.close();
            return false;
        }
        let old = members.workers.insert(entry.id, entry);
        drop(members);
        if let Some(old) = old {
            old.channel.close();
        }
        true
    }

    /// Counts a failure of worker `id` (while discovery lists it) and returns the pause
    /// before it is tried again.
    fn failed(&self, id: u64) -> Duration {
        let listed = self.read().wanted.contains_key(&id);
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        if !listed {
            failures.remove(&id);
            return RETRY_PAUSE;
        }
        let n = failures.entry(id).or_insert(0);
        let pause = RETRY_PAUSE
            .saturating_mul(1 << (*n).min(16))
            .min(RETRY_PAUSE_MAX);
        *n = n.saturating_add(1);
        pause
    }

    /// Worker `id` is not failing (a long-lived connection) or no longer listed.
    fn clear_failures(&self, id: u64) {
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        failures.remove(&id);
    }

    /// Takes worker `id` out of routing; a connection to it still being made is not routed
    /// to either.
    fn take(&self, id: u64) -> Option<Arc<WorkerEntry>> {
        let mut members = self.write();
        members.wanted.remove(&id);
        members.workers.remove(&id)
    }
}

/// Keeps `pool` in step with discovery until `stop`: connects to added workers (each must
/// pass the request plane's handshake under `auth`), removes the ones that left (see the
/// module docs).
pub async fn follow(
    pool: Arc<Pool>,
    plane: FrontendPlane,
    auth: RequestAuth,
    mut changes: mpsc::Receiver<Change>,
    forget: Forget,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    if !auth.has_secret() {
        tracing::warn!(
            "the request plane authenticates no worker: no cluster secret \
             (DYN_VELO_CLUSTER_SECRET_PATH); requests go to whoever listens at a discovered address"
        );
    }
    loop {
        // Cancel safety: `recv` loses nothing when `stop` wins.
        let change = tokio::select! {
            c = changes.recv() => c,
            () = stop.cancelled() => None,
        };
        match change {
            None => return,
            Some(Change::Added(instance)) => {
                let addition = pool.want(instance.instance_id);
                let ctx = Context {
                    pool: pool.clone(),
                    plane: plane.clone(),
                    auth: auth.clone(),
                    forget: forget.clone(),
                    tracker: tracker.clone(),
                    stop: stop.clone(),
                };
                tracker.spawn(connect(instance, addition, ctx));
            }
            Some(Change::Removed(id)) => {
                pool.clear_failures(id);
                remove(&pool, &plane, (&tracker, &stop), id, "left discovery");
            }
        }
    }
}

/// What a worker's connection task shares with `follow`.
struct Context {
    pool: Arc<Pool>,
    plane: FrontendPlane,
    auth: RequestAuth,
    forget: Forget,
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Context {
    /// Asks the watcher to forget worker `id` (so its next scan adds it again) after the
    /// pause its failures in a row call for; nothing once `follow` stops.
    async fn retry_later(&self, id: u64) {
        let pause = self.pool.failed(id);
        // Cancel safety: both branches only wait.
        tokio::select! {
            () = tokio::time::sleep(pause) => self.forget.forget(id).await,
            () = self.stop.cancelled() => {}
        }
    }
}

/// Connects to a worker's request plane and adds it, unless it left meanwhile; forgets it (to
/// be retried on a later scan, after a pause) when that fails (a worker that fails the
/// handshake is never routed to) or the connection is lost later, removing it then. Ends,
/// closing the connection, when `follow` stops.
async fn connect(instance: crate::discovery::Instance, addition: u64, ctx: Context) {
    let Context {
        pool,
        plane,
        auth,
        tracker,
        stop,
        ..
    } = &ctx;
    let id = instance.instance_id;
    let Some(addr) = instance.address() else {
        tracing::warn!(instance = format!("{id:x}"), transport = ?instance.transport, "unusable worker address");
        return;
    };
    // The worker checks it is the instance meant: a stale or forged entry reaching another
    // worker is refused (see `crate::work`, "Handshake").
    let auth = auth.clone().with_instance(id);
    // Cancel safety: a connection cut short by `stop` is dropped, closed.
    let connected = tokio::select! {
        c = WorkChannel::connect(addr, &auth, tracker) => c,
        () = stop.cancelled() => return,
    };
    let channel = match connected {
        Ok(c) => c,
        Err(ConnectError::Handshake(e)) => {
            tracing::warn!(instance = format!("{id:x}"), %addr, error = %e, "worker failed the request-plane handshake: not routed to");
            ctx.retry_later(id).await;
            return;
        }
        Err(e) => {
            tracing::warn!(instance = format!("{id:x}"), %addr, error = %e, "cannot reach worker");
            ctx.retry_later(id).await;
            return;
        }
    };
    let entry = Arc::new(WorkerEntry {
        id,
        channel: channel.clone(),
        in_flight: AtomicU64::new(0),
        gone: CancellationToken::new(),
    });
    if !pool.insert(entry.clone(), addition) {
        tracing::info!(instance = format!("{id:x}"), %addr, "worker left while it was being connected");
        return;
    }
    tracing::info!(instance = format!("{id:x}"), %addr, workers = pool.len(), "worker added");
    let connected = tokio::time::Instant::now();
    // Cancel safety: both branches only wait.
    tokio::select! {
        () = channel.lost() => {}
        () = stop.cancelled() => {
            channel.close();
            return;
        }
    }
    if connected.elapsed() >= RETRY_PAUSE_MAX {
        pool.clear_failures(id);
    }
    // Still this entry (not replaced by a newer record)? Then the worker is gone.
    let current = pool
        .read()
        .workers
        .get(&id)
        .is_some_and(|w| Arc::ptr_eq(w, &entry));
    if current {
        remove(
            pool,
            plane,
            (tracker, stop),
            id,
            "request plane connection lost",
        );
        ctx.retry_later(id).await;
    }
}

/// Takes a worker out of routing and ends its streams (see the module docs): those still
/// generating after the removal grace. When `stop` comes first, the streams are left to the
/// plane's own bounded shutdown and the removal's task ends at once.
pub fn remove(
    pool: &Pool,
    plane: &FrontendPlane,
    (tracker, stop): (&TaskTracker, &CancellationToken),
    id: u64,
    why: &str,
) {
    let Some(entry) = pool.take(id) else { return };
    entry.channel.close();
    let pending = plane.cancel_instance_streams(id);
    tracing::info!(
        instance = format!("{id:x}"),
        why,
        pending_streams_ended = pending,
        workers = pool.len(),
        "worker removed"
    );
    let (grace, stop) = (pool.removal_grace, stop.clone());
    tracker.spawn(async move {
        // Cancel safety: both branches only wait.
        tokio::select! {
            () = tokio::time::sleep(grace) => entry.gone.cancel(),
            () = stop.cancelled() => {}
        }
    });
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::discovery::{Instance, Transport};

    const BOUND: Duration = Duration::from_secs(20);

    /// The next connection to `listener`, past the request plane's handshake (no secret), as
    /// a worker takes it.
    async fn accept_worker(listener: &tokio::net::TcpListener) -> tokio::net::TcpStream {
        let (mut conn, _) = tokio::time::timeout(BOUND, listener.accept())
            .await
            .expect("the frontend connects")
            .unwrap();
        let open = RequestAuth::open();
        let handshake = crate::work::auth::worker_handshake(&mut conn, &open);
        tokio::time::timeout(BOUND, handshake)
            .await
            .expect("the handshake ends in time")
            .expect("the frontend greets");
        conn
    }

    fn instance(addr: std::net::SocketAddr) -> Instance {
        Instance {
            namespace: "ns".into(),
            component: "backend".into(),
            endpoint: "generate".into(),
            instance_id: 7,
            transport: Transport::Tcp(addr.to_string()),
        }
    }

    /// A frontend plane and `follow` fed by the test, which stands in for the watcher: it
    /// sends the changes and reads what `follow` asks it to forget.
    async fn following(
        pool: &Arc<Pool>,
    ) -> (
        mpsc::Sender<Change>,
        mpsc::Receiver<u64>,
        FrontendPlane,
        TaskTracker,
        CancellationToken,
    ) {
        let config = response_plane::ResponsePlaneConfig::builder()
            .host(Some("127.0.0.1".parse().unwrap()))
            .build()
            .unwrap();
        let plane_tracker = TaskTracker::new();
        let plane = FrontendPlane::bind(config, plane_tracker).await.unwrap();
        let (changes_tx, changes) = mpsc::channel(4);
        let (forget, forgotten) = Forget::channel();
        let (tracker, stop) = (TaskTracker::new(), CancellationToken::new());
        let follow = follow(
            pool.clone(),
            plane.clone(),
            RequestAuth::open(),
            changes,
            forget,
            tracker.clone(),
            stop.clone(),
        );
        tracker.spawn(follow);
        (changes_tx, forgotten, plane, tracker, stop)
    }

    /// A worker that crashed: its record stays in discovery (until it expires) but its port
    /// refuses connections. Each failure is forgotten so a rescan finds the worker again, but
    /// only after a pause that doubles per failure: the frontend does not dial it in a loop.
    /// The pauses are a lower bound on the time four tries take, whatever the scheduler does.
    #[tokio::test(flavor = "current_thread")]
    async fn a_worker_that_refuses_connections_is_tried_again_after_growing_pauses() {
        let refusing = {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            listener.local_addr().unwrap()
        };
        let pool = Pool::new(REMOVAL_GRACE);
        let (changes, mut forgotten, plane, _tracker, stop) = following(&pool).await;
        let start = tokio::time::Instant::now();
        const TRIES: u32 = 4;
        for _ in 0..TRIES {
            changes
                .send(Change::Added(instance(refusing)))
                .await
                .unwrap();
            let id = tokio::time::timeout(BOUND, forgotten.recv()).await.unwrap();
            assert_eq!(id, Some(7));
        }
        let least: Duration = (0..TRIES).map(|n| RETRY_PAUSE * (1 << n)).sum();
        assert!(
            start.elapsed() >= least,
            "{TRIES} tries in {:?}: the pauses alone take {least:?}",
            start.elapsed()
        );
        stop.cancel();
        plane.shutdown().await;
    }

    /// A worker removed from discovery keeps its streams for the removal grace (an hour
    /// here); a frontend stopping meanwhile must not wait for that grace: the removal's task
    /// ends with the stop.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stopping_ends_a_removal_still_in_its_grace() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = Pool::new(Duration::from_secs(3600));
        let (changes, _forgotten, plane, tracker, stop) = following(&pool).await;
        changes
            .send(Change::Added(instance(listener.local_addr().unwrap())))
            .await
            .unwrap();
        let _conn = accept_worker(&listener).await;
        let start = tokio::time::Instant::now();
        while pool.is_empty() {
            assert!(start.elapsed() < BOUND, "the worker is never routed to");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        changes.send(Change::Removed(7)).await.unwrap();
        while !pool.is_empty() {
            assert!(start.elapsed() < BOUND, "the worker is never removed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        tracker.close();
        tokio::time::timeout(BOUND, tracker.wait())
            .await
            .expect("the removal's grace task ends with the stop");
        plane.shutdown().await;
    }

    /// A connection attempt still running when discovery removes its worker fails later:
    /// its failure must not be counted for a worker nobody will try again (ids are new per
    /// worker start, so the count would stay for ever).
    #[test]
    fn a_failure_of_a_worker_already_removed_is_not_kept() {
        let pool = Pool::new(REMOVAL_GRACE);
        pool.want(7);
        pool.clear_failures(7);
        pool.take(7);
        let _pause = pool.failed(7);
        let failures = pool.failures.lock().unwrap();
        assert!(failures.is_empty(), "kept: {failures:?}");
    }

    /// Stopping `follow` ends the connection tasks of the workers it routes to, closing their
    /// connections: a frontend's shutdown waits for its tasks, and these would otherwise wait
    /// for their workers to go away.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stopping_closes_the_connections_to_routed_workers_and_ends_their_tasks() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = Pool::new(REMOVAL_GRACE);
        let (changes, _forgotten, plane, tracker, stop) = following(&pool).await;
        changes
            .send(Change::Added(instance(listener.local_addr().unwrap())))
            .await
            .unwrap();
        let mut conn = accept_worker(&listener).await;
        let start = tokio::time::Instant::now();
        while pool.is_empty() {
            assert!(start.elapsed() < BOUND, "the worker is never routed to");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        tracker.close();
        tokio::time::timeout(BOUND, tracker.wait())
            .await
            .expect("the frontend's connection tasks end when it stops");
        let mut byte = [0u8; 1];
        let end = tokio::time::timeout(BOUND, conn.read(&mut byte)).await;
        assert!(matches!(end, Ok(Ok(0) | Err(_))), "still open: {end:?}");
        plane.shutdown().await;
    }

    /// Discovery adds a worker and removes it before its request-plane connection is up
    /// (the worker crashed right after registering, or its record expired): the connection
    /// that completes afterwards must not make it routable again, and is closed. A
    /// current-thread runtime makes the removal win the race every time: the connecting task
    /// cannot run until `follow` has taken both changes.
    #[tokio::test(flavor = "current_thread")]
    async fn a_worker_that_left_while_being_connected_is_not_routed_to() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = Pool::new(REMOVAL_GRACE);
        let (changes, _forgotten, plane, _tracker, stop) = following(&pool).await;
        // Both sent before `follow` first runs (it waits for this task to yield).
        let worker = instance(listener.local_addr().unwrap());
        changes.send(Change::Added(worker)).await.unwrap();
        changes.send(Change::Removed(7)).await.unwrap();
        let mut conn = accept_worker(&listener).await;
        // The frontend closes the connection it no longer wants: the worker reads its end.
        let mut byte = [0u8; 1];
        let end = tokio::time::timeout(BOUND, conn.read(&mut byte)).await;
        assert!(
            matches!(end, Ok(Ok(0) | Err(_))),
            "the connection to a worker that left stays open: {end:?}"
        );
        assert!(pool.is_empty(), "routable: {:?}", pool.ids());
        stop.cancel();
        plane.shutdown().await;
    }
}
