//! HyperLogLog strings as a client may store them (SET takes any bytes): checking, counting,
//! merging, adding and turning dense must answer malformed ones with an error, never panic, and
//! agree with each other on well-formed ones.
#![no_main]

use chorus_kv::hyperloglog::{self as hll, REGISTERS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&op, value)) = data.split_first() else {
        return;
    };
    if hll::check(value).is_err() {
        return;
    }
    let mut registers = [0u8; REGISTERS];
    let merged = hll::merge_into(&mut registers, value);
    let counted = hll::count(value);
    let mut dense = value.to_vec();
    if hll::make_dense(&mut dense).is_ok() {
        assert_eq!(hll::check(&dense), Ok(()), "a HyperLogLog made dense stays one");
        let mut dense_registers = [0u8; REGISTERS];
        hll::merge_into(&mut dense_registers, &dense).expect("a dense HyperLogLog always merges");
        if merged.is_ok() {
            assert!(
                registers == dense_registers,
                "the dense form holds the sparse form's registers"
            );
        }
        if counted.is_ok() {
            assert_eq!(hll::count(&dense), counted, "both forms count alike");
        }
    }
    let mut added = value.to_vec();
    for element in data.chunks(1 + usize::from(op % 16)) {
        match hll::add(&mut added, element) {
            Ok(_) => assert_eq!(hll::check(&added), Ok(()), "adding keeps a HyperLogLog one"),
            Err(_) => break,
        }
    }
});
