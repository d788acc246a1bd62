//! The node journal's reader: arbitrary bytes as a journal file never panic it, and damage to
//! written journal files never makes it return an entry that was not written (see
//! `storage::fuzz_checks`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    storage::fuzz_checks::journal_bytes(data);
    storage::fuzz_checks::journal_damage(data);
});
