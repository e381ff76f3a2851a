//! A node's witness, durable: every change is appended to `witness.log` in the node's state
//! directory, and an acceptance (or a collection) is answered only once the file is synced, so a
//! whole-cluster restart loses no record a fast-path write counted on. Appends are batched: one
//! sync thread writes whatever accumulated while the previous sync ran, so many concurrent
//! acceptances share an fsync. The file is rewritten from the live records when it has grown
//! well past them. On open, a torn tail (a crash mid-append) is cut off; any other damage stops
//! the node.
//!
//! Peers reach the witness through the transport's request channel ([`serve_one`]): `RECORD`
//! (body: an encoded `Event::Accepted`; response: [`encode_verdict`]) and `COLLECT` (body: a term;
//! response: the pool as encoded `Event::Accepted`s).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use chorus_log::storage::create_dir_durably;
use chorus_log::PeerRequest;
use tokio::sync::oneshot;

use crate::rifl::ClientId;
use crate::witness::{file, Event, Record, Rejection, ReplayError, Witness};

pub const SERVICE_RECORD: u8 = 1;
pub const SERVICE_COLLECT: u8 = 2;

/// The file is rewritten once it is this many times larger than its live records (and past
/// `COMPACT_MIN_BYTES`).
const COMPACT_RATIO: u64 = 4;
const COMPACT_MIN_BYTES: u64 = 1 << 20;
const FILE_NAME: &str = "witness.log";

#[derive(Debug, thiserror::Error)]
pub enum WitnessError {
    #[error("witness file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("witness file {path} is corrupt at byte {at}: {what}")]
    Corrupt {
        path: PathBuf,
        at: usize,
        what: &'static str,
    },
    #[error("witness file {path} is inconsistent: {source}")]
    Inconsistent {
        path: PathBuf,
        #[source]
        source: ReplayError,
    },
}

/// Events decided but not yet synced, and who waits for them.
#[derive(Default)]
struct Unsynced {
    bytes: Vec<u8>,
    waiters: Vec<oneshot::Sender<()>>,
    shutting_down: bool,
}

struct Shared {
    witness: Mutex<Witness>,
    unsynced: Mutex<Unsynced>,
    work: Condvar,
}

pub struct DurableWitness {
    shared: Arc<Shared>,
    dir: PathBuf,
    accepted: Arc<chorus_metrics::Counter>,
}

impl DurableWitness {
    /// Opens (or creates) the witness in `dir`, replaying its file.
    pub fn open(dir: &Path, max_bytes: usize) -> Result<DurableWitness, WitnessError> {
        let path = dir.join(FILE_NAME);
        let io = |source| WitnessError::Io {
            path: path.clone(),
            source,
        };
        create_dir_durably(dir).map_err(io)?;
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io(e)),
        };
        let events = match file::decode_all(&bytes) {
            Ok(events) => events,
            Err((events, file::DecodeError::TornTail { valid_bytes })) => {
                tracing::warn!(
                    path = %path.display(), torn_bytes = bytes.len() - valid_bytes,
                    "cutting a torn tail off the witness file"
                );
                let f = OpenOptions::new().write(true).open(&path).map_err(io)?;
                f.set_len(valid_bytes as u64).map_err(io)?;
                f.sync_all().map_err(io)?;
                events
            }
            Err((_, file::DecodeError::Corrupt { at, what })) => {
                return Err(WitnessError::Corrupt { path, at, what });
            }
        };
        let witness = Witness::replay(max_bytes, events).map_err(|source| WitnessError::Inconsistent {
            path: path.clone(),
            source,
        })?;
        tracing::info!(records = witness.len(), "witness opened");
        let shared = Arc::new(Shared {
            witness: Mutex::new(witness),
            unsynced: Mutex::new(Unsynced::default()),
            work: Condvar::new(),
        });
        let appender = OpenOptions::new().create(true).append(true).open(&path).map_err(io)?;
        // The file may be new (or left unsynced by an earlier start): records synced into it are
        // durable only once its directory entry is.
        File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        let syncing = shared.clone();
        let sync_dir = dir.to_path_buf();
        std::thread::Builder::new()
            .name("witness-sync".into())
            .spawn(move || sync_loop(&syncing, &sync_dir, appender))
            .map_err(io)?;
        Ok(DurableWitness {
            shared,
            dir: dir.to_path_buf(),
            accepted: chorus_metrics::counter(
                "chorus_curp_witness_accepted_total",
                "Records this node's witness accepted (held durably) for fast-path writes",
            ),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records `event` as decided; the receiver resolves once it is on disk.
    fn persist(&self, event: &Event) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut unsynced = self.shared.unsynced.lock().expect("not poisoned");
        file::encode(event, &mut unsynced.bytes);
        unsynced.waiters.push(tx);
        self.shared.work.notify_one();
        rx
    }

    /// Accepts `record` if it commutes with everything held; answers once that is durable.
    pub async fn accept(&self, record: Record) -> Result<(), Rejection> {
        let synced = {
            let mut witness = self.shared.witness.lock().expect("not poisoned");
            let Some(event) = witness.accept(record)? else {
                return Ok(());
            };
            // Appended under the witness lock, so the file holds events in the order decided.
            self.persist(&event)
        };
        synced.await.expect("the witness sync thread outlives its witness");
        self.accepted.inc();
        Ok(())
    }

    /// The write `(client, seq)` was applied: the log holds it now. Not waited for: a drop lost
    /// in a crash is made again when the restarted node applies the write again.
    pub fn applied(&self, client: ClientId, seq: u64) {
        let mut witness = self.shared.witness.lock().expect("not poisoned");
        if let Some(event) = witness.applied(client, seq) {
            drop(self.persist(&event));
        }
    }

    /// Drops the records whose writes `settled` says applied here already (or never can): after
    /// this node's state jumped (a snapshot installed, a restart) past writes it then never
    /// applies one by one.
    pub fn drop_settled(&self, settled: impl Fn(ClientId, u64) -> bool) {
        let mut witness = self.shared.witness.lock().expect("not poisoned");
        for (client, seq) in witness.ids() {
            if settled(client, seq) {
                if let Some(event) = witness.applied(client, seq) {
                    drop(self.persist(&event));
                }
            }
        }
    }

    /// A leader of `term` recovers: refuses older terms from now on (durably) and returns the
    /// pool.
    pub async fn collect(&self, term: u64) -> Vec<Record> {
        let (pool, synced) = {
            let mut witness = self.shared.witness.lock().expect("not poisoned");
            let (pool, event) = witness.collect(term);
            (pool, event.map(|event| self.persist(&event)))
        };
        if let Some(synced) = synced {
            synced.await.expect("the witness sync thread outlives its witness");
        }
        pool
    }

    /// The recovery for `term` has finished: records of older terms go.
    pub fn reset(&self, term: u64) {
        let mut witness = self.shared.witness.lock().expect("not poisoned");
        let event = witness.reset(term);
        drop(self.persist(&event));
    }

    /// Records held and their bytes.
    pub fn size(&self) -> (usize, usize) {
        let witness = self.shared.witness.lock().expect("not poisoned");
        (witness.len(), witness.held_bytes())
    }
}

impl Drop for DurableWitness {
    fn drop(&mut self) {
        self.shared.unsynced.lock().expect("not poisoned").shutting_down = true;
        self.shared.work.notify_one();
    }
}

/// Writes and syncs what accumulated, wakes its waiters, and compacts the file when it has
/// outgrown its live records. A failed write or sync stops the node: after a failed fsync the
/// kernel may have dropped the pages, and acceptances must not be answered on a guess.
fn sync_loop(shared: &Shared, dir: &Path, mut appender: File) {
    let path = dir.join(FILE_NAME);
    let mut file_bytes = appender.metadata().map(|m| m.len()).unwrap_or(0);
    loop {
        let (bytes, waiters) = {
            let mut unsynced = shared.unsynced.lock().expect("not poisoned");
            while unsynced.bytes.is_empty() && !unsynced.shutting_down {
                unsynced = shared.work.wait(unsynced).expect("not poisoned");
            }
            if unsynced.bytes.is_empty() {
                return;
            }
            (
                std::mem::take(&mut unsynced.bytes),
                std::mem::take(&mut unsynced.waiters),
            )
        };
        if let Err(e) = appender.write_all(&bytes).and_then(|()| appender.sync_data()) {
            panic!("cannot append to the witness file {}: {e}", path.display());
        }
        file_bytes += bytes.len() as u64;
        for waiter in waiters {
            let _ = waiter.send(());
        }
        let live_bytes = shared.witness.lock().expect("not poisoned").held_bytes() as u64;
        if file_bytes > COMPACT_MIN_BYTES && file_bytes > COMPACT_RATIO * live_bytes {
            appender = compact(shared, dir);
            file_bytes = appender.metadata().map(|m| m.len()).unwrap_or(0);
        }
    }
}

/// Rewrites the file from the witness as it is now. Events decided meanwhile are appended to
/// the new file after it; replaying one whose effect the rewrite already holds changes nothing.
fn compact(shared: &Shared, dir: &Path) -> File {
    let path = dir.join(FILE_NAME);
    let staging = dir.join(format!("{FILE_NAME}.compacting"));
    let events = shared.witness.lock().expect("not poisoned").snapshot_events();
    let mut bytes = Vec::new();
    for event in &events {
        file::encode(event, &mut bytes);
    }
    let written = (|| -> std::io::Result<File> {
        let mut f = File::create(&staging)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&staging, &path)?;
        File::open(dir)?.sync_all()?;
        OpenOptions::new().append(true).open(&path)
    })();
    match written {
        Ok(appender) => appender,
        Err(e) => panic!("cannot rewrite the witness file {}: {e}", path.display()),
    }
}

/// The response to a `RECORD` request: empty when accepted, else why not.
pub fn encode_verdict(verdict: &Result<(), Rejection>) -> Vec<u8> {
    match verdict {
        Ok(()) => Vec::new(),
        Err(Rejection::Conflict) => vec![1],
        Err(Rejection::StaleTerm { collected_for }) => {
            let mut out = vec![2];
            out.extend_from_slice(&collected_for.to_le_bytes());
            out
        }
        Err(Rejection::Full) => vec![3],
    }
}

pub fn decode_verdict(body: &[u8]) -> Option<Result<(), Rejection>> {
    Some(match body {
        [] => Ok(()),
        [1] => Err(Rejection::Conflict),
        [2, term @ ..] => Err(Rejection::StaleTerm {
            collected_for: u64::from_le_bytes(term.try_into().ok()?),
        }),
        [3] => Err(Rejection::Full),
        _ => return None,
    })
}

/// Answers one peer's request to the witness: `RECORD` or `COLLECT`.
pub async fn serve_one(witness: &DurableWitness, request: PeerRequest) {
    match request.service {
        SERVICE_RECORD => match file::decode_all(&request.body).as_deref() {
            Ok([Event::Accepted(record)]) => {
                let verdict = witness.accept(record.clone()).await;
                request.respond(&encode_verdict(&verdict));
            }
            _ => tracing::warn!(from = request.from, "malformed witness record; ignored"),
        },
        SERVICE_COLLECT => match request.body.as_slice().try_into() {
            Ok(term) => {
                let pool = witness.collect(u64::from_le_bytes(term)).await;
                let mut body = Vec::new();
                for record in pool {
                    file::encode(&Event::Accepted(record), &mut body);
                }
                request.respond(&body);
            }
            Err(_) => tracing::warn!(from = request.from, "malformed witness collection; ignored"),
        },
        other => tracing::warn!(from = request.from, service = other, "unknown peer service; ignored"),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn record(connection: u64, key: &str, term: u64) -> Record {
        sized_record(connection, key, term, 100)
    }

    fn sized_record(connection: u64, key: &str, term: u64, command_bytes: usize) -> Record {
        Record::new(
            ClientId {
                incarnation: 1 << 16,
                connection,
            },
            1,
            term,
            vec![Bytes::copy_from_slice(key.as_bytes())],
            Bytes::from(vec![7u8; command_bytes]),
        )
    }

    /// Found by the chaos harness's power cuts: a witness that created its file at start-up and
    /// never synced the directories lost every record it had accepted when the power went.
    #[tokio::test]
    async fn records_accepted_by_a_witness_created_moments_ago_survive_a_power_cut() {
        let mountpoint = tempfile::tempdir().unwrap();
        let disk = chorus_powercut::Disk::new();
        let Ok(mount) = chorus_powercut::mount_for_test(&disk, mountpoint.path()) else {
            return;
        };
        let dir = mountpoint.path().join("data/witness");
        {
            let w = DurableWitness::open(&dir, 1 << 20).unwrap();
            w.accept(record(1, "a", 5)).await.unwrap();
        }
        drop(mount);
        disk.cut_power();
        let _mount = disk.mount(mountpoint.path()).unwrap();
        let w = DurableWitness::open(&dir, 1 << 20).unwrap();
        assert_eq!(
            w.shared.witness.lock().unwrap().len(),
            1,
            "the accepted record was lost"
        );
    }

    #[tokio::test]
    async fn accepted_records_and_collections_survive_a_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        {
            let w = DurableWitness::open(dir.path(), 1 << 20).unwrap();
            w.accept(record(1, "a", 5)).await.unwrap();
            w.accept(record(2, "b", 5)).await.unwrap();
            assert_eq!(w.accept(record(3, "a", 5)).await, Err(Rejection::Conflict));
            w.applied(record(2, "b", 5).client, 1);
            assert_eq!(w.collect(6).await.len(), 1);
        }
        let path = dir.path().join(FILE_NAME);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[9, 0, 0]);
        std::fs::write(&path, &bytes).unwrap();
        let w = DurableWitness::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(w.size().0, 1, "record a is back; b was dropped");
        assert_eq!(
            w.accept(record(4, "c", 5)).await,
            Err(Rejection::StaleTerm { collected_for: 6 }),
            "the collection for term 6 is remembered"
        );
        assert_eq!(
            std::fs::read(&path).unwrap().len(),
            bytes.len() - 3,
            "the torn tail is gone"
        );
        let mut corrupt = std::fs::read(&path).unwrap();
        corrupt[file::HEADER_BYTES + 2] ^= 0xff;
        drop(w);
        std::fs::write(&path, &corrupt).unwrap();
        assert!(matches!(
            DurableWitness::open(dir.path(), 1 << 20),
            Err(WitnessError::Corrupt { .. })
        ));
    }

    #[tokio::test]
    async fn a_file_far_larger_than_its_records_is_rewritten_from_them() {
        let dir = tempfile::tempdir().unwrap();
        let w = DurableWitness::open(dir.path(), 1 << 20).unwrap();
        for n in 1..=300u64 {
            w.accept(sized_record(n, "k", 7, 10_000)).await.unwrap();
            w.applied(record(n, "k", 7).client, 1);
        }
        w.accept(record(0, "last", 7)).await.unwrap();
        let bytes = std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len();
        assert!(bytes < COMPACT_MIN_BYTES, "{bytes} bytes for one live record");
        drop(w);
        let w = DurableWitness::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(w.size().0, 1);
    }

    #[test]
    fn verdicts_round_trip() {
        for verdict in [
            Ok(()),
            Err(Rejection::Conflict),
            Err(Rejection::StaleTerm { collected_for: 9 }),
            Err(Rejection::Full),
        ] {
            assert_eq!(decode_verdict(&encode_verdict(&verdict)), Some(verdict));
        }
        assert_eq!(decode_verdict(&[2, 1]), None);
    }
}
