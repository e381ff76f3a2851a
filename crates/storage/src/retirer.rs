//! Retires the segments a merge replaced off the applying thread. Once a manifest is persisted,
//! the replaced segments it no longer lists are renamed to spares or deleted and their
//! directories synced: ~200 files and 3–25 ms per snapshot under writes here. Every node of a
//! cluster snapshots at the same index, so done on the raft loop it stalled commits cluster-wide.
//!
//! Safe to lose: a queued segment is listed by no durable manifest, so one a crash leaves behind
//! is removed by the next start-up, which removes every unlisted segment. What must not happen is
//! a retirement overtaking a later change of the directory that reuses a queued file's name —
//! only an installed snapshot does that — so `Store::install` waits for the queue first
//! (`Retirer::wait_idle`).

use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::store::StoreError;

enum Job {
    Retire(Vec<PathBuf>),
    /// Answered once every job queued before it is done.
    Flush(mpsc::Sender<()>),
}

pub(crate) struct Retirer {
    queue: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Retirer {
    /// Starts the thread; `retire` renames or deletes the paths and syncs their directories.
    pub(crate) fn start(retire: impl Fn(&[PathBuf]) -> Result<(), StoreError> + Send + 'static) -> Retirer {
        let (queue, jobs) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("segment-retirer".into())
            .spawn(move || {
                for job in jobs {
                    match job {
                        Job::Retire(paths) => {
                            if let Err(e) = retire(&paths) {
                                tracing::warn!(error = %e,
                                    "cannot retire segments a merge replaced; the next start-up removes them");
                            }
                        }
                        Job::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .expect("spawn segment retirer");
        Retirer {
            queue: Some(queue),
            thread: Some(thread),
        }
    }

    pub(crate) fn retire(&self, paths: Vec<PathBuf>) {
        if paths.is_empty() {
            return;
        }
        self.send(Job::Retire(paths));
    }

    /// Returns once every retirement queued so far is done.
    pub(crate) fn wait_idle(&self) {
        let (done, flushed) = mpsc::channel();
        self.send(Job::Flush(done));
        flushed.recv().expect("the retirer answers every flush");
    }

    fn send(&self, job: Job) {
        let queue = self.queue.as_ref().expect("the retirer runs until dropped");
        queue.send(job).expect("the retirer thread outlives its queue");
    }
}

impl Drop for Retirer {
    /// Finishes the retirements queued, so a directory reopened in this process never has files
    /// renamed under it.
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
