//! HyperLogLogs in Redis 7's format: a string holding a 16-byte header — `HYLL`, the encoding
//! (0 dense, 1 sparse), three zero bytes, and the last counted cardinality (little endian, its
//! top bit set when stale) — followed by 16,384 six-bit registers. A new one is sparse
//! (run-length opcodes); it turns dense (the registers packed) once a register needs more than
//! 32 or the sparse form would pass 3,000 bytes. Every edit is made as Redis makes it, so the
//! strings are byte for byte Redis's (one may be copied from one to the other) and both count
//! alike.
//!
//! The value comes from a client (SET can store any bytes), so every function here answers
//! malformed input with an error and never panics.

pub const REGISTERS: usize = 16384;
/// Bits of the hash that index the register.
const INDEX_BITS: u32 = 14;
/// Bits of the hash left for the run of zeros.
const RUN_BITS: usize = 64 - INDEX_BITS as usize;
const HEADER_BYTES: usize = 16;
const DENSE_BYTES: usize = HEADER_BYTES + REGISTERS * 6 / 8;
const ENCODING_AT: usize = 4;
const DENSE: u8 = 0;
const SPARSE: u8 = 1;
/// Redis's default `hll-sparse-max-bytes`.
const SPARSE_MAX_BYTES: usize = 3000;
/// The largest register value, and run, one sparse VAL opcode holds.
const VAL_MAX_VALUE: u8 = 32;
const VAL_MAX_RUN: usize = 4;
/// The longest run of zero registers a one-byte ZERO opcode holds (XZERO, two bytes, holds all).
const ZERO_MAX_RUN: usize = 64;
const HASH_SEED: u64 = 0xadc8_3b19;
/// The estimator's constant, 1 / (2 ln 2).
const ALPHA_INF: f64 = 0.721_347_520_444_481_7;

/// Why a string cannot be used as a HyperLogLog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HllError {
    /// Not a HyperLogLog at all (no header, another encoding, a dense one of the wrong length).
    NotHll,
    /// A sparse HyperLogLog whose opcodes do not cover the registers exactly.
    Corrupt,
}

impl HllError {
    /// The error Redis answers.
    pub fn message(self) -> &'static str {
        match self {
            HllError::NotHll => "WRONGTYPE Key is not a valid HyperLogLog string value.",
            HllError::Corrupt => "INVALIDOBJ Corrupted HLL object detected",
        }
    }
}

/// Whether `value` is a HyperLogLog Redis would accept.
pub fn check(value: &[u8]) -> Result<(), HllError> {
    let valid = value.len() >= HEADER_BYTES
        && value.starts_with(b"HYLL")
        && value[ENCODING_AT] <= SPARSE
        && (value[ENCODING_AT] == SPARSE || value.len() == DENSE_BYTES);
    if valid {
        Ok(())
    } else {
        Err(HllError::NotHll)
    }
}

/// An empty HyperLogLog: sparse, one XZERO opcode for every register, cardinality 0.
pub fn empty() -> Vec<u8> {
    let mut hll = b"HYLL".to_vec();
    hll.extend_from_slice(&[SPARSE, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    hll.extend_from_slice(&xzero(REGISTERS));
    hll
}

/// The cardinality a checked HyperLogLog recorded when last counted, if nothing changed since.
pub fn cached_count(hll: &[u8]) -> Option<u64> {
    let card = u64::from_le_bytes(hll[8..16].try_into().expect("a checked HyperLogLog has a header"));
    (card >> 63 == 0).then_some(card)
}

/// Marks a checked HyperLogLog's recorded cardinality stale.
pub fn invalidate_count(hll: &mut [u8]) {
    hll[15] |= 0x80;
}

/// Adds `element` to a checked HyperLogLog: whether a register changed.
pub fn add(hll: &mut Vec<u8>, element: &[u8]) -> Result<bool, HllError> {
    let (index, run) = register_of(element);
    set_register(hll, index, run)
}

/// Raises register `index` of a checked HyperLogLog to `value` if it holds less: whether it did.
pub fn set_register(hll: &mut Vec<u8>, index: usize, value: u8) -> Result<bool, HllError> {
    if hll[ENCODING_AT] == DENSE {
        Ok(dense_raise(&mut hll[HEADER_BYTES..], index, value))
    } else {
        sparse_raise(hll, index, value)
    }
}

/// Whether a checked HyperLogLog is dense.
pub fn is_dense(hll: &[u8]) -> bool {
    hll[ENCODING_AT] == DENSE
}

/// Raises each of `max`'s registers to the checked HyperLogLog's, where it holds more.
pub fn merge_into(max: &mut [u8; REGISTERS], hll: &[u8]) -> Result<(), HllError> {
    if is_dense(hll) {
        for (i, slot) in max.iter_mut().enumerate() {
            *slot = (*slot).max(dense_get(&hll[HEADER_BYTES..], i));
        }
        return Ok(());
    }
    for_each_nonzero_run(hll, |first, run, value| {
        for slot in &mut max[first..first + run] {
            *slot = (*slot).max(value);
        }
    })
}

/// Calls `visit(first register, run length, value)` for each run of non-zero registers of a
/// sparse HyperLogLog, in order; `Corrupt` unless its opcodes cover exactly every register.
/// As Redis, the walk stops at a run that would pass the last register and judges by where it
/// stopped.
fn for_each_nonzero_run(hll: &[u8], mut visit: impl FnMut(usize, usize, u8)) -> Result<(), HllError> {
    let mut i = 0;
    for op in opcodes(&hll[HEADER_BYTES..]) {
        match op {
            Opcode::Zeros(run) => i += run,
            Opcode::Val(_, run) if i + run > REGISTERS => break,
            Opcode::Val(value, run) => {
                visit(i, run, value);
                i += run;
            }
        }
    }
    if i == REGISTERS {
        Ok(())
    } else {
        Err(HllError::Corrupt)
    }
}

/// The estimated cardinality of a checked HyperLogLog (its recorded one aside).
pub fn count(hll: &[u8]) -> Result<u64, HllError> {
    let mut histogram = [0u64; 64];
    if is_dense(hll) {
        for i in 0..REGISTERS {
            histogram[usize::from(dense_get(&hll[HEADER_BYTES..], i))] += 1;
        }
    } else {
        let mut covered = 0;
        for op in opcodes(&hll[HEADER_BYTES..]) {
            let (value, run) = match op {
                Opcode::Zeros(run) => (0, run),
                Opcode::Val(value, run) => (value, run),
            };
            histogram[usize::from(value)] += run as u64;
            covered += run;
        }
        if covered != REGISTERS {
            return Err(HllError::Corrupt);
        }
    }
    Ok(estimate(&histogram))
}

/// The estimated cardinality of plain registers (PFCOUNT of several keys merges into these).
pub fn count_registers(registers: &[u8; REGISTERS]) -> u64 {
    let mut histogram = [0u64; 64];
    for &value in registers {
        histogram[usize::from(value & 63)] += 1;
    }
    estimate(&histogram)
}

/// Turns a checked HyperLogLog dense (its header, recorded cardinality included, kept).
pub fn make_dense(hll: &mut Vec<u8>) -> Result<(), HllError> {
    if is_dense(hll) {
        return Ok(());
    }
    let mut dense = vec![0u8; DENSE_BYTES];
    dense[..HEADER_BYTES].copy_from_slice(&hll[..HEADER_BYTES]);
    dense[ENCODING_AT] = DENSE;
    for_each_nonzero_run(hll, |first, run, value| {
        for register in first..first + run {
            dense_raise(&mut dense[HEADER_BYTES..], register, value);
        }
    })?;
    *hll = dense;
    Ok(())
}

/// MurmurHash64A, the hash Redis gives each element.
fn murmur64a(key: &[u8], seed: u64) -> u64 {
    const M: u64 = 0xc6a4_a793_5bd1_e995;
    const R: u32 = 47;
    let mut h = seed ^ (key.len() as u64).wrapping_mul(M);
    let mut chunks = key.chunks_exact(8);
    for chunk in &mut chunks {
        let mut k = u64::from_le_bytes(chunk.try_into().expect("chunks of 8"));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, &byte) in tail.iter().enumerate() {
            h ^= u64::from(byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}

/// The register an element falls in, and the value it gives it: one more than the number of
/// zeros before the first set bit of the hash past the index bits.
fn register_of(element: &[u8]) -> (usize, u8) {
    let hash = murmur64a(element, HASH_SEED);
    let index = (hash & (REGISTERS as u64 - 1)) as usize;
    let rest = (hash >> INDEX_BITS) | (1 << RUN_BITS);
    (index, rest.trailing_zeros() as u8 + 1)
}

/// Register `i` of packed six-bit registers, the first in the low bits of the first byte. The
/// last register's byte has no successor: it reads as zero, as Redis reads its terminator.
fn dense_get(registers: &[u8], i: usize) -> u8 {
    let (byte, shift) = (i * 6 / 8, i * 6 % 8);
    let low = u16::from(registers[byte]) >> shift;
    let high = u16::from(registers.get(byte + 1).copied().unwrap_or(0)) << (8 - shift);
    ((low | high) & 63) as u8
}

/// Raises dense register `i` to `value` if it holds less: whether it did.
fn dense_raise(registers: &mut [u8], i: usize, value: u8) -> bool {
    if value <= dense_get(registers, i) {
        return false;
    }
    let (byte, shift) = (i * 6 / 8, i * 6 % 8);
    let value = u16::from(value) << shift;
    registers[byte] = (registers[byte] & !((63u16 << shift) as u8)) | value as u8;
    if let Some(next) = registers.get_mut(byte + 1) {
        *next = (*next & !((63u16 << shift >> 8) as u8)) | (value >> 8) as u8;
    }
    true
}

/// A sparse opcode, decoded: a run of zero registers (ZERO or XZERO), or of one value (VAL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opcode {
    Zeros(usize),
    Val(u8, usize),
}

/// The opcode at the start of `bytes` and its length in bytes. An XZERO cut short reads its
/// missing byte as zero (Redis reads its string's terminator).
fn opcode_at(bytes: &[u8]) -> (Opcode, usize) {
    let first = bytes[0];
    match first & 0xc0 {
        0x00 => (Opcode::Zeros(usize::from(first & 0x3f) + 1), 1),
        0x40 => {
            let low = bytes.get(1).copied().unwrap_or(0);
            (
                Opcode::Zeros((usize::from(first & 0x3f) << 8 | usize::from(low)) + 1),
                2,
            )
        }
        _ => (Opcode::Val(((first >> 2) & 0x1f) + 1, usize::from(first & 3) + 1), 1),
    }
}

fn opcodes(mut bytes: &[u8]) -> impl Iterator<Item = Opcode> + '_ {
    std::iter::from_fn(move || {
        if bytes.is_empty() {
            return None;
        }
        let (op, len) = opcode_at(bytes);
        bytes = &bytes[len.min(bytes.len())..];
        Some(op)
    })
}

fn val(value: u8, run: usize) -> u8 {
    0x80 | (value - 1) << 2 | (run - 1) as u8
}

/// A run of zeros as Redis writes it when it splits one: ZERO if it fits, else XZERO.
fn zeros(run: usize) -> Vec<u8> {
    if run > ZERO_MAX_RUN {
        xzero(run).to_vec()
    } else {
        vec![(run - 1) as u8]
    }
}

fn xzero(run: usize) -> [u8; 2] {
    let encoded = run - 1;
    [0x40 | (encoded >> 8) as u8, encoded as u8]
}

/// Raises sparse register `index` to `value` if it holds less, editing the opcodes in place as
/// Redis does (split the opcode covering it, then merge equal neighbouring VALs), or turning the
/// HyperLogLog dense when the sparse form cannot hold the result.
fn sparse_raise(hll: &mut Vec<u8>, index: usize, value: u8) -> Result<bool, HllError> {
    if value > VAL_MAX_VALUE {
        return promote(hll, index, value);
    }
    // The opcode covering `index`, where it starts, and the one before it.
    let (mut at, mut first, mut previous) = (HEADER_BYTES, 0, None);
    let found = loop {
        if at >= hll.len() {
            break None;
        }
        let (op, len) = opcode_at(&hll[at..]);
        let run = match op {
            Opcode::Zeros(run) | Opcode::Val(_, run) => run,
        };
        if index < first + run {
            break Some((op, len, run));
        }
        previous = Some(at);
        at += len;
        first += run;
    };
    let Some((op, len, run)) = found else {
        return Err(HllError::Corrupt);
    };
    let last = first + run - 1;
    match op {
        Opcode::Val(held, _) if held >= value => return Ok(false),
        Opcode::Val(_, 1) | Opcode::Zeros(1) if len == 1 => hll[at] = val(value, 1),
        _ => {
            let mut replacement = Vec::with_capacity(5);
            let (before, after) = (index - first, last - index);
            match op {
                Opcode::Zeros(_) => {
                    if before > 0 {
                        replacement.extend(zeros(before));
                    }
                    replacement.push(val(value, 1));
                    if after > 0 {
                        replacement.extend(zeros(after));
                    }
                }
                Opcode::Val(held, _) => {
                    if before > 0 {
                        replacement.push(val(held, before));
                    }
                    replacement.push(val(value, 1));
                    if after > 0 {
                        replacement.push(val(held, after));
                    }
                }
            }
            if replacement.len() > len && hll.len() + replacement.len() - len > SPARSE_MAX_BYTES {
                return promote(hll, index, value);
            }
            let end = (at + len).min(hll.len());
            hll.splice(at..end, replacement);
        }
    }
    merge_neighbours(hll, previous.unwrap_or(HEADER_BYTES));
    invalidate_count(hll);
    Ok(true)
}

/// Merges equal adjacent VAL opcodes whose runs fit one, looking at five opcodes from `at`, as
/// Redis does after each edit.
fn merge_neighbours(hll: &mut Vec<u8>, mut at: usize) {
    for _ in 0..5 {
        if at >= hll.len() {
            return;
        }
        let (op, len) = opcode_at(&hll[at..]);
        let Opcode::Val(value, run) = op else {
            at += len;
            continue;
        };
        if let Some(&next) = hll.get(at + 1) {
            if let (Opcode::Val(next_value, next_run), 1) = opcode_at(&[next]) {
                if next_value == value && run + next_run <= VAL_MAX_RUN {
                    hll[at + 1] = val(value, run + next_run);
                    hll.remove(at);
                    continue;
                }
            }
        }
        at += 1;
    }
}

/// Turns a sparse HyperLogLog dense and raises register `index` there.
fn promote(hll: &mut Vec<u8>, index: usize, value: u8) -> Result<bool, HllError> {
    make_dense(hll)?;
    let raised = dense_raise(&mut hll[HEADER_BYTES..], index, value);
    assert!(raised, "a register promoted for a larger value must take it");
    Ok(true)
}

/// Ertl's estimator ("New cardinality estimation algorithms for HyperLogLog sketches",
/// arXiv:1702.01284) from the histogram of register values, computed in the order Redis
/// computes it so that both round alike.
fn estimate(histogram: &[u64; 64]) -> u64 {
    let m = REGISTERS as f64;
    let mut z = m * tau((m - histogram[RUN_BITS + 1] as f64) / m);
    for j in (1..=RUN_BITS).rev() {
        z += histogram[j] as f64;
        z *= 0.5;
    }
    z += m * sigma(histogram[0] as f64 / m);
    (ALPHA_INF * m * m / z).round() as u64
}

fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let (mut y, mut z) = (1.0, x);
    loop {
        x *= x;
        let previous = z;
        z += x * y;
        y += y;
        if z == previous {
            return z;
        }
    }
}

fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let (mut y, mut z) = (1.0, 1.0 - x);
    loop {
        x = x.sqrt();
        let previous = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
        if z == previous {
            return z / 3.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(elements: impl IntoIterator<Item = String>) -> Vec<u8> {
        let mut hll = empty();
        for element in elements {
            add(&mut hll, element.as_bytes()).unwrap();
        }
        hll
    }

    #[test]
    fn an_empty_hyperloglog_is_redis_s_sparse_one_and_counts_zero() {
        let hll = empty();
        assert_eq!(hll, b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\0\x7f\xff");
        assert_eq!(check(&hll), Ok(()));
        assert_eq!((cached_count(&hll), count(&hll)), (Some(0), Ok(0)));
    }

    #[test]
    fn hyperloglogs_are_byte_for_byte_and_count_for_count_redis_s() {
        // From redis-server 7.0.15: PFADD of "element:0" .. "element:<n-1>", then GET (its
        // bytes, or their FNV-1a hash, and length and encoding) and PFCOUNT.
        let a = with(["a".to_string()]);
        assert_eq!(a, b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\x80\x71\xa6\x84\x4e\x57");
        let ten = with((0..10).map(|i| format!("element:{i}")));
        let redis_ten =
            "48594c4c010000000000000000000080448e80453b8441ed88441b80407c904501804ab38440728058dc80444f84424d";
        let hex: String = ten.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, redis_ten);
        for (n, len, encoding, hash, estimate) in [
            (100, 285, SPARSE, 0x67b3_25af_8799_02d0, 99),
            (1000, 1897, SPARSE, 0x0f28_a9d9_3d31_64c9, 997),
            (1500, 2722, SPARSE, 0xf838_0719_71f9_3338, 1500),
            (2000, DENSE_BYTES, DENSE, 0xcce1_8855_76fa_ad71, 2004),
            (3000, DENSE_BYTES, DENSE, 0x8eec_5669_f13d_2ebc, 3002),
            (20000, DENSE_BYTES, DENSE, 0x50d6_b0a9_6d37_3a57, 19986),
        ] {
            let hll = with((0..n).map(|i| format!("element:{i}")));
            assert_eq!((hll.len(), hll[ENCODING_AT]), (len, encoding), "{n} elements");
            assert_eq!(crate::fnv::fnv1a_64(&hll), hash, "{n} elements");
            assert_eq!(count(&hll), Ok(estimate), "{n} elements");
        }
    }

    #[test]
    fn a_growing_sparse_hyperloglog_turns_dense_before_passing_its_cap() {
        let mut hll = empty();
        let mut turned_dense_at = None;
        for n in 0..20_000 {
            add(&mut hll, format!("element:{n}").as_bytes()).unwrap();
            assert_eq!(check(&hll), Ok(()));
            if turned_dense_at.is_none() && is_dense(&hll) {
                turned_dense_at = Some(n);
            }
            if !is_dense(&hll) {
                assert!(hll.len() <= SPARSE_MAX_BYTES, "the sparse form never passes its cap");
            }
        }
        let n = turned_dense_at.expect("20,000 elements make it dense");
        assert!((1000..3000).contains(&n), "turned dense after {n} elements");
    }

    #[test]
    fn sparse_and_dense_forms_of_the_same_registers_count_alike_and_merge_alike() {
        let sparse = with((0..500).map(|n| n.to_string()));
        let mut dense = sparse.clone();
        make_dense(&mut dense).unwrap();
        assert_eq!(dense.len(), DENSE_BYTES);
        assert_eq!(count(&sparse), count(&dense));
        let (mut a, mut b) = ([0u8; REGISTERS], [0u8; REGISTERS]);
        merge_into(&mut a, &sparse).unwrap();
        merge_into(&mut b, &dense).unwrap();
        assert!(a == b);
        assert_eq!(count_registers(&a), count(&sparse).unwrap());
        for (i, &register) in a.iter().enumerate() {
            assert_eq!(dense_get(&dense[HEADER_BYTES..], i), register);
        }
    }

    #[test]
    fn adding_an_element_twice_changes_nothing_the_second_time() {
        let mut hll = with(["x".to_string()]);
        let before = hll.clone();
        assert_eq!(add(&mut hll, b"x"), Ok(false));
        assert_eq!(hll, before);
    }

    #[test]
    fn equal_neighbouring_values_merge_into_one_opcode() {
        // Registers 0..=4 raised to 5 from the last to the first: the runs merge from the right
        // (4, then 1 on its left), as Redis's in-place edits leave them.
        let mut hll = empty();
        for i in (0..5).rev() {
            assert_eq!(sparse_raise(&mut hll, i, 5), Ok(true));
        }
        assert_eq!(&hll[HEADER_BYTES..HEADER_BYTES + 2], &[val(5, 1), val(5, 4)]);
        assert_eq!(count(&hll).map(|_| ()), Ok(()));
    }

    #[test]
    fn malformed_hyperloglogs_are_refused_not_panicked_on() {
        assert_eq!(check(b"HYLL"), Err(HllError::NotHll));
        assert_eq!(check(b"HYLX\x01\0\0\0\0\0\0\0\0\0\0\0\x7f\xff"), Err(HllError::NotHll));
        assert_eq!(check(b"HYLL\x02\0\0\0\0\0\0\0\0\0\0\0\x7f\xff"), Err(HllError::NotHll));
        assert_eq!(check(b"HYLL\x00\0\0\0\0\0\0\0\0\0\0\0\x7f\xff"), Err(HllError::NotHll));
        // Sparse opcodes covering too few, too many, or cut short.
        for opcodes in [&b"\x7f\xfe"[..], b"\x7f\xff\x00", b"\x7f", b"", b"\x80\x7f\xff"] {
            let mut hll = b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\0".to_vec();
            hll.extend_from_slice(opcodes);
            assert_eq!(check(&hll), Ok(()));
            assert_eq!(count(&hll), Err(HllError::Corrupt), "{opcodes:?}");
            assert_eq!(merge_into(&mut [0; REGISTERS], &hll), Err(HllError::Corrupt));
            let _ = add(&mut hll.clone(), b"anything");
            let _ = make_dense(&mut hll.clone());
        }
    }
}
