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
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use response_plane::FrontendPlane;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::discovery::watch::{Change, Forget};
use crate::work::WorkChannel;

/// How long a removed worker's open streams may keep generating before they are ended.
pub const REMOVAL_GRACE: Duration = Duration::from_secs(10);

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
    workers: RwLock<HashMap<u64, Arc<WorkerEntry>>>,
    turn: AtomicUsize,
    removal_grace: Duration,
}

impl Pool {
    /// An empty pool; removed workers' streams get `removal_grace`.
    pub fn new(removal_grace: Duration) -> Arc<Self> {
        Arc::new(Self {
            workers: RwLock::new(HashMap::new()),
            turn: AtomicUsize::new(0),
            removal_grace,
        })
    }

    /// Workers routable right now.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether no worker is routable.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids of the routable workers.
    pub fn ids(&self) -> Vec<u64> {
        self.read().keys().copied().collect()
    }

    /// The least loaded worker not in `tried` (ties broken in turn), counted as assigned.
    pub fn pick(&self, tried: &[u64]) -> Option<Assigned> {
        let workers = self.read();
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

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<u64, Arc<WorkerEntry>>> {
        self.workers.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn insert(&self, entry: Arc<WorkerEntry>) {
        let old = self
            .workers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(entry.id, entry);
        if let Some(old) = old {
            old.channel.close();
        }
    }

    fn take(&self, id: u64) -> Option<Arc<WorkerEntry>> {
        self.workers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id)
    }
}

/// Keeps `pool` in step with discovery until `stop`: connects to added workers, removes the
/// ones that left (see the module docs).
pub async fn follow(
    pool: Arc<Pool>,
    plane: FrontendPlane,
    mut changes: mpsc::Receiver<Change>,
    forget: Forget,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    loop {
        // Cancel safety: `recv` loses nothing when `stop` wins.
        let change = tokio::select! {
            c = changes.recv() => c,
            () = stop.cancelled() => None,
        };
        match change {
            None => return,
            Some(Change::Added(instance)) => {
                let ctx = (pool.clone(), plane.clone(), forget.clone(), tracker.clone());
                tracker.spawn(connect(instance, ctx));
            }
            Some(Change::Removed(id)) => remove(&pool, &plane, &tracker, id, "left discovery"),
        }
    }
}

type Context = (Arc<Pool>, FrontendPlane, Forget, TaskTracker);

/// Connects to a worker's request plane and adds it; forgets it (to be retried on the next
/// scan) when that fails, and removes it when the connection is lost later.
async fn connect(instance: crate::discovery::Instance, (pool, plane, forget, tracker): Context) {
    let id = instance.instance_id;
    let Some(addr) = instance.address() else {
        tracing::warn!(instance = format!("{id:x}"), transport = ?instance.transport, "unusable worker address");
        return;
    };
    let channel = match WorkChannel::connect(addr, &tracker).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(instance = format!("{id:x}"), %addr, error = %e, "cannot reach worker");
            forget.forget(id).await;
            return;
        }
    };
    let entry = Arc::new(WorkerEntry {
        id,
        channel: channel.clone(),
        in_flight: AtomicU64::new(0),
        gone: CancellationToken::new(),
    });
    pool.insert(entry.clone());
    tracing::info!(instance = format!("{id:x}"), %addr, workers = pool.len(), "worker added");
    channel.lost().await;
    // Still this entry (not replaced by a newer record)? Then the worker is gone.
    let current = pool.read().get(&id).is_some_and(|w| Arc::ptr_eq(w, &entry));
    if current {
        remove(&pool, &plane, &tracker, id, "request plane connection lost");
        forget.forget(id).await;
    }
}

/// Takes a worker out of routing and ends its streams (see the module docs).
pub fn remove(pool: &Pool, plane: &FrontendPlane, tracker: &TaskTracker, id: u64, why: &str) {
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
    let grace = pool.removal_grace;
    tracker.spawn(async move {
        tokio::time::sleep(grace).await;
        entry.gone.cancel();
    });
}
