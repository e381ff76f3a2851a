//! LDC's cost-benefit admission (CBA, `docs/ldc.md`): how many of the hottest objects every node
//! caches though another node owns them. Replicating an object makes its reads local on every
//! node but costs (N − 1) copies of coverage; owning it once covers more of the data set but makes
//! (N − 1)/N of its reads remote. Which wins depends on the popularity curve and on what a local
//! hit, a remote hit and a device read cost on this machine — all three measured here, never
//! assumed.
//!
//! Popularity comes from a count-min sketch of this node's reads (conservative update, halved
//! every `WINDOW_READS` reads). Each read's estimate puts it in a level (the estimate's power of
//! two); a level's share of the reads and its keys' mean estimate give how many keys it holds, so
//! the levels form a popularity curve, hot to cold, ending in a uniform remainder over the keys
//! too cold to tell apart. The expected time per read is piecewise linear in the number of
//! replicated objects `r`, so its minimum is at a breakpoint; every breakpoint is evaluated.
//! The decision becomes an estimate threshold: a key another node owns is cached here when its
//! estimate reaches it.

use std::time::Duration;

/// Counters per row of the sketch (a power of two).
const WIDTH: usize = 1 << 19;
const ROWS: usize = 4;
/// Reads between halvings of the sketch: popularity is that of about the last two windows.
const WINDOW_READS: u64 = WIDTH as u64;
/// Levels of estimates: level `l` holds estimates in [2^l, 2^(l+1)).
const LEVELS: usize = 16;
/// Levels below this are too few reads to tell a hot key from chance: the cold rest.
const FIRST_RESOLVED_LEVEL: usize = 4;
/// Reads a decision needs since the last one.
const MIN_READS_PER_DECISION: u64 = 4_096;
/// Weight of a new sample in the measured costs' moving averages.
const COST_SMOOTHING: f64 = 0.05;
/// While fetching does not pay, one miss in this many still asks the owner, so that what a
/// remote hit costs stays measured.
const PROBE_EVERY: u32 = 32;

/// What reading a value costs, by where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadKind {
    LocalHit,
    RemoteHit,
    Device,
}

/// The node and its cache, as a decision sees them.
#[derive(Clone, Copy, Debug)]
pub struct CacheShape {
    pub nodes: usize,
    /// Objects one node's cache holds.
    pub capacity_objects: f64,
    /// Keys in the data set.
    pub keys: f64,
}

/// Mean time of each kind of read, in µs.
#[derive(Clone, Copy, Debug)]
pub struct Costs {
    pub local_us: f64,
    pub remote_us: f64,
    pub device_us: f64,
}

/// Cold or hot, as far as fetching a key is concerned (`Admission::worth_fetching`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchClass(usize);

/// A stretch of the popularity curve: `keys` keys that together take `share` of the reads.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Stretch {
    keys: f64,
    share: f64,
}

/// The reads of one level since the last decision.
#[derive(Clone, Copy, Default)]
struct LevelReads {
    reads: u64,
    estimate_sum: u64,
}

pub struct Admission {
    sketch: Vec<u16>,
    reads_since_halving: u64,
    /// The count a key read on every read would have now (halved with the sketch): what an
    /// estimate is measured against.
    full_weight: f64,
    levels: [LevelReads; LEVELS],
    reads: u64,
    full_weight_sum: f64,
    /// Keys whose estimate reaches this are cached by every node; `u32::MAX`: none.
    threshold: u32,
    replicated_objects: u64,
    local_us: Option<f64>,
    remote_us: Option<f64>,
    device_us: Option<f64>,
    /// Share of fetches the owner answered with the value (moving average), for keys too cold to
    /// tell apart and for hot ones: an owner caches most of its hot keys and few cold ones, so
    /// fetching may pay for the one and not the other.
    fetch_hit_ratio: [Option<f64>; 2],
    misses_since_probe: [u32; 2],
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            sketch: vec![0; WIDTH * ROWS],
            reads_since_halving: 0,
            full_weight: 0.0,
            levels: [LevelReads::default(); LEVELS],
            reads: 0,
            full_weight_sum: 0.0,
            threshold: u32::MAX,
            replicated_objects: 0,
            local_us: None,
            remote_us: None,
            device_us: None,
            fetch_hit_ratio: [None; 2],
            misses_since_probe: [0; 2],
        }
    }
}

/// The sketch's counter of `hash` in each row (double hashing from one 64-bit hash).
fn slots(hash: u64) -> [usize; ROWS] {
    let mixed = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let step = (mixed >> 32) | 1;
    std::array::from_fn(|row| {
        let h = mixed.wrapping_add(step.wrapping_mul(row as u64));
        row * WIDTH + (h >> 40) as usize % WIDTH
    })
}

impl Admission {
    /// Counts a read of the key with hash `hash`.
    pub fn record_read(&mut self, hash: u64) {
        let slots = slots(hash);
        // The reads of the key before this one: unbiased for p × the full weight, which the
        // estimate after counting this read is not for rare keys.
        let prior = slots.iter().map(|s| self.sketch[*s]).min().expect("rows");
        let estimate = prior.saturating_add(1);
        // Conservative update: only the counters below the new estimate rise.
        for slot in slots {
            self.sketch[slot] = self.sketch[slot].max(estimate);
        }
        if prior > 0 {
            let level = (u16::BITS - 1 - prior.leading_zeros()) as usize;
            self.levels[level].reads += 1;
            self.levels[level].estimate_sum += u64::from(prior);
        }
        self.reads += 1;
        self.full_weight_sum += self.full_weight;
        self.full_weight += 1.0;
        self.reads_since_halving += 1;
        if self.reads_since_halving == WINDOW_READS {
            self.reads_since_halving = 0;
            self.full_weight /= 2.0;
            for counter in &mut self.sketch {
                *counter /= 2;
            }
        }
    }

    fn estimate(&self, hash: u64) -> u16 {
        slots(hash).iter().map(|s| self.sketch[*s]).min().expect("rows")
    }

    /// Whether every node caches the key with hash `hash`.
    pub fn replicated(&self, hash: u64) -> bool {
        self.threshold != u32::MAX && u32::from(self.estimate(hash)) >= self.threshold
    }

    pub fn observe(&mut self, kind: ReadKind, took: Duration) {
        let us = took.as_secs_f64() * 1e6;
        let mean = match kind {
            ReadKind::LocalHit => &mut self.local_us,
            ReadKind::RemoteHit => &mut self.remote_us,
            ReadKind::Device => &mut self.device_us,
        };
        *mean = Some(mean.map_or(us, |m| m + COST_SMOOTHING * (us - m)));
    }

    /// Whether a miss of the key with hash `hash`, owned by another node, should ask the owner
    /// before the device: when a fetch, which costs a remote hit and on a remote miss the device
    /// read too, is expected to take less than the device read alone for keys as popular (or is
    /// not measured yet, or is this miss's probe). Returns the key's class for `fetched`.
    pub fn worth_fetching(&mut self, hash: u64) -> (bool, FetchClass) {
        let class = FetchClass(usize::from(self.estimate(hash) >= 1 << FIRST_RESOLVED_LEVEL));
        let since_probe = &mut self.misses_since_probe[class.0];
        *since_probe += 1;
        if *since_probe >= PROBE_EVERY {
            *since_probe = 0;
            return (true, class);
        }
        let worth = match (self.remote_us, self.device_us, self.fetch_hit_ratio[class.0]) {
            (Some(remote), Some(device), Some(hits)) => remote < hits * device,
            _ => true,
        };
        (worth, class)
    }

    /// Counts a fetch of a key of `class` the owner answered with the value (`hit`) or without.
    pub fn fetched(&mut self, class: FetchClass, hit: bool) {
        let hit = if hit { 1.0 } else { 0.0 };
        let ratio = &mut self.fetch_hit_ratio[class.0];
        *ratio = Some(ratio.map_or(hit, |r| r + COST_SMOOTHING * (hit - r)));
    }

    /// The mean µs of a local hit, a remote hit and a device read, each once measured.
    pub fn measured_us(&self) -> [Option<f64>; 3] {
        [self.local_us, self.remote_us, self.device_us]
    }

    /// What each kind of read costs, once the misses that decide have been measured: a remote
    /// hit not measured yet is taken to cost a device read (the asker reads its device after a
    /// remote miss anyway).
    fn costs(&self) -> Option<Costs> {
        let device_us = self.device_us.or(self.remote_us)?;
        Some(Costs {
            local_us: self.local_us.unwrap_or(0.0),
            remote_us: self.remote_us.unwrap_or(device_us),
            device_us,
        })
    }

    /// Decides again from the reads since the last decision, if there were enough; returns the
    /// number of replicated objects when it decided.
    pub fn reconsider(&mut self, shape: CacheShape) -> Option<u64> {
        if self.reads < MIN_READS_PER_DECISION {
            return None;
        }
        let costs = self.costs()?;
        let mean_full_weight = self.full_weight_sum / self.reads as f64;
        let mut hot = Vec::new();
        let mut cold_share = 1.0;
        for (level, counts) in self.levels.iter().enumerate().rev() {
            if counts.reads == 0 || level < FIRST_RESOLVED_LEVEL {
                continue;
            }
            let share = counts.reads as f64 / self.reads as f64;
            cold_share -= share;
            // A key read with probability p had, on average over its reads, p × the mean full
            // weight reads before each.
            let probability = counts.estimate_sum as f64 / counts.reads as f64 / mean_full_weight;
            hot.push((
                level,
                Stretch {
                    keys: (share / probability).max(1.0),
                    share,
                },
            ));
        }
        let curve = Curve::new(hot.iter().map(|(_, s)| *s).collect(), cold_share.max(0.0), shape.keys);
        let replicated = best_replication(&curve, shape, costs);
        // Admit whole levels up to `replicated` objects; past the levels a sketch can tell
        // apart, every key (the data set fits, or the cache is better spent on copies).
        let mut keys = 0.0;
        let mut threshold = u32::MAX;
        for (level, stretch) in &hot {
            if keys + stretch.keys > replicated + 0.5 {
                break;
            }
            keys += stretch.keys;
            threshold = 1 << level;
        }
        if replicated > 0.0 && replicated + 0.5 >= shape.capacity_objects.min(shape.keys) {
            threshold = 0;
        }
        self.threshold = threshold;
        self.replicated_objects = replicated.round() as u64;
        self.levels = [LevelReads::default(); LEVELS];
        self.reads = 0;
        self.full_weight_sum = 0.0;
        Some(self.replicated_objects)
    }
}

/// Share of the reads that go to the hottest `x` keys, hot stretches first, then the cold rest
/// spread evenly over the remaining keys.
struct Curve {
    stretches: Vec<Stretch>,
}

impl Curve {
    fn new(mut stretches: Vec<Stretch>, cold_share: f64, keys: f64) -> Curve {
        let hot_keys: f64 = stretches.iter().map(|s| s.keys).sum();
        stretches.push(Stretch {
            keys: (keys - hot_keys).max(1.0),
            share: cold_share,
        });
        Curve { stretches }
    }

    fn share(&self, mut x: f64) -> f64 {
        let mut share = 0.0;
        for stretch in &self.stretches {
            if x <= stretch.keys {
                return share + stretch.share * x / stretch.keys;
            }
            share += stretch.share;
            x -= stretch.keys;
        }
        share
    }

    /// Key counts where the curve bends.
    fn bends(&self) -> impl Iterator<Item = f64> + '_ {
        self.stretches.iter().scan(0.0, |keys, s| {
            *keys += s.keys;
            Some(*keys)
        })
    }
}

/// Expected µs per read with the hottest `replicated` objects in every cache and the rest owned
/// once; a read lands on any node alike.
fn time_per_read(curve: &Curve, shape: CacheShape, costs: Costs, replicated: f64) -> f64 {
    let n = shape.nodes as f64;
    let covered = (n * shape.capacity_objects - (n - 1.0) * replicated).min(shape.keys);
    let owned_once = costs.local_us / n + costs.remote_us * (n - 1.0) / n;
    let replicated_share = curve.share(replicated);
    let covered_share = curve.share(covered).max(replicated_share);
    replicated_share * costs.local_us
        + (covered_share - replicated_share) * owned_once
        + (1.0 - covered_share) * costs.device_us
}

/// The number of replicated objects with the least expected time per read (the fewest of
/// equals). The time is linear between the curve's bends and where the covered range crosses
/// one, so those points, 0 and the whole cache are all that need trying.
fn best_replication(curve: &Curve, shape: CacheShape, costs: Costs) -> f64 {
    let n = shape.nodes as f64;
    let most = shape.capacity_objects.min(shape.keys).max(0.0);
    if n < 2.0 {
        return most;
    }
    let mut candidates = vec![0.0, most];
    for bend in curve.bends() {
        candidates.push(bend);
        candidates.push((n * shape.capacity_objects - bend) / (n - 1.0));
    }
    candidates.push((n * shape.capacity_objects - shape.keys) / (n - 1.0));
    candidates.retain(|r| (0.0..=most).contains(r));
    candidates.sort_by(f64::total_cmp);
    let mut best = (f64::INFINITY, 0.0);
    for r in candidates {
        let time = time_per_read(curve, shape, costs, r);
        if time < best.0 * (1.0 - 1e-9) {
            best = (time, r);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fnv::fnv1a_64;

    /// A remote hit a third of a device read (batched fetches, or a faster network than disk).
    const COSTS: Costs = Costs {
        local_us: 1.0,
        remote_us: 20.0,
        device_us: 61.0,
    };

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    fn hash(rank: u64) -> u64 {
        fnv1a_64(format!("suser{rank}").as_bytes())
    }

    /// Reads of ranks drawn from Zipf(`theta`) over `keys` keys.
    fn zipf_reads(admission: &mut Admission, keys: u64, theta: f64, reads: u64) {
        let mut cumulative = Vec::with_capacity(keys as usize);
        let mut total = 0.0;
        for rank in 1..=keys {
            total += 1.0 / (rank as f64).powf(theta);
            cumulative.push(total);
        }
        let mut rng = Rng(7);
        for _ in 0..reads {
            let u = rng.unit() * total;
            let rank = cumulative.partition_point(|c| *c < u) as u64;
            admission.record_read(hash(rank));
        }
    }

    fn decide(admission: &mut Admission, shape: CacheShape) -> u64 {
        admission.observe(ReadKind::LocalHit, Duration::from_secs_f64(COSTS.local_us / 1e6));
        admission.observe(ReadKind::RemoteHit, Duration::from_secs_f64(COSTS.remote_us / 1e6));
        admission.observe(ReadKind::Device, Duration::from_secs_f64(COSTS.device_us / 1e6));
        admission.reconsider(shape).expect("enough reads")
    }

    #[test]
    fn uniform_popularity_replicates_nothing() {
        let mut admission = Admission::default();
        let mut rng = Rng(3);
        let keys = 1_000_000;
        for _ in 0..2_000_000 {
            admission.record_read(hash(rng.next() % keys));
        }
        let shape = CacheShape {
            nodes: 3,
            capacity_objects: 100_000.0,
            keys: keys as f64,
        };
        assert_eq!(decide(&mut admission, shape), 0);
        assert!(!admission.replicated(hash(12)));
    }

    #[test]
    fn zipf_popularity_replicates_the_hot_set_and_only_it() {
        let mut admission = Admission::default();
        let keys = 1_000_000;
        zipf_reads(&mut admission, keys, 0.99, 2_000_000);
        let shape = CacheShape {
            nodes: 3,
            capacity_objects: 100_000.0,
            keys: keys as f64,
        };
        let replicated = decide(&mut admission, shape);
        assert!((10..50_000).contains(&replicated), "{replicated}");
        assert!((0..10).all(|rank| admission.replicated(hash(rank))));
        let cold_replicated = (900_000..901_000)
            .filter(|rank| admission.replicated(hash(*rank)))
            .count();
        assert!(cold_replicated < 10, "{cold_replicated} cold keys replicated");
    }

    #[test]
    fn a_data_set_that_fits_one_cache_is_replicated_whole() {
        let mut admission = Admission::default();
        let mut rng = Rng(5);
        for _ in 0..1_000_000 {
            admission.record_read(hash(rng.next() % 20_000));
        }
        let shape = CacheShape {
            nodes: 3,
            capacity_objects: 30_000.0,
            keys: 20_000.0,
        };
        assert_eq!(decide(&mut admission, shape), 20_000);
        assert!(admission.replicated(hash(20_001)), "every key is cached everywhere");
    }

    #[test]
    fn the_dearer_a_remote_hit_the_more_is_replicated() {
        let curve = Curve::new(
            vec![Stretch {
                keys: 1_000.0,
                share: 0.5,
            }],
            0.5,
            1_000_000.0,
        );
        let shape = CacheShape {
            nodes: 3,
            capacity_objects: 100_000.0,
            keys: 1_000_000.0,
        };
        assert_eq!(best_replication(&curve, shape, COSTS), 1_000.0);
        let cheap_remote = Costs {
            remote_us: 1.0,
            ..COSTS
        };
        assert_eq!(best_replication(&curve, shape, cheap_remote), 0.0);
        // A remote hit dearer than the device (one value over TCP on this machine's kind): every
        // cache holds the same hottest objects, as siloed caches would.
        let dear_remote = Costs {
            remote_us: 90.0,
            ..COSTS
        };
        assert_eq!(best_replication(&curve, shape, dear_remote), 100_000.0);
        let one_node = CacheShape { nodes: 1, ..shape };
        assert_eq!(best_replication(&curve, one_node, COSTS), 100_000.0);
    }

    #[test]
    fn misses_ask_the_owner_only_while_it_pays_and_probe_otherwise() {
        let mut admission = Admission::default();
        let (cold, hot) = (hash(1), hash(2));
        for _ in 0..100 {
            admission.record_read(hot);
        }
        let (worth, cold_class) = admission.worth_fetching(cold);
        assert!(worth, "nothing measured yet");
        let (_, hot_class) = admission.worth_fetching(hot);
        assert_ne!(cold_class, hot_class);
        admission.observe(ReadKind::Device, Duration::from_micros(200));
        admission.observe(ReadKind::RemoteHit, Duration::from_micros(100));
        admission.fetched(cold_class, true);
        admission.fetched(hot_class, true);
        let asked = |admission: &mut Admission, key: u64, times: usize| {
            (0..times).filter(|_| admission.worth_fetching(key).0).count()
        };
        assert_eq!(
            asked(&mut admission, cold, 100),
            100,
            "a remote hit at half a device read"
        );
        // Cold keys mostly absent on their owners: a fetch is a round trip before the device
        // read. Hot keys are still there.
        for _ in 0..100 {
            admission.fetched(cold_class, false);
        }
        assert_eq!(asked(&mut admission, cold, 320), 10, "one probe in {PROBE_EVERY}");
        assert_eq!(asked(&mut admission, hot, 100), 100);
    }

    #[test]
    fn no_decision_without_reads_or_measured_misses() {
        let mut admission = Admission::default();
        let shape = CacheShape {
            nodes: 3,
            capacity_objects: 10.0,
            keys: 100.0,
        };
        admission.observe(ReadKind::Device, Duration::from_micros(60));
        assert_eq!(admission.reconsider(shape), None, "no reads");
        let mut admission = Admission::default();
        for rank in 0..MIN_READS_PER_DECISION {
            admission.record_read(hash(rank % 100));
        }
        assert_eq!(admission.reconsider(shape), None, "no miss measured");
        assert!(!admission.replicated(hash(1)));
    }
}
