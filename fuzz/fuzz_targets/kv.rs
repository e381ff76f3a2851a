//! The key-value state machine's inputs from the log: command argument lists (plain and with RIFL
//! envelopes), RIFL's lease commands, command parsing (and COMMAND GETKEYS's search for keys)
//! and applying. (What a leader ships, segment files and a manifest, is the `segment` target's.)
#![no_main]

use std::sync::Mutex;

use chorus_kv::command::{decode_logged, table, Command, Logged};
use chorus_kv::KvState;
use chorus_log::StateMachine;
use chorus_storage::StoreOptions;
use libfuzzer_sys::fuzz_target;

/// One state for the whole run (opening one per input would measure the file system): the
/// directory, the state and its next log index.
static STATE: Mutex<Option<(tempfile::TempDir, KvState, u64)>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    if let Ok(Logged::Args(args) | Logged::Enveloped(_, args)) = decode_logged(data) {
        let _ = Command::parse(&args);
        let _ = table::keys_of(&args);
    }
    let mut guard = STATE.lock().expect("not poisoned");
    let (_, state, index) = guard.get_or_insert_with(|| {
        let dir = tempfile::tempdir().expect("temporary directory");
        let state = KvState::open(StoreOptions::new(dir.path()), None).expect("open state");
        (dir, state, 0)
    });
    *index += 1;
    let _ = state.apply(*index, data);
    state.entry_applied(*index);
});
