//! An exported state: a manifest and the bytes of the segments it lists, as one buffer a follower
//! that is behind the compacted raft log installs.
//!
//! ```text
//! "CHSB" | format u16 | manifest length u32 | manifest
//!        | per listed segment: length u64 | segment bytes | crc32 of everything before
//! ```

use crate::manifest::Manifest;
use crate::segment::{corrupt, open_frame, seal_frame, start_frame, SegmentError, FRAME_HEADER_BYTES};

const MAGIC: &[u8; 4] = b"CHSB";
const FORMAT_VERSION: u16 = 1;

pub fn encode(manifest: &Manifest, segments: &[Vec<u8>]) -> Vec<u8> {
    assert_eq!(manifest.segments.len(), segments.len(), "one buffer per listed segment");
    let manifest_bytes = manifest.encode();
    let total: usize = segments.iter().map(|s| s.len() + 8).sum();
    let mut out = start_frame(MAGIC, FORMAT_VERSION, 4 + manifest_bytes.len() + total);
    out.extend_from_slice(&(manifest_bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&manifest_bytes);
    for segment in segments {
        out.extend_from_slice(&(segment.len() as u64).to_le_bytes());
        out.extend_from_slice(segment);
    }
    seal_frame(out)
}

/// The manifest and each listed segment's bytes. Segment contents are checked by the caller.
pub fn decode(buf: &[u8]) -> Result<(Manifest, Vec<&[u8]>), SegmentError> {
    let content = open_frame(buf, MAGIC, FORMAT_VERSION, 4, "an exported state")?;
    // Offsets below are into `buf`, for error messages; `body` is `buf` without its checksum.
    let body = &buf[..FRAME_HEADER_BYTES + content.len()];
    let manifest_len = u32::from_le_bytes(content[..4].try_into().expect("4 bytes")) as usize;
    let mut pos: usize = FRAME_HEADER_BYTES + 4;
    let manifest_bytes = body
        .get(pos..pos.saturating_add(manifest_len))
        .ok_or_else(|| corrupt(pos, "truncated manifest"))?;
    let manifest = Manifest::decode(manifest_bytes).map_err(|e| match e {
        SegmentError::Corrupt { offset, reason } => corrupt(pos + offset as usize, reason),
        other => other,
    })?;
    pos += manifest_len;
    let mut segments = Vec::with_capacity(manifest.segments.len().min(body.len() / 8));
    for i in 0..manifest.segments.len() {
        let len_bytes = body
            .get(pos..pos + 8)
            .ok_or_else(|| corrupt(pos, format!("truncated length of segment {i}")))?;
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
        pos += 8;
        let segment = usize::try_from(len)
            .ok()
            .and_then(|len| body.get(pos..pos.checked_add(len)?))
            .ok_or_else(|| corrupt(pos, format!("truncated segment {i}")))?;
        pos += segment.len();
        segments.push(segment);
    }
    if pos != body.len() {
        return Err(corrupt(pos, "trailing bytes after the last segment"));
    }
    Ok((manifest, segments))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let manifest = Manifest {
            applied_index: 9,
            segments: vec![(1, 4), (5, 9)],
        };
        let segments = vec![vec![1u8; 40], vec![2u8; 7]];
        let bytes = encode(&manifest, &segments);
        let (m, s) = decode(&bytes).unwrap();
        assert_eq!(m, manifest);
        assert_eq!(s, vec![&segments[0][..], &segments[1][..]]);
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(decode(&bad).is_err(), "flip at {at}");
        }
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "length {len}");
        }
    }
}
