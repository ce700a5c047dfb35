//! The frontend's view of discovery: the instances bucket, rescanned whenever `notify` reports
//! a change in the directory and every third of the TTL, reported as [`Change`]s. Files older
//! than the TTL are expired (deleted) here, as Dynamo's readers do.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use notify::Watcher as _;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{DiscoveryConfig, Instance, MAX_RECORD_BYTES, TEMP_PREFIX};

/// Changes queued for the frontend before the watcher waits (discovery changes are never
/// dropped).
pub const QUEUE_CHANGES: usize = 1024;
/// Forget requests queued before the frontend waits.
const QUEUE_FORGETS: usize = 1024;

/// A change in the set of instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new instance (or one whose record changed).
    Added(Instance),
    /// An instance left: its file was deleted or expired.
    Removed(u64),
}

/// Tells the watcher to forget an instance (its connection failed): it is reported again as
/// added on the next scan if its file is still live.
#[derive(Debug, Clone)]
pub struct Forget(mpsc::Sender<u64>);

impl Forget {
    /// A `Forget` and what it sends, for a test standing in for the watcher.
    #[cfg(test)]
    pub(crate) fn channel() -> (Self, mpsc::Receiver<u64>) {
        let (tx, rx) = mpsc::channel(16);
        (Self(tx), rx)
    }

    /// Forgets `instance_id`.
    pub async fn forget(&self, instance_id: u64) {
        let _ = self.0.send(instance_id).await;
    }
}

/// How the watcher learns of changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watching {
    /// `notify` reports changes at once; rescans every third of the TTL catch the rest.
    Notify,
    /// `notify` could not be set up (inotify limits, an unsupported file system): rescans every
    /// third of the TTL only.
    RescanOnly,
}

/// Starts watching; changes arrive on the receiver until `stop`. The first scan's instances
/// are all reported as added.
///
/// # Errors
///
/// The I/O error creating the bucket directory.
pub fn start(
    config: DiscoveryConfig,
    tracker: &TaskTracker,
    stop: CancellationToken,
) -> std::io::Result<(mpsc::Receiver<Change>, Forget, Watching)> {
    let dir = config.dir();
    std::fs::create_dir_all(&dir)?;
    let wake = Arc::new(Notify::new());
    let watcher = watch_dir(&dir, wake.clone())
        .inspect_err(|e| {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch discovery; rescanning every third of the TTL only");
        })
        .ok();
    let watching = match watcher {
        Some(_) => Watching::Notify,
        None => Watching::RescanOnly,
    };
    let (tx, rx) = mpsc::channel(QUEUE_CHANGES);
    let (forget_tx, forget_rx) = mpsc::channel(QUEUE_FORGETS);
    tracker.spawn(run(config, watcher, wake, tx, forget_rx, stop));
    Ok((rx, Forget(forget_tx), watching))
}

/// A `notify` watch on `dir` that wakes `wake` on any event.
fn watch_dir(
    dir: &std::path::Path,
    wake: Arc<Notify>,
) -> notify::Result<notify::RecommendedWatcher> {
    let mut watcher = notify::recommended_watcher(move |_event: notify::Result<notify::Event>| {
        // Any event (or error) means: rescan. Coalesced by `Notify`.
        wake.notify_one();
    })?;
    watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

async fn run(
    config: DiscoveryConfig,
    _watcher: Option<notify::RecommendedWatcher>,
    wake: Arc<Notify>,
    tx: mpsc::Sender<Change>,
    mut forget: mpsc::Receiver<u64>,
    stop: CancellationToken,
) {
    let mut known: HashMap<u64, Instance> = HashMap::new();
    loop {
        let scanned = {
            let config = config.clone();
            tokio::task::spawn_blocking(move || scan(&config, SystemTime::now())).await
        };
        let Ok(now) = scanned else { return };
        for change in diff(&mut known, now) {
            // Cancel safety: a change not sent is lost only when stopping.
            tokio::select! {
                r = tx.send(change) => if r.is_err() { return },
                () = stop.cancelled() => return,
            }
        }
        // Cancel safety: every branch only waits; nothing is taken but a forget request,
        // which is applied at once.
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(config.refresh_interval()) => {}
            Some(id) = forget.recv() => { known.remove(&id); }
            () = stop.cancelled() => return,
        }
    }
}

/// The changes from `known` to `now`, applied to `known`.
fn diff(known: &mut HashMap<u64, Instance>, now: HashMap<u64, Instance>) -> Vec<Change> {
    let mut changes: Vec<Change> = known
        .keys()
        .filter(|id| !now.contains_key(id))
        .map(|&id| Change::Removed(id))
        .collect();
    for (id, instance) in &now {
        if known.get(id) != Some(instance) {
            changes.push(Change::Added(instance.clone()));
        }
    }
    *known = now;
    changes
}

/// The live instances in the bucket at `now`; expired files are deleted.
pub fn scan(config: &DiscoveryConfig, now: SystemTime) -> HashMap<u64, Instance> {
    let mut out = HashMap::new();
    let Ok(entries) = std::fs::read_dir(config.dir()) else {
        return out;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(TEMP_PREFIX) {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() || meta.len() > MAX_RECORD_BYTES {
            continue;
        }
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or(Duration::ZERO);
        if age > config.ttl {
            tracing::info!(path = %path.display(), ?age, "discovery record expired");
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let Some(instance) = read_record(&path) else {
            continue;
        };
        if config.matches(&instance) {
            out.insert(instance.instance_id, instance);
        }
    }
    out
}

fn read_record(path: &std::path::Path) -> Option<Instance> {
    let mut bytes = Vec::new();
    let file = std::fs::File::open(path).ok()?;
    file.take(MAX_RECORD_BYTES).read_to_end(&mut bytes).ok()?;
    match Instance::from_json(&bytes) {
        Ok(i) => Some(i),
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "not an endpoint instance record");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;

    use super::*;
    use crate::discovery::Transport;
    use crate::discovery::lease::Lease;

    fn config(dir: &std::path::Path, ttl: Duration) -> DiscoveryConfig {
        let root = dir.to_string_lossy().into_owned();
        DiscoveryConfig::from_lookup(
            move |v| (v == super::super::ENV_FILE_KV).then(|| root.clone()),
            ttl,
        )
        .unwrap()
    }

    fn instance(id: u64) -> Instance {
        Instance {
            namespace: "dynamo".into(),
            component: "backend".into(),
            endpoint: "generate".into(),
            instance_id: id,
            transport: Transport::Tcp("127.0.0.1:1".into()),
        }
    }

    fn temp_root(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("velo-serve-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_lease_is_listed_until_dropped_and_a_stale_file_expires_and_is_deleted() {
        let root = temp_root("lease");
        let c = config(&root, Duration::from_secs(10));
        let lease = Lease::publish(&c, &instance(1)).unwrap();
        let stale = Lease::publish(&c, &instance(2)).unwrap();
        let stale_path = stale.path().to_owned();
        stale.abandon(); // a worker killed without a clean exit
        let old = SystemTime::now() - Duration::from_secs(11);
        let f = OpenOptions::new().write(true).open(&stale_path).unwrap();
        f.set_modified(old).unwrap();
        let live = scan(&c, SystemTime::now());
        assert_eq!(live.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert!(!stale_path.exists(), "readers delete expired records");
        drop(lease);
        assert!(scan(&c, SystemTime::now()).is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn changes_are_additions_and_removals_against_what_was_known() {
        let mut known = HashMap::new();
        let first = HashMap::from([(1, instance(1)), (2, instance(2))]);
        let mut c = diff(&mut known, first);
        c.sort_by_key(|c| format!("{c:?}"));
        assert_eq!(c.len(), 2);
        let second = HashMap::from([(2, instance(2)), (3, instance(3))]);
        let c = diff(&mut known, second);
        assert!(c.contains(&Change::Removed(1)));
        assert!(c.contains(&Change::Added(instance(3))));
        assert_eq!(c.len(), 2);
    }

    #[tokio::test]
    async fn the_watcher_reports_a_deleted_file_without_waiting_for_a_rescan() {
        let root = temp_root("watch");
        // A long TTL: only notify can report the removal within the test's bound.
        let c = config(&root, Duration::from_secs(600));
        let lease = Lease::publish(&c, &instance(9)).unwrap();
        let (tracker, stop) = (TaskTracker::new(), CancellationToken::new());
        let (mut rx, _forget, watching) = start(c, &tracker, stop.clone()).unwrap();
        if watching == Watching::RescanOnly {
            eprintln!("skipped: notify cannot watch here (see the warning above)");
            return;
        }
        let bound = Duration::from_secs(20);
        let first = tokio::time::timeout(bound, rx.recv()).await.unwrap();
        assert!(matches!(first, Some(Change::Added(i)) if i.instance_id == 9));
        drop(lease);
        let next = tokio::time::timeout(bound, rx.recv()).await.unwrap();
        assert_eq!(next, Some(Change::Removed(9)));
        stop.cancel();
        let _ = std::fs::remove_dir_all(&root);
    }
}
