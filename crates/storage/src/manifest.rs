//! The manifest: which segments make up the state at a log index. It is the state machine's part
//! of a raft snapshot, so the raft log can be compacted behind durable segments without
//! serialising the state.
//!
//! ```text
//! "CHMF" | format u16 | applied index u64 | segment count u32
//!        | per segment: first index u64 | last index u64 | crc32 of everything before
//! ```
//!
//! Segments are listed in log order and cover consecutive ranges ending at the applied index.

use crate::segment::{corrupt, open_frame, seal_frame, start_frame, SegmentError, FRAME_HEADER_BYTES};

const MAGIC: &[u8; 4] = b"CHMF";
const FORMAT_VERSION: u16 = 1;
/// Applied index and segment count.
const FIXED_CONTENT_BYTES: usize = 8 + 4;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    pub applied_index: u64,
    /// `(first, last)` log index of each segment, in log order.
    pub segments: Vec<(u64, u64)>,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        self.check().expect("a manifest we build is consistent");
        let mut out = start_frame(MAGIC, FORMAT_VERSION, FIXED_CONTENT_BYTES + self.segments.len() * 16);
        out.extend_from_slice(&self.applied_index.to_le_bytes());
        out.extend_from_slice(&(self.segments.len() as u32).to_le_bytes());
        for (first, last) in &self.segments {
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&last.to_le_bytes());
        }
        seal_frame(out)
    }

    pub fn decode(buf: &[u8]) -> Result<Manifest, SegmentError> {
        let content = open_frame(buf, MAGIC, FORMAT_VERSION, FIXED_CONTENT_BYTES, "a manifest")?;
        let applied_index = u64::from_le_bytes(content[..8].try_into().expect("8 bytes"));
        let count = u32::from_le_bytes(content[8..12].try_into().expect("4 bytes")) as usize;
        let ranges = &content[FIXED_CONTENT_BYTES..];
        let ranges_offset = FRAME_HEADER_BYTES + FIXED_CONTENT_BYTES;
        if ranges.len() != count.saturating_mul(16) {
            return Err(corrupt(
                ranges_offset,
                format!("manifest lists {count} segments in {} bytes", ranges.len()),
            ));
        }
        let segments = ranges
            .chunks_exact(16)
            .map(|c| {
                (
                    u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
                    u64::from_le_bytes(c[8..].try_into().expect("8 bytes")),
                )
            })
            .collect();
        let manifest = Manifest {
            applied_index,
            segments,
        };
        manifest.check().map_err(|reason| corrupt(ranges_offset, reason))?;
        Ok(manifest)
    }

    /// Segments are non-empty ranges, consecutive, ending at the applied index.
    fn check(&self) -> Result<(), String> {
        for (i, (first, last)) in self.segments.iter().enumerate() {
            if first > last {
                return Err(format!("segment {i} covers [{first}, {last}]"));
            }
            if i > 0 && *first != self.segments[i - 1].1 + 1 {
                return Err(format!(
                    "segment {i} starts at {first}, not after {}",
                    self.segments[i - 1].1
                ));
            }
        }
        match self.segments.last() {
            Some((_, last)) if *last != self.applied_index => Err(format!(
                "segments end at {last}, the applied index is {}",
                self.applied_index
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_every_flipped_bit_and_truncation() {
        let m = Manifest {
            applied_index: 30,
            segments: vec![(1, 10), (11, 25), (26, 30)],
        };
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes).unwrap(), m);
        for bit in 0..bytes.len() * 8 {
            let mut bad = bytes.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(Manifest::decode(&bad).is_err(), "bit {bit}");
        }
        for len in 0..bytes.len() {
            assert!(Manifest::decode(&bytes[..len]).is_err(), "length {len}");
        }
    }

    #[test]
    fn gaps_and_overlaps_are_refused() {
        let gap = Manifest {
            applied_index: 30,
            segments: vec![(1, 10), (12, 30)],
        };
        assert!(gap.check().is_err());
        let short = Manifest {
            applied_index: 31,
            segments: vec![(1, 30)],
        };
        assert!(short.check().is_err());
        assert!(Manifest::default().check().is_ok());
    }
}
