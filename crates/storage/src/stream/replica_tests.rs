//! The replication seam through the in-memory file system: a follower's copy is byte for byte
//! the leader's, readers see only what the cluster committed, a member cuts the chunks no
//! majority held at the new leader's epoch end, and bad copies are refused.

use super::chunk::{self, Entries, Entry, EntryBatch};
use super::index;
use super::tests::{file_system, flush};
use super::*;
use crate::file_cache::FileCache;
use crate::memory_file_system::{MemoryFileSystem, PowerCut};
use crate::queue_log::SyncDue;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const NOW_MS: i64 = 1_700_000_000_000;

fn member_directory(name: &str) -> PathBuf {
    Path::new("/data/streams").join(name)
}

/// A member's stream, replicated, knowing the cluster committed below `committed`.
fn open_member(file_system: &MemoryFileSystem, name: &str, committed: u64) -> Arc<Stream> {
    let cache = FileCache::with_file_system(16, file_system.shared());
    let settings = StreamSettings { segment_bytes_max: 600, ..StreamSettings::default() };
    let (stream, _) = Stream::open(&member_directory(name), settings, cache).expect("open the stream");
    stream.enable_replication(committed).expect("replicate");
    stream
}

fn record(offset: u64) -> Vec<u8> {
    format!("record {offset} {}", "r".repeat((offset % 29) as usize)).into_bytes()
}

/// Appends records, a batch with a publisher's sequence and a stored offset, `rounds` times.
fn write_some(stream: &Stream, rounds: u64, tag: &str) {
    for round in 0..rounds {
        for _ in 0..3 {
            stream.append_record(format!("{tag} record {round}").as_bytes(), NOW_MS + round as i64).expect("append");
        }
        let mut data = Vec::new();
        for body in 0..4 {
            chunk::put_simple_entry(&mut data, &record(body)).expect("entry");
        }
        let batch = EntryBatch::counted(&data).expect("batch");
        stream.append_batch(&batch, Some((tag.as_bytes(), round)), NOW_MS + round as i64).expect("batch");
        stream.store_offset(format!("consumer-{tag}").as_bytes(), round, NOW_MS).expect("store");
        flush(stream);
    }
}

/// Every chunk `stream` synced from `from`, whole, with whether it starts a segment: what a
/// leader sends.
fn synced_chunks(stream: &Arc<Stream>, from: u64) -> Vec<(bool, Vec<u8>)> {
    let mut reader = stream.replication_reader(from).expect("replication reader");
    let mut chunks = Vec::new();
    while let Some(location) = reader.next_chunk().expect("next chunk") {
        let mut bytes = Vec::new();
        location.read_whole(&mut bytes).expect("read the chunk");
        chunks.push((location.starts_segment(), bytes));
    }
    chunks
}

/// Sends the follower what the leader synced beyond the follower's end; returns the chunks sent.
fn ship(leader: &Arc<Stream>, follower: &Stream) -> usize {
    let chunks = synced_chunks(leader, follower.tail().next_offset);
    for (starts_segment, bytes) in &chunks {
        follower.append_replicated(bytes, *starts_segment, NOW_MS).expect("append the copy");
    }
    flush(follower);
    chunks.len()
}

fn read_all(stream: &Arc<Stream>) -> Vec<(u64, Vec<u8>)> {
    let mut reader = stream.reader(OffsetSpec::First, ChunkSelector::UserData).expect("reader");
    let (mut data, mut records) = (Vec::new(), Vec::new());
    while let Some(header) = reader.read_chunk(&mut data).expect("read") {
        // AMQP records and these batches are simple entries: one offset each.
        for (offset, entry) in (header.first_offset..).zip(Entries::new(&data)) {
            if let Entry::Simple(body) = entry.expect("entry") {
                records.push((offset, body.to_vec()));
            }
        }
    }
    records
}

/// Every segment and index file of a member, by name.
fn files(file_system: &MemoryFileSystem, name: &str) -> Vec<(String, Vec<u8>)> {
    let directory = member_directory(name);
    let mut names = file_system.shared().list_directory(&directory).expect("list");
    names.sort();
    names.into_iter().map(|file| (file.clone(), file_system.contents(&directory.join(&file)).expect("contents"))).collect()
}

#[test]
fn a_follower_holds_the_leaders_chunks_byte_for_byte_and_readers_see_only_what_the_cluster_committed() {
    let file_system = file_system();
    let leader = open_member(&file_system, "leader", 0);
    let follower = open_member(&file_system, "follower", 0);
    leader.set_epoch(1).expect("epoch");
    write_some(&leader, 12, "a");
    assert!(leader.info().segments > 2, "the test means to cross segment rolls");
    let sent = ship(&leader, &follower);
    assert!(sent > 12, "every chunk, tracking ones included, was sent ({sent})");
    assert_eq!(files(&file_system, "leader"), files(&file_system, "follower"), "segments and indexes identical");
    assert_eq!(follower.synced_next_offset(), leader.synced_next_offset());
    assert!(read_all(&leader).is_empty() && read_all(&follower).is_empty(), "nothing readable before the cluster commits");

    let end = leader.tail().next_offset;
    let middle = {
        let mut reader = leader.replication_reader(end / 2).expect("reader");
        reader.next_chunk().expect("chunk").expect("a chunk").header.first_offset
    };
    for member in [&leader, &follower] {
        member.commit_replicated(middle);
        let readable = read_all(member);
        assert!(!readable.is_empty() && readable.iter().all(|(offset, _)| *offset < middle), "readable only below {middle}");
        member.commit_replicated(end);
    }
    assert_eq!(read_all(&leader), read_all(&follower));
    assert_eq!(read_all(&leader).len(), 12 * 7);
    assert_eq!(follower.query_offset(b"consumer-a"), Some(11), "tracking copied with the chunks");
    assert_eq!(follower.publisher_sequence(b"a"), Some(11));
    let last = |stream: &Arc<Stream>| stream.reader(OffsetSpec::Last, ChunkSelector::UserData).expect("reader").next_offset();
    assert_eq!(last(&leader), last(&follower), "`last` is the same chunk on both");
}

#[test]
fn a_chunk_committed_by_the_cluster_waits_for_this_nodes_own_sync() {
    let file_system = file_system();
    let leader = open_member(&file_system, "leader", 0);
    leader.append_record(b"one", NOW_MS).expect("append");
    leader.commit_replicated(1);
    let written = leader.write_pending(SyncDue::Now).expect("write");
    assert!(read_all(&leader).is_empty(), "written but not synced here");
    for file in &written.sync_now {
        file.sync().expect("sync");
    }
    leader.commit(written.commit.expect("a point"));
    assert_eq!(read_all(&leader), vec![(0, b"one".to_vec())]);
}

#[test]
fn a_member_cuts_the_chunks_no_majority_held_at_the_new_leaders_epoch_end() {
    let file_system = file_system();
    let old_leader = open_member(&file_system, "a", 0);
    let new_leader = open_member(&file_system, "b", 0);
    old_leader.set_epoch(1).expect("epoch");
    write_some(&old_leader, 4, "a");
    ship(&old_leader, &new_leader);
    let committed = old_leader.tail().next_offset;
    old_leader.commit_replicated(committed);
    new_leader.commit_replicated(committed);
    // Written by the old leader alone before it died: never confirmed.
    write_some(&old_leader, 3, "lost");
    assert!(old_leader.tail().next_offset > committed);
    drop(old_leader);

    new_leader.set_epoch(2).expect("epoch");
    write_some(&new_leader, 2, "b");
    let before_epoch_two = committed;
    assert_eq!(new_leader.epoch_end(1).expect("epoch end"), before_epoch_two, "epoch 2 starts where epoch 1 ended here");
    assert_eq!(new_leader.epoch_end(2).expect("epoch end"), new_leader.tail().next_offset);

    // The old leader comes back as a follower.
    let member = open_member(&file_system, "a", committed);
    assert_eq!(read_all(&member).len(), 4 * 7, "the committed part readable at once after the restart");
    let tail = member.tail();
    assert_eq!(tail.last_epoch, 1);
    let cut = tail.next_offset.min(new_leader.epoch_end(tail.last_epoch).expect("epoch end"));
    assert_eq!(cut, committed);
    assert!(matches!(member.truncate_from(committed - 1), Err(StreamError::BadTruncation { .. })), "committed chunks stay");
    member.truncate_from(cut).expect("cut");
    assert_eq!(member.tail(), StreamTail { last_epoch: 1, next_offset: committed });
    assert_eq!(member.publisher_sequence(b"lost"), None, "tracking of the cut chunks is gone");
    ship(&new_leader, &member);
    assert_eq!(files(&file_system, "a"), files(&file_system, "b"));
    let end = new_leader.tail().next_offset;
    member.commit_replicated(end);
    new_leader.commit_replicated(end);
    assert_eq!(read_all(&member), read_all(&new_leader));
    assert_eq!(member.publisher_sequence(b"b"), Some(1));

    // And after another restart, the cut stays cut.
    drop(member);
    let member = open_member(&file_system, "a", end);
    assert_eq!(read_all(&member), read_all(&new_leader));
}

#[test]
fn a_copy_out_of_sequence_damaged_or_from_an_older_epoch_is_refused_and_changes_nothing() {
    let file_system = file_system();
    let leader = open_member(&file_system, "leader", 0);
    let follower = open_member(&file_system, "follower", 0);
    leader.set_epoch(3).expect("epoch");
    write_some(&leader, 2, "a");
    let chunks: Vec<Vec<u8>> = synced_chunks(&leader, 0).into_iter().map(|(_, bytes)| bytes).collect();
    assert!(matches!(follower.append_replicated(&chunks[1], false, NOW_MS), Err(StreamError::OutOfSequence { found: 3, expected: 0 })));
    let mut flipped = chunks[0].clone();
    *flipped.last_mut().expect("a byte") ^= 1;
    assert!(matches!(follower.append_replicated(&flipped, true, NOW_MS), Err(StreamError::BadBatch(_))));
    assert!(matches!(follower.append_replicated(&chunks[0][..20], true, NOW_MS), Err(StreamError::BadBatch(_))));
    assert_eq!(follower.tail(), StreamTail { last_epoch: 0, next_offset: 0 });
    follower.append_replicated(&chunks[0], true, NOW_MS).expect("the right chunk");
    assert!(matches!(leader.set_epoch(2), Err(StreamError::StaleEpoch { epoch: 2, last: 3 })));
    let older = single_chunk_of_epoch(&file_system, 2, 3);
    assert!(matches!(follower.append_replicated(&older, false, NOW_MS), Err(StreamError::StaleEpoch { epoch: 2, last: 3 })));
    assert_eq!(follower.tail(), StreamTail { last_epoch: 3, next_offset: 3 });
}

/// A one-record chunk with `epoch`, starting at `offset`, written by a stream of its own.
fn single_chunk_of_epoch(file_system: &MemoryFileSystem, epoch: u64, offset: u64) -> Vec<u8> {
    let other = open_member(file_system, "other", 0);
    for _ in 0..offset {
        other.append_record(b"filler", NOW_MS).expect("append");
    }
    flush(&other);
    other.set_epoch(epoch).expect("epoch");
    other.append_record(b"late", NOW_MS).expect("append");
    flush(&other);
    synced_chunks(&other, offset).into_iter().next().expect("the chunk").1
}

#[test]
fn a_leader_whose_followers_are_behind_refuses_appends_past_its_bound() {
    let file_system = file_system();
    let leader = open_member(&file_system, "leader", 0);
    let mut stored = 0u64;
    loop {
        match leader.store_offset(b"consumer", stored, NOW_MS) {
            Ok(()) => stored += 1,
            Err(StreamError::ReplicationBehind { chunks }) => {
                assert_eq!(chunks, UNREPLICATED_CHUNKS_MAX);
                break;
            }
            Err(error) => panic!("store: {error}"),
        }
        assert!(stored <= UNREPLICATED_CHUNKS_MAX as u64, "past the bound");
    }
    // Segment rolls add tracking snapshots, which count too.
    assert!(stored > UNREPLICATED_CHUNKS_MAX as u64 / 2, "refused early, after {stored}");
    assert!(matches!(leader.append_record(b"one more", NOW_MS), Err(StreamError::ReplicationBehind { .. })));
    flush(&leader);
    leader.commit_replicated(leader.tail().next_offset);
    leader.append_record(b"one more", NOW_MS).expect("room again once committed");
}

/// Small segments, and retention that keeps about five of them.
fn retained() -> StreamSettings {
    StreamSettings {
        segment_bytes_max: 600,
        retention: Retention { max_bytes: Some(3_000), max_age_ms: None },
        ..StreamSettings::default()
    }
}

fn open_retained(file_system: &MemoryFileSystem, name: &str, committed: u64) -> Arc<Stream> {
    let cache = FileCache::with_file_system(16, file_system.shared());
    let (stream, _) = Stream::open(&member_directory(name), retained(), cache).expect("open the stream");
    stream.enable_replication(committed).expect("replicate");
    stream
}

/// A leader and a follower that copied its first rounds, then the leader alone went on until
/// its retention deleted what the follower lacks. Returns them and the leader's first offset.
fn follower_behind_retention(file_system: &MemoryFileSystem) -> (Arc<Stream>, Arc<Stream>, u64) {
    let leader = open_retained(file_system, "leader", 0);
    let follower = open_retained(file_system, "follower", 0);
    leader.set_epoch(1).expect("epoch");
    write_some(&leader, 3, "a");
    ship(&leader, &follower);
    let copied = follower.tail().next_offset;
    follower.commit_replicated(copied);
    write_some(&leader, 30, "b");
    leader.commit_replicated(leader.tail().next_offset);
    leader.evaluate_retention(NOW_MS);
    let first_offset = leader.info().first_offset;
    assert!(first_offset > copied, "retention kept offset {copied} (first {first_offset}): the test needs it gone");
    (leader, follower, first_offset)
}

#[test]
fn a_follower_behind_the_leaders_retention_drops_its_log_and_copies_from_the_leaders_first_offset() {
    let file_system = file_system();
    let (leader, follower, first_offset) = follower_behind_retention(&file_system);
    let old_end = follower.tail().next_offset;
    assert!(matches!(follower.reset_to(old_end), Err(StreamError::NotBehind { .. })), "a log reaching the first offset stays");
    assert!(matches!(leader.reset_to(first_offset), Err(StreamError::NotBehind { .. })), "nor one going past it");
    let mut waiting = follower.reader(OffsetSpec::Next, ChunkSelector::All).expect("reader at the end");
    let mut from_first = follower.reader(OffsetSpec::First, ChunkSelector::All).expect("reader at the first");
    assert_eq!(follower.query_offset(b"consumer-a"), Some(2));

    let dropped = follower.reset_to(first_offset).expect("reset");
    assert!(dropped >= 1);
    assert_eq!(follower.tail(), StreamTail { last_epoch: 0, next_offset: first_offset });
    assert_eq!((follower.info().first_offset, follower.synced_next_offset()), (first_offset, first_offset));
    assert_eq!(follower.query_offset(b"consumer-a"), None, "tracking of the dropped log is gone");
    assert!(from_first.next_chunk().expect("read").is_none(), "nothing readable below the new first offset");
    let names: Vec<String> = files(&file_system, "follower").into_iter().map(|(name, _)| name).collect();
    assert_eq!(names, [index::index_file_name(first_offset), index::segment_file_name(first_offset)], "nothing of the old log");

    let sent = ship(&leader, &follower);
    assert!(sent > 3);
    assert!(same_segments(&file_system, &file_system, first_offset), "the same segments, byte for byte");
    let end = leader.tail().next_offset;
    follower.commit_replicated(end);
    assert_eq!(read_all(&follower), read_all(&leader));
    for reader in [&mut waiting, &mut from_first] {
        let chunk = reader.next_chunk().expect("read").expect("a chunk");
        assert_eq!(chunk.header.first_offset, first_offset, "a reader in the dropped log goes on from the new first offset");
    }
    assert_eq!(follower.query_offset(b"consumer-b"), leader.query_offset(b"consumer-b"), "tracking from the leader's snapshot");
    assert_eq!(follower.publisher_sequence(b"b"), Some(29));

    drop((waiting, from_first, follower));
    let follower = open_retained(&file_system, "follower", end);
    assert_eq!(read_all(&follower), read_all(&leader), "the reset log after a restart");
    assert_eq!(follower.tail(), leader.tail());
    assert_eq!(follower.publisher_sequence(b"b"), Some(29));
}

#[test]
fn a_crash_at_any_point_of_a_reset_and_its_first_copy_leaves_the_old_log_or_a_part_of_the_new_one() {
    let (mut old_logs, mut new_logs) = (0, 0);
    for crash_at in 1..200 {
        let file_system = file_system();
        let (leader, follower, first_offset) = follower_behind_retention(&file_system);
        let old_tail = follower.tail();
        follower.commit_replicated(old_tail.next_offset);
        let old_records = read_all(&follower);
        let leader_records = read_all(&leader);
        let chunks = synced_chunks(&leader, first_offset);
        file_system.crash_at_operation(crash_at);
        let outcome = reset_and_copy(&follower, first_offset, &chunks);
        let Some(point) = file_system.crashed() else {
            outcome.expect("a reset and copy without a crash");
            assert!(old_logs > 0 && new_logs > 0, "crashes left {old_logs} old logs and {new_logs} new ones");
            return;
        };
        assert!(outcome.is_err(), "the power cut at {point:?} went unnoticed");
        drop(follower);
        // Every other crash also lands the start of the last write (a torn chunk or index entry).
        let cut = match crash_at % 2 {
            0 => PowerCut::TearLastWrite { bytes_kept: 40 },
            _ => PowerCut::LoseUnsynced,
        };
        let restarted = file_system.power_cut(cut);
        let follower = open_retained(&restarted, "follower", old_tail.next_offset);
        let tail = follower.tail();
        follower.commit_replicated(tail.next_offset);
        if tail == old_tail {
            old_logs += 1;
            assert_eq!(read_all(&follower), old_records, "crash at {point:?}: the old log, whole");
            follower.reset_to(first_offset).expect("the reset done again");
        } else {
            new_logs += 1;
            assert_eq!(follower.info().first_offset, first_offset, "crash at {point:?}: neither log ({tail:?})");
            let held: Vec<_> = leader_records.iter().filter(|(offset, _)| *offset < tail.next_offset).cloned().collect();
            assert_eq!(read_all(&follower), held, "crash at {point:?}: the new log holds what it claims");
        }
        let leader = reopen(&restarted, leader);
        ship(&leader, &follower);
        assert!(same_segments(&restarted, &restarted, first_offset), "crash at {point:?}: the copy after it");
    }
    panic!("the reset and copy never ran to their end");
}

/// What a follower's worker does with a leader's answer that resets it: the reset, the chunks
/// appended, written and synced (as the syncer's group commit does).
fn reset_and_copy(follower: &Stream, first_offset: u64, chunks: &[(bool, Vec<u8>)]) -> Result<(), String> {
    follower.reset_to(first_offset).map_err(|error| error.to_string())?;
    for (starts_segment, bytes) in chunks {
        follower.append_replicated(bytes, *starts_segment, NOW_MS).map_err(|error| error.to_string())?;
    }
    let written = follower.write_pending(SyncDue::Now).map_err(|error| error.to_string())?;
    for file in &written.sync_now {
        file.sync().map_err(|error| error.to_string())?;
    }
    Ok(())
}

/// Whether the follower's files are the leader's from `first_offset` on (retention's removals
/// of the leader's older files are the janitor's, in the background).
fn same_segments(leader: &MemoryFileSystem, follower: &MemoryFileSystem, first_offset: u64) -> bool {
    let held = |(name, _): &(String, Vec<u8>)| {
        name.split('.').next().and_then(|stem| stem.parse::<u64>().ok()).is_some_and(|first| first >= first_offset)
    };
    let leader: Vec<_> = files(leader, "leader").into_iter().filter(held).collect();
    !leader.is_empty() && leader == files(follower, "follower")
}

/// The leader again after a power cut, on the restarted file system.
fn reopen(file_system: &MemoryFileSystem, leader: Arc<Stream>) -> Arc<Stream> {
    let committed = leader.committed().next_offset;
    drop(leader);
    open_retained(file_system, "leader", committed)
}
