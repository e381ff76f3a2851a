//! What membership and backups read from outside: a configuration change's context (the
//! addresses it brings in, from a peer's log entry), a change a follower forwards and the
//! leader's answer, the WAL's members record, and a backup's header (from a file a user hands to `chorus restore`). What decodes encodes to bytes that
//! decode to the same value.
#![no_main]

use chorus_log::backup::{decode_header, encode_header};
use chorus_log::membership::{
    decode_answer, decode_change, decode_context, decode_members, encode_answer, encode_change, encode_context,
    encode_members,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(addresses) = decode_context(data) {
        assert_eq!(decode_context(&encode_context(&addresses)).ok(), Some(addresses));
    }
    if let Ok(change) = decode_change(data) {
        assert_eq!(decode_change(&encode_change(&change)).ok(), Some(change));
    }
    if let Ok(answer) = decode_answer(data) {
        assert_eq!(decode_answer(&encode_answer(&answer)).ok(), Some(answer));
    }
    if let Ok(members) = decode_members(data) {
        assert_eq!(decode_members(&encode_members(&members)).ok(), Some(members));
    }
    if let Ok(header) = decode_header(data) {
        assert_eq!(decode_header(&encode_header(&header)).ok(), Some(header));
    }
});
