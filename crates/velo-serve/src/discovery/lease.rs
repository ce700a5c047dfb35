//! A worker's registration: its instance file, kept alive by touching it every third of the
//! TTL from a thread of its own (so a busy runtime cannot let the lease lapse), and deleted
//! when the lease is dropped (a clean exit).

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::SystemTime;

use super::{DiscoveryConfig, Instance, publish};

/// A published instance. Dropping it (or [`close`](Self::close)) deletes its file.
#[derive(Debug)]
pub struct Lease {
    path: PathBuf,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Lease {
    /// Publishes `instance` under `config` and keeps it alive.
    ///
    /// # Errors
    ///
    /// The I/O error creating the directory or the file.
    pub fn publish(config: &DiscoveryConfig, instance: &Instance) -> std::io::Result<Self> {
        std::fs::create_dir_all(config.dir())?;
        let path = config.path(instance.instance_id);
        publish(&path, &instance.to_json())?;
        let (stop, stopped) = mpsc::channel::<()>();
        let interval = config.refresh_interval();
        let touched = path.clone();
        let thread = std::thread::Builder::new()
            .name("velo-lease".into())
            .spawn(move || {
                // Ends when the sender is dropped (or sends).
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    touch(&touched);
                }
            })?;
        tracing::info!(path = %path.display(), "registered in discovery");
        Ok(Self {
            path,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The instance file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Deletes the file and stops refreshing it.
    pub fn close(mut self) {
        self.end();
    }

    /// Stops refreshing but leaves the file, as a crashed worker does: readers expire it.
    pub fn abandon(mut self) {
        self.stop_refreshing();
    }

    fn stop_refreshing(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    fn end(&mut self) {
        self.stop_refreshing();
        match std::fs::remove_file(&self.path) {
            Ok(()) => tracing::info!(path = %self.path.display(), "left discovery"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot delete the instance file")
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // After `close` or `abandon` there is nothing left to do.
        if self.stop.is_some() {
            self.end();
        }
    }
}

/// Refreshes the lease; a file someone deleted stays deleted (the instance was removed).
fn touch(path: &std::path::Path) {
    let r = OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(SystemTime::now()));
    if let Err(e) = r {
        tracing::warn!(path = %path.display(), error = %e, "cannot refresh the lease");
    }
}
