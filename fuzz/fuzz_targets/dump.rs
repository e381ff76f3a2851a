//! RESTORE and FUNCTION RESTORE payloads (a client's bytes): the input is taken as an object's
//! encoding, or a run of function libraries, and given a valid version and checksum, so the
//! decoders (strings, LZF, intsets, listpacks, ziplists, quicklists, library records) see it.
//! Malformed input is an error, never a panic; whatever decodes encodes and decodes back to the
//! same value.
#![no_main]

use chorus_kv::dump::{decode, decode_libraries, encode, encode_libraries, seal};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode(data);
    if let Ok(value) = decode(&seal(data)) {
        let again = decode(&encode(&value)).expect("an encoded value decodes");
        // NaN never decodes, so values compare exactly.
        assert_eq!(again, value, "a decoded value encodes back to itself");
    }
    if let Ok(libraries) = decode_libraries(&seal(data)) {
        let again = decode_libraries(&encode_libraries(&libraries)).expect("encoded libraries decode");
        assert_eq!(again, libraries, "decoded libraries encode back to themselves");
    }
});
