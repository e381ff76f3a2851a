//! FNV-1a over 64 bits: a hash that is the same on every node and in every version, for what
//! replicas must agree on (SCAN cursors, LDC's owner of a key).

pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
