//! Deletes the raft log's covered segments off the raft loop. Unlinking a zero-filled segment
//! and syncing its directory took up to 90 ms here under writes, and every node compacts at the
//! same index at about the same time: done on the loop, it stalled every commit of the cluster
//! at each snapshot. A thread of its own deletes them, in the order they were covered.
//!
//! Safe to lose: a segment is queued only once the truncation record that covers it is
//! durable (the loop no longer waits for that record either), so one a crash leaves behind is read past on the next open, as when a deletion on
//! the loop was cut short. Deletions stay in order, and after one fails none follows: a later
//! segment gone while an earlier one stays would leave a gap that opening refuses.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::storage::sync_dir;

pub(crate) struct SegmentRemover {
    queue: Option<mpsc::Sender<Vec<PathBuf>>>,
    thread: Option<JoinHandle<()>>,
}

impl SegmentRemover {
    pub(crate) fn start(dir: &Path) -> std::io::Result<SegmentRemover> {
        let (queue, queued) = mpsc::channel::<Vec<PathBuf>>();
        let dir = dir.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("log-segment-remover".into())
            .spawn(move || {
                let mut failed = false;
                for paths in queued {
                    if failed {
                        continue;
                    }
                    for path in &paths {
                        match std::fs::remove_file(path) {
                            Ok(()) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => {
                                tracing::error!(path = %path.display(), error = %e,
                                    "cannot delete a compacted raft log segment; keeping this and every later one");
                                failed = true;
                                break;
                            }
                        }
                    }
                    if let Err(e) = sync_dir(&dir) {
                        tracing::warn!(error = %e, "cannot sync the raft log's directory after deleting segments");
                    }
                }
            })?;
        Ok(SegmentRemover {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Queues `paths` (oldest first) for deletion.
    pub(crate) fn remove(&self, paths: Vec<PathBuf>) {
        let queue = self.queue.as_ref().expect("the remover runs until dropped");
        queue.send(paths).expect("the remover thread outlives its queue");
    }
}

impl Drop for SegmentRemover {
    /// Finishes the deletions queued, so a directory reopened in this process never has files
    /// vanish under it.
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
