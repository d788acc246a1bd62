//! The log store on the in-memory file system: what survives a power cut, how a torn tail and a
//! damaged record are told apart, conflicting appends, compaction.

use bytes::Bytes;
use raft::eraftpb::{Entry, HardState};
use raft::{GetEntriesContext, Storage};
use replication::log_store::LogStore;
use std::path::{Path, PathBuf};
use storage::memory_file_system::{MemoryFileSystem, PowerCut};

const SEED: u32 = 0xABCD;

fn directory() -> PathBuf {
    PathBuf::from("/data/raft/shard-0")
}

fn file_system() -> MemoryFileSystem {
    let file_system = MemoryFileSystem::new();
    file_system.create_durable_directory(Path::new("/data/raft"));
    file_system
}

fn open(file_system: &MemoryFileSystem) -> (LogStore, replication::log_store::Recovery) {
    LogStore::open(file_system.shared(), &directory(), SEED, &[1, 2, 3]).expect("opens")
}

fn entries(range: std::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
    range.map(|index| Entry { index, term, data: Bytes::from(format!("entry {index}")), ..Default::default() }).collect()
}

fn all_entries(store: &LogStore) -> Vec<Entry> {
    let (first, last) = (store.first_index().expect("first"), store.last_index().expect("last"));
    store.entries(first, last + 1, None, GetEntriesContext::empty(false)).expect("entries")
}

#[test]
fn a_vote_survives_a_power_cut() {
    let file_system = file_system();
    let (mut store, _) = open(&file_system);
    store.set_hard_state(&HardState { term: 4, vote: 2, commit: 0, ..Default::default() }).expect("written");
    let file_system = file_system.power_cut(PowerCut::LoseUnsynced);
    let (store, recovery) = open(&file_system);
    assert!(!recovery.damaged);
    assert_eq!((store.hard_state().term, store.hard_state().vote), (4, 2));
}

#[test]
fn synced_entries_survive_and_unsynced_or_torn_ones_are_cut_without_damage() {
    for cut in [PowerCut::LoseUnsynced, PowerCut::TearLastWrite { bytes_kept: 30 }] {
        let file_system = file_system();
        let (mut store, _) = open(&file_system);
        store.append(&entries(1..=5, 1)).expect("appended");
        store.sync().expect("synced");
        store.append(&entries(6..=8, 1)).expect("appended");
        let file_system = file_system.power_cut(cut);
        let (store, recovery) = open(&file_system);
        assert!(!recovery.damaged, "{cut:?}: {recovery:?}");
        assert_eq!(all_entries(&store), entries(1..=5, 1), "{cut:?}");
        if let PowerCut::TearLastWrite { .. } = cut {
            assert_eq!(recovery.torn_tail_bytes, 30);
        }
    }
}

#[test]
fn a_whole_record_failing_its_checksum_is_damage_and_the_records_before_it_stay() {
    let file_system = file_system();
    let (mut store, _) = open(&file_system);
    store.append(&entries(1..=3, 1)).expect("appended");
    // Every record here has the same length.
    let second_record_offset = file_system.contents(&store.log_path()).expect("log").len() as u64 / 3;
    store.append(&entries(4..=6, 1)).expect("appended");
    store.sync().expect("synced");
    // A byte inside the second record's body.
    file_system.flip_bit_on_read(&store.log_path(), second_record_offset + 12, 0).expect("flipped");
    let (store, recovery) = open(&file_system);
    assert!(recovery.damaged, "{recovery:?}");
    assert_eq!(all_entries(&store), entries(1..=1, 1));
}

#[test]
fn a_conflicting_append_replaces_the_suffix_durably() {
    let file_system = file_system();
    let (mut store, _) = open(&file_system);
    store.append(&entries(1..=5, 1)).expect("appended");
    store.append(&entries(3..=4, 2)).expect("appended");
    store.sync().expect("synced");
    let file_system = file_system.power_cut(PowerCut::LoseUnsynced);
    let (store, recovery) = open(&file_system);
    assert!(!recovery.damaged);
    let mut expected = entries(1..=2, 1);
    expected.extend(entries(3..=4, 2));
    assert_eq!(all_entries(&store), expected);
}

#[test]
fn a_compacted_log_reopens_after_its_snapshot() {
    let file_system = file_system();
    let (mut store, _) = open(&file_system);
    store.append(&entries(1..=10, 1)).expect("appended");
    store.sync().expect("synced");
    store.set_hard_state(&HardState { term: 1, vote: 1, commit: 10, ..Default::default() }).expect("written");
    store.compact(6, b"image".to_vec()).expect("compacted");
    let file_system = file_system.power_cut(PowerCut::LoseUnsynced);
    let (store, recovery) = open(&file_system);
    assert!(!recovery.damaged);
    assert_eq!(store.first_index().expect("first"), 7);
    assert_eq!(store.term(6).expect("the snapshot's term"), 1);
    assert_eq!(all_entries(&store), entries(7..=10, 1));
    assert_eq!(&store.snapshot_ref().data[..], b"image");
}

#[test]
fn a_hard_state_failing_its_checksum_in_both_copies_is_damage() {
    let file_system = file_system();
    let (mut store, _) = open(&file_system);
    store.set_hard_state(&HardState { term: 4, vote: 2, commit: 0, ..Default::default() }).expect("written");
    file_system.flip_bit_on_read(&directory().join("hard_state"), 9, 1).expect("flipped");
    file_system.flip_bit_on_read(&directory().join("hard_state.copy"), 12, 3).expect("flipped");
    let (_, recovery) = open(&file_system);
    assert!(recovery.damaged, "the vote is unknown: {recovery:?}");
}

/// Either copy of the hard state damaged: the vote is read from the other, and the node is not
/// held back as damaged (it knows whom it voted for).
#[test]
fn a_hard_state_copy_failing_its_checksum_is_read_from_the_other() {
    for damaged in ["hard_state", "hard_state.copy"] {
        let file_system = file_system();
        let (mut store, _) = open(&file_system);
        store.set_hard_state(&HardState { term: 4, vote: 2, commit: 0, ..Default::default() }).expect("written");
        file_system.flip_bit_on_read(&directory().join(damaged), 9, 1).expect("flipped");
        let (store, recovery) = open(&file_system);
        assert!(!recovery.damaged, "{damaged}: {recovery:?}");
        assert_eq!(recovery.hard_state_copies_damaged, 1, "{damaged}");
        assert_eq!((store.hard_state().term, store.hard_state().vote), (4, 2), "{damaged}");
    }
}

/// A crash between the two replacements leaves the first copy newer: it is the one read,
/// whichever file holds it.
#[test]
fn of_two_readable_copies_the_newer_is_read() {
    let read = |file_system: &MemoryFileSystem, name: &str| -> Vec<u8> {
        let file = file_system.shared().open(&directory().join(name), storage::file_system::OpenMode::Read).expect("opened");
        let mut bytes = vec![0; file.len().expect("length") as usize];
        file.read_exact_at(&mut bytes, 0).expect("read");
        bytes
    };
    let write = |file_system: &MemoryFileSystem, name: &str, bytes: &[u8]| {
        let file = file_system.shared().open(&directory().join(name), storage::file_system::OpenMode::CreateReadWrite).expect("opened");
        file.set_len(0).expect("truncated");
        file.write_all_at(bytes, 0).expect("written");
        file.sync_data().expect("synced");
    };
    for stale in ["hard_state", "hard_state.copy"] {
        let file_system = file_system();
        let (mut store, _) = open(&file_system);
        store.set_hard_state(&HardState { term: 4, vote: 0, commit: 0, ..Default::default() }).expect("written");
        let older = read(&file_system, "hard_state");
        store.set_hard_state(&HardState { term: 4, vote: 3, commit: 0, ..Default::default() }).expect("written");
        write(&file_system, stale, &older);
        let (store, recovery) = open(&file_system);
        assert!(!recovery.damaged);
        assert_eq!((store.hard_state().term, store.hard_state().vote), (4, 3), "the vote of term 4 kept, {stale} stale");
    }
}

/// Only the newest entries stay in memory (LOG_CACHE_BYTES_MAX): older ones are read back from the
/// file, checked, after a conflicting append, a compaction and a restart alike.
#[test]
fn old_entries_are_read_from_the_file_not_kept_in_memory() {
    let big = |range: std::ops::RangeInclusive<u64>, term: u64| -> Vec<Entry> {
        range
            .map(|index| {
                let mut data = vec![index as u8; 64 << 10];
                data[0] = term as u8;
                Entry { index, term, data: Bytes::from(data), ..Default::default() }
            })
            .collect()
    };
    let file_system = file_system();
    let (mut store, _) = open(&file_system);
    store.set_cache_bytes_max(1 << 20);
    store.append(&big(1..=60, 1)).expect("appended");
    store.sync().expect("synced");
    assert!(store.cached_entries() <= 16, "{} entries of 64 KiB kept in memory", store.cached_entries());
    assert_eq!(all_entries(&store), big(1..=60, 1), "every entry, most of them read from the file");
    // A new leader overwrote the suffix from 50 on.
    store.append(&big(50..=55, 2)).expect("appended");
    let mut expected = big(1..=49, 1);
    expected.extend(big(50..=55, 2));
    assert_eq!(all_entries(&store), expected);
    store.set_hard_state(&HardState { term: 2, vote: 1, commit: 55, ..Default::default() }).expect("written");
    store.compact(20, b"image".to_vec()).expect("compacted");
    assert_eq!(all_entries(&store), expected[20..].to_vec());
    store.sync().expect("synced");
    let (store, recovery) = open(&file_system);
    assert!(!recovery.damaged);
    assert_eq!(all_entries(&store), expected[20..].to_vec());
}

/// The shard's members after a membership change (voters, learners and the change's index) are
/// durable, and a snapshot carries the learners; a hard state written before learners existed
/// reads as voters only.
#[test]
fn members_with_learners_survive_a_power_cut_and_a_compaction() {
    use raft::eraftpb::ConfState;
    let file_system = file_system();
    let (mut store, _) = open(&file_system);
    store.append(&entries(1..=10, 1)).expect("appended");
    store.sync().expect("synced");
    store.set_hard_state(&HardState { term: 1, vote: 1, commit: 10, ..Default::default() }).expect("written");
    let members = ConfState { voters: vec![1, 2, 3], learners: vec![4], ..Default::default() };
    store.set_conf_state_at(members.clone(), 5).expect("written");
    let file_system = file_system.power_cut(PowerCut::LoseUnsynced);
    let (mut store, recovery) = open(&file_system);
    assert!(!recovery.damaged);
    assert_eq!((store.conf_state().voters.clone(), store.conf_state().learners.clone()), (vec![1, 2, 3], vec![4]));
    assert_eq!(store.conf_index(), 5);
    assert_eq!(store.initial_state().expect("state").conf_state.learners, vec![4]);
    store.compact(8, b"image".to_vec()).expect("compacted");
    assert_eq!(store.snapshot_ref().get_metadata().get_conf_state().learners, vec![4]);
    let file_system = file_system.power_cut(PowerCut::LoseUnsynced);
    let (store, _) = open(&file_system);
    assert_eq!(store.snapshot_ref().get_metadata().get_conf_state().learners, vec![4]);
    assert_eq!(store.conf_index(), 8, "the snapshot holds every change up to its index");

    // A hard state of before: term, vote, commit, voters, checksum.
    let mut old = Vec::new();
    let mut writer = replication::codec::Writer(&mut old);
    for value in [3u64, 2, 0] {
        writer.u64(value);
    }
    writer.u32(3);
    for voter in [1u64, 2, 3] {
        writer.u64(voter);
    }
    replication::codec::append_checksum(&mut old, 0, SEED);
    let file_system = self::file_system();
    let shared = file_system.shared();
    shared.create_dir_all(&directory()).expect("made");
    let file = shared.open(&directory().join("hard_state"), storage::file_system::OpenMode::CreateReadWrite).expect("opened");
    file.write_all_at(&old, 0).expect("written");
    file.sync_data().expect("synced");
    let (store, recovery) = open(&file_system);
    assert!(!recovery.damaged);
    assert_eq!((store.conf_state().voters.clone(), store.conf_state().learners.clone(), store.conf_index()), (vec![1, 2, 3], vec![], 0));
    assert_eq!(store.hard_state().term, 3);
}

#[test]
fn an_append_that_fails_on_a_full_disk_adds_nothing_and_the_same_entries_append_once_there_is_room() {
    use storage::memory_file_system::FaultOperation;
    const ENOSPC: i32 = 28;
    let file_system = file_system();
    let (mut store, _) = open(&file_system);
    store.append(&entries(1..=5, 1)).expect("appended");
    store.sync().expect("synced");
    file_system.fail(FaultOperation::Write, ENOSPC, Path::new("/data/raft"), 1);
    let error = store.append(&entries(6..=8, 1)).expect_err("the disk is full");
    assert_eq!(error.raw_os_error(), Some(ENOSPC));
    assert_eq!(store.last_index().expect("last"), 5, "a failed append adds nothing");
    assert_eq!(all_entries(&store), entries(1..=5, 1));
    store.append(&entries(6..=9, 1)).expect("appended once there is room");
    store.sync().expect("synced");
    let (store, recovery) = open(&file_system);
    assert!(!recovery.damaged, "{recovery:?}");
    assert_eq!(all_entries(&store), entries(1..=9, 1));
}
