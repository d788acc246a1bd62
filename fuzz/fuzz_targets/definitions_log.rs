//! The definitions change log's reader: arbitrary bytes never panic it, and damage to a written
//! log replays a prefix of the changes written, never another (see `storage::fuzz_checks`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    storage::fuzz_checks::definitions_log_bytes(data);
    storage::fuzz_checks::definitions_log_damage(data);
});
