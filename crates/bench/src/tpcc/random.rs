//! TPC-C's random inputs (clause 2.1.6 and 4.3.2): uniform ranges, NURand, customer last names
//! from syllables, and the strings the tables are filled with.

use crate::rng::Rng;

/// NURand's run-time constant C for last names, and the one used at load time; the spec asks
/// them to differ by 65..=119 (not 96 or 112) so that the run does not retrace the load.
pub const C_LAST_LOAD: u64 = 157;
pub const C_LAST_RUN: u64 = 223;
pub const C_ID: u64 = 259;
pub const C_ITEM: u64 = 7911;

const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];

/// The last name numbered `n` (0..=999): its three decimal digits pick three syllables.
pub fn last_name(n: u64) -> String {
    assert!(n < 1000, "last names are numbered 0..=999");
    [n / 100, (n / 10) % 10, n % 10]
        .iter()
        .map(|&digit| SYLLABLES[digit as usize])
        .collect()
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// The generators TPC-C needs, on the bench's seedable generator.
pub trait Text {
    /// Uniform in `low..=high`.
    fn between(&mut self, low: u64, high: u64) -> u64;
    /// NURand(A, x, y) with constant `c`.
    fn nurand(&mut self, a: u64, low: u64, high: u64, c: u64) -> u64;
    fn alnum(&mut self, min_len: u64, max_len: u64) -> String;
    fn letters(&mut self, min_len: u64, max_len: u64) -> String;
    fn digits(&mut self, min_len: u64, max_len: u64) -> String;
    /// I_DATA / S_DATA: random text, and in 10% of rows "ORIGINAL" somewhere in it.
    fn data(&mut self, min_len: u64, max_len: u64) -> String;
    /// 1..=n in random order.
    fn permutation(&mut self, n: u64) -> Vec<u64>;
}

impl Text for Rng {
    fn between(&mut self, low: u64, high: u64) -> u64 {
        debug_assert!(low <= high);
        low + self.below(high - low + 1)
    }

    fn nurand(&mut self, a: u64, low: u64, high: u64, c: u64) -> u64 {
        (((self.between(0, a) | self.between(low, high)) + c) % (high - low + 1)) + low
    }

    fn alnum(&mut self, min_len: u64, max_len: u64) -> String {
        let len = self.between(min_len, max_len);
        (0..len)
            .map(|_| ALNUM[self.below(ALNUM.len() as u64) as usize] as char)
            .collect()
    }

    fn letters(&mut self, min_len: u64, max_len: u64) -> String {
        let len = self.between(min_len, max_len);
        (0..len).map(|_| (b'A' + self.below(26) as u8) as char).collect()
    }

    fn digits(&mut self, min_len: u64, max_len: u64) -> String {
        let len = self.between(min_len, max_len);
        (0..len).map(|_| (b'0' + self.below(10) as u8) as char).collect()
    }

    fn data(&mut self, min_len: u64, max_len: u64) -> String {
        let mut text = self.alnum(min_len, max_len);
        if self.below(10) == 0 {
            let at = self.below(text.len() as u64 - 7) as usize;
            text.replace_range(at..at + 8, "ORIGINAL");
        }
        text
    }

    fn permutation(&mut self, n: u64) -> Vec<u64> {
        let mut values: Vec<u64> = (1..=n).collect();
        for i in (1..values.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            values.swap(i, j);
        }
        values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_names_are_built_from_the_digits_syllables() {
        assert_eq!(last_name(0), "BARBARBAR");
        assert_eq!(last_name(371), "PRICALLYOUGHT");
        assert_eq!(last_name(999), "EINGEINGEING");
    }

    #[test]
    fn nurand_stays_in_range_and_skews() {
        let mut rng = Rng::new(3);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            let v = rng.nurand(255, 0, 999, C_LAST_RUN);
            counts[v as usize] += 1;
        }
        let max = *counts.iter().max().unwrap();
        let min = *counts.iter().min().unwrap();
        assert!(max > 3 * min.max(1), "NURand is non-uniform: {min}..{max}");
    }

    #[test]
    fn strings_have_their_lengths_and_data_sometimes_says_original() {
        let mut rng = Rng::new(5);
        let mut original = 0;
        for _ in 0..1000 {
            let s = rng.data(26, 50);
            assert!((26..=50).contains(&s.len()));
            original += u32::from(s.contains("ORIGINAL"));
        }
        assert!((50..200).contains(&original), "{original} of 1000");
        let mut p = rng.permutation(3000);
        p.sort_unstable();
        assert_eq!(p, (1..=3000).collect::<Vec<_>>());
    }
}
