//! The RESP parser a client's bytes go through: commands (array and inline) and replies.
#![no_main]

use chorus_resp::{parse_command, parse_value, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let mut rest = data;
    while let Ok(Some((_, used))) = parse_command(rest, &limits) {
        assert!(
            used > 0 && used <= rest.len(),
            "a parsed command consumes bytes it was given"
        );
        rest = &rest[used..];
    }
    let mut rest = data;
    while let Ok(Some((_, used))) = parse_value(rest, &limits) {
        assert!(used > 0 && used <= rest.len());
        rest = &rest[used..];
    }
});
