//! The raft log's writer thread. An append leaves the raft loop as a buffer, and one thread
//! writes the buffers in the order they were submitted (and makes them durable), so the loop
//! goes on during the device's write latency: a leader reads requests, proposes the next batch
//! and answers the last one while its own append is in flight, as raft lets it (it counts its
//! own vote for an entry only once the append is durable), and a follower takes the next append
//! while it writes this one. Whoever submits learns of completions through a sequence number:
//! everything up to `durable_seq` is on disk.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::error::StorageError;
use crate::storage::{append_error, BlockBuf};

/// The longest pause between attempts to write to a full disk.
const NO_SPACE_RETRY_MAX: Duration = Duration::from_secs(1);

/// Buffers kept for reuse; more only while that many writes are in flight.
const SPARE_BUFFERS: usize = 4;

struct Job {
    seq: u64,
    file: Arc<File>,
    path: Arc<Path>,
    buf: BlockBuf,
    /// The aligned slice of `buf` that is written (`BlockBuf::aligned(len)`).
    len: usize,
    offset: u64,
    /// fdatasync the file after the write (a file not opened with `O_DSYNC`).
    sync: bool,
}

struct Done {
    /// Every job up to this one is written.
    seq: u64,
    result: Result<(), StorageError>,
    /// Time from the first write of the group to its last sync.
    took: Duration,
    bufs: Vec<BlockBuf>,
}

pub(crate) struct WalWriter {
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    closing: Arc<AtomicBool>,
    notify: Arc<Notify>,
    submitted_seq: u64,
    durable_seq: u64,
    spare_bufs: Vec<BlockBuf>,
    /// How long each completed group of writes took, until taken by `take_write_times`.
    write_times: Vec<Duration>,
}

impl WalWriter {
    pub(crate) fn start() -> Result<WalWriter, StorageError> {
        let (jobs_tx, jobs_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let closing = Arc::new(AtomicBool::new(false));
        let notify = Arc::new(Notify::new());
        let thread = std::thread::Builder::new()
            .name("wal-writer".into())
            .spawn({
                let closing = closing.clone();
                let notify = notify.clone();
                move || write_jobs(jobs_rx, done_tx, &closing, &notify)
            })
            .map_err(|source| StorageError::Io {
                path: "wal-writer thread".into(),
                source,
            })?;
        Ok(WalWriter {
            jobs: Some(jobs_tx),
            done: done_rx,
            thread: Some(thread),
            closing,
            notify,
            submitted_seq: 0,
            durable_seq: 0,
            spare_bufs: Vec::new(),
            write_times: Vec::new(),
        })
    }

    /// Woken whenever writes complete.
    pub(crate) fn notify(&self) -> Arc<Notify> {
        self.notify.clone()
    }

    pub(crate) fn submitted_seq(&self) -> u64 {
        self.submitted_seq
    }

    /// Drops the buffers kept for reuse.
    pub(crate) fn drop_spare_buffers(&mut self) {
        self.spare_bufs.clear();
    }

    #[cfg(test)]
    pub(crate) fn spare_buffers_empty(&mut self) -> bool {
        // Completed writes hand their buffers back when their completion is taken.
        self.durable_seq().expect("writes succeed");
        self.spare_bufs.is_empty()
    }

    /// A buffer for the next `submit`, whatever its contents.
    pub(crate) fn buffer(&mut self) -> BlockBuf {
        self.spare_bufs.pop().unwrap_or_default()
    }

    /// Queues the write of `buf.aligned(len)` at `offset`; returns its sequence number.
    pub(crate) fn submit(
        &mut self,
        file: &Arc<File>,
        path: &Arc<Path>,
        buf: BlockBuf,
        len: usize,
        offset: u64,
        sync: bool,
    ) -> u64 {
        self.submitted_seq += 1;
        let job = Job {
            seq: self.submitted_seq,
            file: file.clone(),
            path: path.clone(),
            buf,
            len,
            offset,
            sync,
        };
        self.jobs
            .as_ref()
            .expect("writer runs until dropped")
            .send(job)
            .expect("wal-writer thread vanished");
        self.submitted_seq
    }

    /// The highest sequence number whose write (and every earlier one) is durable, without
    /// waiting. A failed write is returned as the error it was: the log's tail is unknown.
    pub(crate) fn durable_seq(&mut self) -> Result<u64, StorageError> {
        while let Ok(done) = self.done.try_recv() {
            self.absorb(done)?;
        }
        Ok(self.durable_seq)
    }

    /// Waits until every submitted write is durable.
    pub(crate) fn wait_all(&mut self) -> Result<(), StorageError> {
        while self.durable_seq < self.submitted_seq {
            let done = self.done.recv().expect("wal-writer thread vanished");
            self.absorb(done)?;
        }
        Ok(())
    }

    pub(crate) fn take_write_times(&mut self) -> Vec<Duration> {
        std::mem::take(&mut self.write_times)
    }

    fn absorb(&mut self, done: Done) -> Result<(), StorageError> {
        done.result?;
        assert!(done.seq > self.durable_seq, "write completions go backward");
        assert!(
            done.seq <= self.submitted_seq,
            "a write completed that was never submitted"
        );
        self.durable_seq = done.seq;
        self.write_times.push(done.took);
        let room = SPARE_BUFFERS.saturating_sub(self.spare_bufs.len());
        self.spare_bufs.extend(done.bufs.into_iter().take(room));
        Ok(())
    }
}

impl Drop for WalWriter {
    /// Writes already submitted finish (or give up on a full disk) before the storage is gone,
    /// so a reopened directory never sees a write of the old instance land late.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread: takes every job queued so far, writes them in order, syncs each file that needs
/// it once, and reports the group's last sequence number.
fn write_jobs(jobs: mpsc::Receiver<Job>, done: mpsc::Sender<Done>, closing: &AtomicBool, notify: &Notify) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        group.extend(jobs.try_iter());
        let started = Instant::now();
        let result = write_group(&mut group, closing);
        let seq = group.last().expect("a group has a job").seq;
        let bufs = group.into_iter().map(|job| job.buf).collect();
        let failed = result.is_err();
        let report = Done {
            seq,
            result,
            took: started.elapsed(),
            bufs,
        };
        if done.send(report).is_err() {
            return;
        }
        notify.notify_one();
        if failed {
            return;
        }
    }
}

fn write_group(group: &mut [Job], closing: &AtomicBool) -> Result<(), StorageError> {
    for job in group.iter_mut() {
        let bytes = job.buf.aligned(job.len);
        write_retrying_while_full(&job.file, &job.path, bytes, job.offset, closing)?;
    }
    let mut synced: Option<&Arc<File>> = None;
    for job in group.iter().rev().filter(|job| job.sync) {
        if synced.is_some_and(|file| Arc::ptr_eq(file, &job.file)) {
            continue;
        }
        job.file.sync_data().map_err(|source| StorageError::Io {
            path: job.path.to_path_buf(),
            source,
        })?;
        synced = Some(&job.file);
    }
    Ok(())
}

/// Writes `bytes` at `offset`. A full disk is waited out (the write is repeated whole, so a
/// partial one leaves nothing behind): nothing after it may be written first, and the raft loop
/// refuses new writes meanwhile (`DiskStorage::has_room_for`).
fn write_retrying_while_full(
    file: &File,
    path: &Path,
    bytes: &[u8],
    offset: u64,
    closing: &AtomicBool,
) -> Result<(), StorageError> {
    let mut retry = Duration::from_millis(10);
    let mut warned_at: Option<Instant> = None;
    loop {
        match file.write_all_at(bytes, offset) {
            Ok(()) => return Ok(()),
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
                    && !closing.load(Ordering::Relaxed) =>
            {
                if warned_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                    tracing::warn!(path = %path.display(), "an append to the raft log found the disk full; retrying until space returns");
                    warned_at = Some(Instant::now());
                }
                std::thread::sleep(retry);
                retry = (retry * 2).min(NO_SPACE_RETRY_MAX);
            }
            Err(source) => return Err(append_error(path)(source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_bytes(writer: &mut WalWriter, bytes: &[u8]) -> (BlockBuf, usize) {
        let mut buf = writer.buffer();
        buf.aligned(bytes.len()).copy_from_slice(bytes);
        (buf, bytes.len())
    }

    #[test]
    fn writes_land_in_the_order_they_were_submitted() {
        let dir = tempfile::tempdir().unwrap();
        let path: Arc<Path> = dir.path().join("log").into();
        let file = Arc::new(File::create(&path).unwrap());
        let mut writer = WalWriter::start().unwrap();
        let mut seqs = Vec::new();
        for text in ["first", "second", "third!"] {
            let (buf, len) = job_bytes(&mut writer, text.as_bytes());
            seqs.push(writer.submit(&file, &path, buf, len, 0, true));
        }
        assert_eq!(seqs, vec![1, 2, 3]);
        writer.wait_all().unwrap();
        assert_eq!(writer.durable_seq().unwrap(), 3);
        assert_eq!(std::fs::read(&path).unwrap(), b"third!");
        assert!(!writer.take_write_times().is_empty());
    }

    #[test]
    fn a_failed_write_is_reported_not_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path: Arc<Path> = dir.path().join("log").into();
        std::fs::write(&path, b"").unwrap();
        let read_only = Arc::new(File::open(&path).unwrap());
        let mut writer = WalWriter::start().unwrap();
        let (buf, len) = job_bytes(&mut writer, b"lost");
        writer.submit(&read_only, &path, buf, len, 0, false);
        match writer.wait_all() {
            Err(StorageError::Io { path: failed, .. }) => assert_eq!(failed, path.to_path_buf()),
            other => panic!("expected an I/O error, got {other:?}"),
        }
    }
}
