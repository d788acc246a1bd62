//! The metadata group's log reopened after a failed write (`write_hold.rs`).

use super::GroupStorage;
use raft::RawNode;
use replication::log_store::LogStore;
use std::path::PathBuf;
use storage::memory_file_system::{FaultOperation, MemoryFileSystem};

const NODE: u64 = 1;

fn storage_on(disk: &MemoryFileSystem) -> GroupStorage {
    let directory = PathBuf::from("/data/cluster/metadata");
    disk.create_durable_directory(&directory);
    let config = raft::Config { id: NODE, election_tick: 10, heartbeat_tick: 2, ..raft::Config::default() };
    GroupStorage { directory, file_system: disk.shared(), checksum_seed: 7, initial_voters: vec![NODE], config }
}

/// Persists what raft-rs has ready, as the driver does (a group of one: its entries commit as
/// soon as they are written); `applied` follows the committed entries handed out.
fn drive(raw: &mut RawNode<LogStore>, applied: &mut Vec<u64>) -> std::io::Result<()> {
    while raw.has_ready() {
        let mut ready = raw.ready();
        raw.mut_store().append(ready.entries())?;
        if let Some(hard_state) = ready.hs() {
            raw.mut_store().set_hard_state(hard_state)?;
        }
        raw.store().sync()?;
        applied.extend(ready.take_committed_entries().iter().map(|entry| entry.index));
        let mut light = raw.advance(ready);
        if let Some(commit) = light.commit_index() {
            raw.mut_store().set_commit(commit);
        }
        applied.extend(light.take_committed_entries().iter().map(|entry| entry.index));
        raw.advance_apply();
    }
    Ok(())
}

#[test]
fn a_group_reopened_after_a_failed_write_goes_on_from_what_it_applied_past_its_durable_commit() {
    let disk = MemoryFileSystem::new();
    let storage = storage_on(&disk);
    let (mut raw, _) = storage.open(None).expect("the log opens");
    raw.campaign().expect("a group of one campaigns");
    let mut applied = Vec::new();
    drive(&mut raw, &mut applied).expect("written");
    for number in 0..5u8 {
        raw.propose(Vec::new(), vec![number]).expect("proposed");
    }
    drive(&mut raw, &mut applied).expect("written");
    let applied_before = *applied.last().expect("entries applied");
    // The commit index is kept in memory between changes of term or vote: on disk it trails what
    // was applied, and raft-rs refuses an applied index past its commit (it panics).
    let (durable, _) = LogStore::open(disk.shared(), &storage.directory, storage.checksum_seed, &[NODE]).expect("the log reads");
    assert!(durable.hard_state().commit < applied_before, "the test needs a durable commit behind the applied index");

    disk.fail(FaultOperation::Write, libc::ENOSPC, &storage.directory, u64::MAX);
    raw.propose(Vec::new(), b"while full".to_vec()).expect("proposed");
    assert!(drive(&mut raw, &mut applied).is_err(), "the write fails");
    let (mut raw, _) = storage.open(Some(applied_before)).expect("reopened from what is durable");
    assert_eq!(raw.store().last_index_now(), applied_before, "the entry that failed to be written is not in the log");

    disk.clear_faults();
    raw.campaign().expect("a group of one campaigns again");
    let mut applied_after = Vec::new();
    drive(&mut raw, &mut applied_after).expect("written once the disk has room");
    raw.propose(Vec::new(), b"after".to_vec()).expect("proposed");
    drive(&mut raw, &mut applied_after).expect("written");
    // Entries between the durable commit and the applied index may come again (the driver skips
    // them); the new ones follow.
    assert!(*applied_after.last().expect("applied") > applied_before + 1, "the new term's entries commit: {applied_after:?}");
}
