//! Randomized replicas driving the UniCache codec the way the raft loop does: a leader proposes
//! batches, replicates them (encoded) to followers that decode and apply them, leaders change,
//! followers restart from snapshots and install the leader's snapshot. Every seed draws its own
//! cache size and policy. Checked throughout: every follower decodes exactly the bytes the leader
//! had, and replicas whose caches are at the same version have identical caches.

use std::sync::Arc;

use bytes::Bytes;
use chorus_log::batch::{self, Origin};
use chorus_log::unicache_codec::control_entry;
use chorus_log::{EntryCodec, LogView, UniCacheCodec, UniCacheSettings};
use chorus_unicache::{CacheConfig, CsvPreprocessor, Policy};
use raft::eraftpb::{Entry, EntryType, Message, MessageType};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A log whose entries up to `offset` were compacted into a snapshot.
struct MemLog<'a> {
    offset: u64,
    entries: &'a [Entry],
}

impl LogView for MemLog<'_> {
    fn term(&self, index: u64) -> Option<u64> {
        if index == 0 {
            return Some(0);
        }
        if index <= self.offset {
            return None;
        }
        self.entries.get((index - self.offset - 1) as usize).map(|e| e.term)
    }

    fn last_index(&self) -> u64 {
        self.offset + self.entries.len() as u64
    }

    fn entries(&self, low: u64, high: u64) -> Option<Vec<Entry>> {
        if low > high || low <= self.offset || high > self.last_index() + 1 {
            return None;
        }
        Some(self.entries[(low - self.offset - 1) as usize..(high - self.offset - 1) as usize].to_vec())
    }
}

struct Replica {
    id: u64,
    codec: UniCacheCodec,
    offset: u64,
    log: Vec<Entry>,
    commit: u64,
    applied: u64,
    snapshot: Option<(u64, Vec<u8>)>,
}

impl Replica {
    fn view(&self) -> MemLog<'_> {
        MemLog {
            offset: self.offset,
            entries: &self.log,
        }
    }

    fn last_index(&self) -> u64 {
        self.offset + self.log.len() as u64
    }

    fn entry(&self, index: u64) -> &Entry {
        &self.log[(index - self.offset - 1) as usize]
    }

    fn apply_to(&mut self, commit: u64) {
        self.commit = self.commit.max(commit.min(self.last_index()));
        while self.applied < self.commit {
            let entry = self.entry(self.applied + 1).clone();
            self.codec.applied(&entry);
            self.applied += 1;
        }
    }
}

fn codec(config: CacheConfig) -> UniCacheCodec {
    UniCacheCodec::new(
        UniCacheSettings {
            cache: config,
            autotune: false,
        },
        Arc::new(CsvPreprocessor::new(b',', &[0, 1], &[(2, b' ')])),
    )
}

fn command(rng: &mut Rng, vocabulary: u64) -> Bytes {
    // Skewed choice: low numbers are much more frequent.
    let word = |rng: &mut Rng| {
        let n = rng.below(vocabulary);
        rng.below(n + 1)
    };
    let (a, b) = (word(rng), word(rng));
    let words: Vec<String> = (0..1 + rng.below(4)).map(|_| format!("w{}", word(rng))).collect();
    Bytes::from(format!("c{a},k{b},{},{}", words.join(" "), rng.next()))
}

/// Runs one seed; returns how many appends a follower rejected (and the leader resent raw).
fn run(seed: u64) -> u64 {
    let mut rng = Rng(seed);
    let policy = [Policy::Lru, Policy::Lfu, Policy::LeCaR][rng.below(3) as usize];
    let config = CacheConfig {
        policy,
        max_items: 1 + rng.below(40) as u32,
        max_bytes: 16 + rng.below(2000) as usize,
    };
    let vocabulary = 2 + rng.below(60);
    let mut replicas: Vec<Replica> = (1..=3)
        .map(|id| Replica {
            id,
            codec: codec(config),
            offset: 0,
            log: Vec::new(),
            commit: 0,
            applied: 0,
            snapshot: None,
        })
        .collect();
    let mut leader = 0usize;
    let mut term = 1u64;
    let mut encoded_entries = 0u64;
    let mut rejected = 0u64;
    let mut next_request = 1u64;

    for step in 0..1_500 {
        // The leader's codec may want a control entry in the log (it starts paused and, without
        // auto-tune, resumes at once); now and then the test pauses it too.
        let control = replicas[leader]
            .codec
            .take_proposal()
            .or_else(|| rng.chance(2).then(|| control_entry(false)));
        if let Some(data) = control {
            let mut entry = Entry {
                term,
                index: replicas[leader].last_index() + 1,
                ..Default::default()
            };
            entry.set_entry_type(EntryType::EntryNormal);
            entry.data = data;
            replicas[leader].log.push(entry);
        }
        let roll = rng.below(100);
        if roll < 40 {
            // The leader proposes a few batches.
            for _ in 0..1 + rng.below(3) {
                let commands: Vec<(u64, Bytes)> = (0..1 + rng.below(5))
                    .map(|_| {
                        next_request += 1;
                        (next_request, command(&mut rng, vocabulary))
                    })
                    .collect();
                let origin = Origin {
                    node_id: replicas[leader].id,
                    incarnation: 7,
                };
                // Most writes arrive prepared by the submitting task, as on a real node.
                let prepare = replicas[leader].codec.preparer().expect("UniCache prepares");
                for (request_id, command) in &commands {
                    if rng.below(4) > 0 {
                        replicas[leader].codec.proposed(origin, *request_id, prepare(command));
                    }
                }
                let mut entry = Entry {
                    term,
                    index: replicas[leader].last_index() + 1,
                    ..Default::default()
                };
                entry.set_entry_type(EntryType::EntryNormal);
                // Times of all sizes, so the encoding of each is exercised.
                entry.data = batch::encode(origin, rng.below(1 << 50), &commands);
                replicas[leader].log.push(entry);
            }
        } else if roll < 85 {
            // Replicate to a follower.
            let follower = (leader + 1 + rng.below(2) as usize) % 3;
            let from = replicas[follower].last_index();
            let to = replicas[leader].last_index().min(from + 1 + rng.below(6));
            // Behind the leader's compaction point raft would send a snapshot instead.
            let offset = replicas[leader].offset;
            if from >= to || from < offset || (offset > 0 && from == offset) {
                continue;
            }
            let mut msg = Message::default();
            msg.set_msg_type(MessageType::MsgAppend);
            msg.from = replicas[leader].id;
            msg.to = replicas[follower].id;
            msg.term = term;
            msg.index = from;
            msg.log_term = replicas[leader].view().term(from).expect("leader has the entry");
            msg.commit = replicas[leader].commit;
            msg.entries = (from + 1..=to).map(|i| replicas[leader].entry(i).clone()).collect();
            let originals = msg.entries.clone();
            let commit = replicas[leader].commit;
            {
                let l = &mut replicas[leader];
                let view = MemLog {
                    offset: l.offset,
                    entries: &l.log,
                };
                l.codec.encode(&mut msg, &view, commit);
            }
            encoded_entries += msg
                .entries
                .iter()
                .zip(&originals)
                .filter(|(e, o)| e.data != o.data)
                .count() as u64;
            let outcome = {
                let f = &mut replicas[follower];
                let view = MemLog {
                    offset: f.offset,
                    entries: &f.log,
                };
                f.codec.decode(&mut msg, &view)
            };
            match outcome {
                Ok(()) => {
                    assert_eq!(
                        msg.entries, originals,
                        "seed {seed} step {step}: decoded entries differ"
                    );
                    let f = &mut replicas[follower];
                    f.log.extend(msg.entries);
                    f.apply_to(msg.commit);
                    let mut response = Message::default();
                    response.set_msg_type(MessageType::MsgAppendResponse);
                    response.from = f.id;
                    response.to = msg.from;
                    response.index = f.last_index();
                    replicas[leader].codec.observe_response(&response);
                }
                Err(e) => {
                    rejected += 1;
                    let reply = e.reply.expect("a rejection goes back to the leader");
                    assert!(reply.reject && reply.to == msg.from, "seed {seed}: {reply:?}");
                    replicas[leader].codec.observe_response(&reply);
                }
            }
            // The leader commits what a majority holds.
            let mut matched: Vec<u64> = replicas.iter().map(Replica::last_index).collect();
            matched.sort_unstable();
            let majority = matched[1];
            if replicas[leader].view().term(majority) == Some(term) {
                replicas[leader].apply_to(majority);
            }
        } else if roll < 89 {
            // Leader change: the longest log wins and starts its term with an empty entry.
            let longest = replicas.iter().map(Replica::last_index).max().expect("replicas");
            let candidates: Vec<usize> = (0..3).filter(|i| replicas[*i].last_index() == longest).collect();
            leader = candidates[rng.below(candidates.len() as u64) as usize];
            term += 1;
            let index = replicas[leader].last_index() + 1;
            let mut entry = Entry {
                term,
                index,
                ..Default::default()
            };
            entry.set_entry_type(EntryType::EntryNormal);
            replicas[leader].log.push(entry);
        } else if roll < 94 {
            // A replica writes a snapshot of its applied state.
            let r = &mut replicas[rng.below(3) as usize];
            if r.applied > 0 {
                r.snapshot = Some((r.applied, r.codec.snapshot()));
            }
        } else if roll < 97 {
            // A follower restarts: its cache comes back from its snapshot and the log replays.
            let i = (leader + 1 + rng.below(2) as usize) % 3;
            let r = &mut replicas[i];
            r.codec = codec(config);
            r.applied = r.offset;
            if let Some((index, data)) = &r.snapshot {
                r.codec.restore(data, *index).expect("own snapshot restores");
                r.applied = *index;
            }
            let commit = r.commit;
            r.commit = r.applied;
            r.apply_to(commit);
        } else {
            // A lagging follower installs the leader's snapshot.
            let Some((index, data)) = replicas[leader].snapshot.clone() else {
                continue;
            };
            let i = (leader + 1 + rng.below(2) as usize) % 3;
            if replicas[i].last_index() >= index {
                continue;
            }
            let f = &mut replicas[i];
            f.codec.restore(&data, index).expect("leader snapshot restores");
            f.offset = index;
            f.log.clear();
            f.commit = index;
            f.applied = index;
            f.snapshot = Some((index, data));
        }

        for a in 0..3 {
            for b in a + 1..3 {
                if replicas[a].codec.version() == replicas[b].codec.version() {
                    assert_eq!(
                        replicas[a].codec.digest(),
                        replicas[b].codec.digest(),
                        "seed {seed} step {step}: caches at version {} differ",
                        replicas[a].codec.version()
                    );
                }
            }
        }
    }
    assert!(
        encoded_entries > 0,
        "seed {seed} ({config:?}): nothing was ever encoded"
    );
    rejected
}

#[test]
fn replicas_decode_exactly_and_keep_equal_caches_under_leader_changes_restarts_and_snapshots() {
    let rejected: u64 = (0..150).map(run).sum();
    // Leader changes and snapshot installs must have exercised the "cannot decode" path.
    assert!(rejected > 0, "no append was ever rejected");
    eprintln!("{rejected} appends rejected and resent raw over 150 seeds");
}
