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
fn a_hard_state_failing_its_checksum_is_damage() {
    let file_system = file_system();
    let (mut store, _) = open(&file_system);
    store.set_hard_state(&HardState { term: 4, vote: 2, commit: 0, ..Default::default() }).expect("written");
    file_system.flip_bit_on_read(&directory().join("hard_state"), 9, 1).expect("flipped");
    let (_, recovery) = open(&file_system);
    assert!(recovery.damaged, "the vote is unknown: {recovery:?}");
}
