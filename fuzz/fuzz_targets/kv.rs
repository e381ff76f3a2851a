//! The key-value state machine's inputs from the log and from snapshots: command argument
//! lists, command parsing and applying, and snapshot restore.
#![no_main]

use chorus_kv::command::{decode_args, Command};
use chorus_kv::KvState;
use chorus_log::StateMachine;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(args) = decode_args(data) {
        let _ = Command::parse(&args);
    }
    let mut state = KvState::new();
    let _ = state.apply(1, data);
    let mut restored = KvState::new();
    if restored.restore(data).is_ok() {
        let snapshot = restored.snapshot();
        let mut again = KvState::new();
        again.restore(&snapshot).expect("a snapshot we wrote restores");
    }
});
