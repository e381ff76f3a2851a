//! Key choosers: uniform, zipfian (scrambled over the key space, as YCSB does), latest and hotspot.
//!
//! The zipfian sampler is the one YCSB uses (Gray et al., "Quickly generating billion-record
//! synthetic databases", SIGMOD 1994): constant time per sample after computing zeta(n, θ) once,
//! extended incrementally when the item count grows (the latest distribution needs that).

use crate::rng::Rng;

/// Zipfian over ranks [0, n): rank 0 is the most popular.
#[derive(Debug, Clone)]
pub struct Zipfian {
    theta: f64,
    alpha: f64,
    zeta2: f64,
    /// Item count zeta_n was computed for.
    items: u64,
    zeta_n: f64,
    eta: f64,
}

fn zeta(from: u64, to: u64, theta: f64, start: f64) -> f64 {
    (from + 1..=to).fold(start, |sum, i| sum + 1.0 / (i as f64).powf(theta))
}

impl Zipfian {
    pub fn new(items: u64, theta: f64) -> Zipfian {
        assert!(items > 0, "zipfian over no items");
        assert!(theta > 0.0 && theta < 1.0, "zipfian theta must be in (0, 1)");
        let mut z = Zipfian {
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta2: zeta(0, 2, theta, 0.0),
            items: 0,
            zeta_n: 0.0,
            eta: 0.0,
        };
        z.grow_to(items);
        z
    }

    fn grow_to(&mut self, items: u64) {
        if items == self.items {
            return;
        }
        self.zeta_n = if items > self.items {
            zeta(self.items, items, self.theta, self.zeta_n)
        } else {
            zeta(0, items, self.theta, 0.0)
        };
        self.items = items;
        self.eta = (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zeta_n);
    }

    /// A rank in [0, items).
    pub fn sample(&mut self, rng: &mut Rng, items: u64) -> u64 {
        self.grow_to(items);
        let u = rng.next_f64();
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(items - 1);
        }
        let rank = (items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        rank.min(items - 1)
    }

    /// The share of samples that theory gives the most popular `top` ranks of `items`.
    pub fn theoretical_share(items: u64, top: u64, theta: f64) -> f64 {
        zeta(0, top, theta, 0.0) / zeta(0, items, theta, 0.0)
    }
}

/// A bijection on [0, n) that scatters popular ranks over the key space, so hot keys are not
/// neighbours: rank × m + c (mod n) with m coprime to n.
#[derive(Debug, Clone)]
pub struct Scramble {
    n: u64,
    multiplier: u64,
    offset: u64,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Scramble {
    fn new(n: u64) -> Scramble {
        let mut multiplier = (0x9E37_79B9_7F4A_7C15u64 % n).max(1);
        while gcd(multiplier, n) != 1 {
            multiplier = multiplier % n + 1;
        }
        Scramble {
            n,
            multiplier,
            offset: 0x2545_F491_4F6C_DD1D % n,
        }
    }

    fn apply(&self, rank: u64) -> u64 {
        ((u128::from(rank) * u128::from(self.multiplier) + u128::from(self.offset)) % u128::from(self.n)) as u64
    }
}

/// Which key distribution to draw from (YCSB's `requestdistribution`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Distribution {
    Uniform,
    Zipfian {
        theta: f64,
    },
    /// Recently inserted keys are the most popular (zipfian over recency).
    Latest {
        theta: f64,
    },
    /// `op_fraction` of the operations go to the first `data_fraction` of the keys.
    Hotspot {
        data_fraction: f64,
        op_fraction: f64,
    },
}

/// Draws key numbers for one client.
#[derive(Debug, Clone)]
pub enum KeyChooser {
    Uniform,
    Zipfian {
        zipf: Zipfian,
        scramble: Scramble,
        items: u64,
    },
    Latest {
        zipf: Zipfian,
    },
    Hotspot {
        hot_keys: u64,
        op_fraction: f64,
        items: u64,
    },
}

impl KeyChooser {
    /// `items` is the record count when the run starts; zipfian and hotspot draw from those
    /// records, uniform and latest from every record inserted so far.
    pub fn new(distribution: Distribution, items: u64) -> KeyChooser {
        match distribution {
            Distribution::Uniform => KeyChooser::Uniform,
            Distribution::Zipfian { theta } => KeyChooser::Zipfian {
                zipf: Zipfian::new(items, theta),
                scramble: Scramble::new(items),
                items,
            },
            Distribution::Latest { theta } => KeyChooser::Latest {
                zipf: Zipfian::new(items, theta),
            },
            Distribution::Hotspot {
                data_fraction,
                op_fraction,
            } => KeyChooser::Hotspot {
                hot_keys: ((items as f64 * data_fraction) as u64).clamp(1, items),
                op_fraction,
                items,
            },
        }
    }

    /// A key number in [0, inserted); `inserted` is how many records exist now.
    pub fn next(&mut self, rng: &mut Rng, inserted: u64) -> u64 {
        match self {
            KeyChooser::Uniform => rng.below(inserted),
            KeyChooser::Zipfian { zipf, scramble, items } => scramble.apply(zipf.sample(rng, *items)),
            KeyChooser::Latest { zipf } => inserted - 1 - zipf.sample(rng, inserted),
            KeyChooser::Hotspot {
                hot_keys,
                op_fraction,
                items,
            } => {
                if rng.next_f64() < *op_fraction || *hot_keys == *items {
                    rng.below(*hot_keys)
                } else {
                    *hot_keys + rng.below(*items - *hot_keys)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLES: u64 = 200_000;

    #[test]
    fn zipfian_top_one_percent_share_matches_theory() {
        for (items, theta) in [(10_000, 0.99), (100_000, 0.99), (10_000, 0.8)] {
            let mut zipf = Zipfian::new(items, theta);
            let mut rng = Rng::new(7);
            let top = items / 100;
            let hits = (0..SAMPLES).filter(|_| zipf.sample(&mut rng, items) < top).count();
            let share = hits as f64 / SAMPLES as f64;
            let theory = Zipfian::theoretical_share(items, top, theta);
            assert!(
                (share - theory).abs() < 0.02,
                "items {items} theta {theta}: top 1% share {share:.4}, theory {theory:.4}"
            );
        }
    }

    #[test]
    fn scrambled_zipfian_keeps_the_skew_but_scatters_hot_keys() {
        let items = 10_000;
        let mut chooser = KeyChooser::new(Distribution::Zipfian { theta: 0.99 }, items);
        let mut rng = Rng::new(1);
        let mut counts = vec![0u32; items as usize];
        for _ in 0..SAMPLES {
            counts[chooser.next(&mut rng, items) as usize] += 1;
        }
        let mut sorted = counts.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let top_share = sorted[..100].iter().map(|c| f64::from(*c)).sum::<f64>() / SAMPLES as f64;
        let theory = Zipfian::theoretical_share(items, 100, 0.99);
        assert!((top_share - theory).abs() < 0.02, "share {top_share:.4} vs {theory:.4}");
        // The hottest key is not key 0 and the first 1% of the key space is not the hot set.
        let first_share = counts[..100].iter().map(|c| f64::from(*c)).sum::<f64>() / SAMPLES as f64;
        assert!(first_share < theory / 2.0, "first keys got {first_share:.4}");
    }

    #[test]
    fn scramble_is_a_permutation() {
        for n in [1, 2, 10, 97, 1000, 4096] {
            let s = Scramble::new(n);
            let mut seen = vec![false; n as usize];
            for rank in 0..n {
                let k = s.apply(rank) as usize;
                assert!(!seen[k], "n {n}: {k} hit twice");
                seen[k] = true;
            }
        }
    }

    #[test]
    fn latest_favours_recent_inserts_and_follows_growth() {
        let mut chooser = KeyChooser::new(Distribution::Latest { theta: 0.99 }, 10_000);
        let mut rng = Rng::new(3);
        let recent = (0..SAMPLES).filter(|_| chooser.next(&mut rng, 10_000) >= 9_900).count() as f64 / SAMPLES as f64;
        let theory = Zipfian::theoretical_share(10_000, 100, 0.99);
        assert!(
            (recent - theory).abs() < 0.02,
            "newest 1% share {recent:.4} vs {theory:.4}"
        );
        // After more inserts the newest keys are the new ones.
        let newest = (0..SAMPLES)
            .map(|_| chooser.next(&mut rng, 20_000))
            .filter(|k| *k >= 19_900)
            .count() as f64
            / SAMPLES as f64;
        assert!(newest > 0.3, "after growth the newest 1% got {newest:.4}");
    }

    #[test]
    fn hotspot_sends_the_configured_share_to_the_hot_set() {
        let mut chooser = KeyChooser::new(
            Distribution::Hotspot {
                data_fraction: 0.2,
                op_fraction: 0.8,
            },
            10_000,
        );
        let mut rng = Rng::new(5);
        let hot = (0..SAMPLES).filter(|_| chooser.next(&mut rng, 10_000) < 2_000).count() as f64 / SAMPLES as f64;
        assert!((hot - 0.8).abs() < 0.01, "hot share {hot:.4}");
    }

    #[test]
    fn uniform_covers_every_inserted_key_evenly() {
        let mut chooser = KeyChooser::new(Distribution::Uniform, 100);
        let mut rng = Rng::new(9);
        let mut counts = [0u32; 100];
        for _ in 0..SAMPLES {
            counts[chooser.next(&mut rng, 100) as usize] += 1;
        }
        let expected = SAMPLES as f64 / 100.0;
        assert!(counts.iter().all(|c| (f64::from(*c) - expected).abs() < expected * 0.1));
    }
}
