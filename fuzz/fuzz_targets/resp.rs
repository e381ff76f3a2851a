//! The RESP parser a client's bytes go through: commands (array and inline) and replies. The
//! server takes commands off its input buffer with `take_command`, which must agree with the
//! copying `parse_command` on every input.
#![no_main]

use bytes::BytesMut;
use chorus_resp::{parse_command, parse_value, take_command, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let mut rest = data;
    let mut input = BytesMut::from(data);
    loop {
        let copied = parse_command(rest, &limits);
        let taken = take_command(&mut input, &limits);
        assert_eq!(taken, copied.clone().map(|c| c.map(|(args, _)| args)));
        let Ok(Some((_, used))) = copied else { break };
        assert!(
            used > 0 && used <= rest.len(),
            "a parsed command consumes bytes it was given"
        );
        rest = &rest[used..];
        assert_eq!(&input[..], rest, "take_command consumes what parse_command reports");
    }
    let mut rest = data;
    while let Ok(Some((_, used))) = parse_value(rest, &limits) {
        assert!(used > 0 && used <= rest.len());
        rest = &rest[used..];
    }
});
