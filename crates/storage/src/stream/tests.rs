//! The stream store through the in-memory file system: offsets, readers from every offset
//! specification, segment rolls, retention, tracking across restarts, the syncer's group commit,
//! power cuts (lost and torn writes), flipped bits, and a model-checked property test.

use super::chunk::{self, Entries, Entry, EntryBatch};
use super::index::{self, IndexEntry};
use super::recovery::scan_segment;
use super::*;
use crate::file_cache::FileCache;
use crate::memory_file_system::{MemoryFileSystem, PowerCut};
use crate::queue_log::SyncDue;
use crate::syncer::{SyncPolicy, Syncer};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const NOW_MS: i64 = 1_700_000_000_000;

fn directory() -> PathBuf {
    Path::new("/data/streams/s").to_path_buf()
}

pub(super) fn file_system() -> MemoryFileSystem {
    let file_system = MemoryFileSystem::new();
    file_system.create_durable_directory(Path::new("/data/streams"));
    file_system
}

fn open_with(file_system: &MemoryFileSystem, settings: StreamSettings) -> (Arc<Stream>, StreamRecovery) {
    let cache = FileCache::with_file_system(16, file_system.shared());
    Stream::open(&directory(), settings, cache).expect("open the stream")
}

fn open(file_system: &MemoryFileSystem) -> (Arc<Stream>, StreamRecovery) {
    open_with(file_system, StreamSettings::default())
}

fn small_segments(bytes: u64) -> StreamSettings {
    StreamSettings { segment_bytes_max: bytes, ..StreamSettings::default() }
}

/// What the syncer does for a stream in one group commit with `--sync always`.
pub(super) fn flush(stream: &Stream) {
    let written = stream.write_pending(SyncDue::Now).expect("write");
    for file in &written.sync_now {
        file.sync().expect("sync");
    }
    if let Some(point) = written.commit {
        stream.commit(point);
    }
}

fn record(offset: u64) -> Vec<u8> {
    format!("record {offset} {}", "r".repeat((offset % 13) as usize)).into_bytes()
}

/// Every record a reader from `spec` yields, with its offset.
fn read_all(stream: &Arc<Stream>, spec: OffsetSpec) -> Vec<(u64, Vec<u8>)> {
    let mut reader = stream.reader(spec, ChunkSelector::UserData).expect("reader");
    let mut data = Vec::new();
    let mut records = Vec::new();
    while let Some(header) = reader.read_chunk(&mut data).expect("read") {
        let mut offset = header.first_offset;
        for entry in Entries::new(&data) {
            match entry.expect("entry") {
                Entry::Simple(body) => records.push((offset, body.to_vec())),
                Entry::SubBatch { records: count, .. } => offset += u64::from(count) - 1,
            }
            offset += 1;
        }
    }
    records
}

fn batch_of(bodies: &[Vec<u8>]) -> Vec<u8> {
    let mut data = Vec::new();
    for body in bodies {
        chunk::put_simple_entry(&mut data, body).expect("entry");
    }
    data
}

#[test]
fn records_and_batches_take_consecutive_offsets_and_read_back_from_every_spec() {
    let file_system = file_system();
    let (stream, _) = open(&file_system);
    for offset in 0..5 {
        assert_eq!(stream.append_record(&record(offset), NOW_MS).expect("append"), offset);
    }
    flush(&stream);
    let data = batch_of(&(5..9).map(record).collect::<Vec<_>>());
    let batch = EntryBatch::counted(&data).expect("batch");
    assert_eq!(stream.append_batch(&batch, Some((b"publisher", 4)), NOW_MS + 10).expect("batch"), 5);
    assert_eq!(stream.append_record(&record(9), NOW_MS + 20).expect("append"), 9);
    flush(&stream);
    let everything: Vec<(u64, Vec<u8>)> = (0..10).map(|offset| (offset, record(offset))).collect();
    assert_eq!(read_all(&stream, OffsetSpec::First), everything);
    assert_eq!(read_all(&stream, OffsetSpec::Next), vec![]);
    assert_eq!(read_all(&stream, OffsetSpec::Last), everything[9..].to_vec(), "last: the start of the last chunk");
    assert_eq!(read_all(&stream, OffsetSpec::Offset(6)), everything[5..].to_vec(), "the whole chunk holding offset 6");
    assert_eq!(stream.reader(OffsetSpec::Offset(6), ChunkSelector::UserData).expect("reader").start_offset(), 6);
    assert_eq!(read_all(&stream, OffsetSpec::Offset(1_000)), vec![], "past the end: next");
    let beyond = stream.reader(OffsetSpec::Offset(1_000), ChunkSelector::UserData).expect("reader");
    assert_eq!((beyond.next_offset(), beyond.start_offset()), (10, 1_000), "waits at the end, skips up to the offset asked for");
    assert_eq!(read_all(&stream, OffsetSpec::Timestamp(NOW_MS + 5)), everything[5..].to_vec());
    assert_eq!(read_all(&stream, OffsetSpec::Timestamp(NOW_MS - 5)), everything);
    assert_eq!(read_all(&stream, OffsetSpec::Timestamp(NOW_MS + 50)), vec![]);
    assert_eq!(stream.publisher_sequence(b"publisher"), Some(4));
}

#[test]
fn readers_see_only_committed_chunks_and_wake_on_commit() {
    let file_system = file_system();
    let (stream, _) = open(&file_system);
    let committed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = committed.clone();
    stream.set_commit_listener(Arc::new(move |next| seen.store(next, std::sync::atomic::Ordering::SeqCst)));
    let mut reader = stream.reader(OffsetSpec::Next, ChunkSelector::UserData).expect("reader");
    stream.append_record(b"one", NOW_MS).expect("append");
    let mut data = Vec::new();
    assert!(reader.read_chunk(&mut data).expect("read").is_none(), "an uncommitted chunk was readable");
    // Written but not synced (the batch's fdatasync not done): still not readable.
    let written = stream.write_pending(SyncDue::Now).expect("write");
    assert!(reader.read_chunk(&mut data).expect("read").is_none(), "an unsynced chunk was readable");
    for file in &written.sync_now {
        file.sync().expect("sync");
    }
    stream.commit(written.commit.expect("something to commit"));
    assert_eq!(committed.load(std::sync::atomic::Ordering::SeqCst), 1);
    let header = reader.read_chunk(&mut data).expect("read").expect("the committed chunk");
    assert_eq!((header.first_offset, header.records), (0, 1));
}

#[test]
fn the_syncer_commits_before_it_confirms() {
    let file_system = file_system();
    let (stream, _) = open(&file_system);
    let syncer = Syncer::start(SyncPolicy::Always, None);
    for offset in 0..100 {
        stream.append_record(&record(offset), NOW_MS).expect("append");
    }
    let (done, wait) = std::sync::mpsc::channel();
    let observed = stream.clone();
    syncer.sync_with_streams(
        Vec::new(),
        vec![stream.clone()],
        Some(Box::new(move |durable| {
            let _ = done.send((durable, observed.committed().next_offset));
        })),
    );
    let (durable, committed) = wait.recv_timeout(std::time::Duration::from_secs(10)).expect("the syncer answered");
    assert!(durable);
    assert_eq!(committed, 100, "confirmed before the records were committed");
    let recovered = file_system.power_cut(PowerCut::LoseUnsynced);
    let (stream, _) = open(&recovered);
    assert_eq!(read_all(&stream, OffsetSpec::First).len(), 100, "a confirmed record was lost at a power cut");
}

#[test]
fn segments_roll_and_retention_deletes_whole_old_segments() {
    let file_system = file_system();
    let retention = Retention { max_bytes: Some(3_000), max_age_ms: None };
    let (stream, _) = open_with(&file_system, StreamSettings { retention, ..small_segments(1_000) });
    for offset in 0..200 {
        stream.append_record(&record(offset), NOW_MS).expect("append");
        if offset % 10 == 9 {
            flush(&stream);
        }
    }
    let info = stream.info();
    assert!(info.segments_retired > 0, "retention deleted nothing: {info:?}");
    assert!(info.bytes <= 3_000 + 1_500, "{info:?}");
    let records = read_all(&stream, OffsetSpec::First);
    assert_eq!(records.first().map(|(offset, _)| *offset), Some(info.first_offset));
    assert_eq!(records.last().map(|(offset, _)| *offset), Some(199));
    // Whole segments only: the first offset held is a segment's first offset, and every record
    // from there on is still there.
    assert_eq!(records.len() as u64, 200 - info.first_offset);
    crate::janitor::wait_idle();
    let names = crate::file_system::FileSystem::list_directory(&file_system, &directory()).expect("list");
    assert_eq!(names.len(), 2 * info.segments, "deleted segments' files are gone: {names:?}");
    // Age: everything older than the newest segment goes.
    stream.set_settings(StreamSettings { retention: Retention { max_bytes: None, max_age_ms: Some(60_000) }, ..small_segments(1_000) });
    assert!(stream.evaluate_retention(NOW_MS + 120_000) > 0);
    assert_eq!(stream.info().segments, 1);
}

#[test]
fn tracking_survives_restarts_rolls_and_retention() {
    let file_system = file_system();
    let retention = Retention { max_bytes: Some(2_000), max_age_ms: None };
    let settings = StreamSettings { retention, ..small_segments(500) };
    let (stream, _) = open_with(&file_system, settings);
    stream.store_offset(b"consumer-a", 0, NOW_MS).expect("store");
    for round in 0..60u64 {
        let data = batch_of(&[record(round)]);
        stream.append_batch(&EntryBatch::counted(&data).expect("batch"), Some((b"publisher-1", round)), NOW_MS).expect("append");
        flush(&stream);
    }
    stream.store_offset(b"consumer-b", 42, NOW_MS).expect("store");
    flush(&stream);
    assert!(stream.info().segments_retired > 0, "the segment holding the first offsets was never deleted");
    drop(stream);
    let (stream, recovery) = open_with(&file_system.power_cut(PowerCut::LoseUnsynced), settings);
    assert!(recovery.truncated.is_empty(), "{recovery:?}");
    assert_eq!(stream.query_offset(b"consumer-b"), Some(42));
    // consumer-a's offset points below the first offset held: snapshots drop it, as osiris does.
    assert_eq!(stream.query_offset(b"consumer-a"), None);
    assert_eq!(stream.publisher_sequence(b"publisher-1"), Some(59));
}

#[test]
fn a_power_cut_keeps_every_committed_record_at_its_offset_and_reuses_only_unconfirmed_ones() {
    let mut file_system = file_system();
    let (mut stream, _) = open_with(&file_system, small_segments(2_048));
    let mut confirmed: Vec<(u64, Vec<u8>)> = Vec::new();
    for cycle in 0..6u64 {
        let first = confirmed.len() as u64;
        for step in 0..30u64 {
            let expected = first + step;
            let body = format!("cycle {cycle} step {step}").into_bytes();
            let offset = stream.append_record(&body, NOW_MS).expect("append");
            assert_eq!(offset, expected, "an offset skipped or reused");
            if step % 5 == 4 {
                flush(&stream);
                let start = confirmed.last().map_or(0, |(last, _)| last + 1);
                confirmed.extend(read_all(&stream, OffsetSpec::Offset(start)).into_iter().filter(|(offset, _)| *offset >= start));
            }
        }
        stream.append_record(b"never confirmed", NOW_MS).expect("append");
        // Written, not synced: lost at the cut.
        stream.write_pending(SyncDue::Now).expect("write");
        drop(stream);
        file_system = file_system.power_cut(PowerCut::LoseUnsynced);
        let (reopened, recovery) = open_with(&file_system, small_segments(2_048));
        stream = reopened;
        assert_eq!(read_all(&stream, OffsetSpec::First), confirmed, "cycle {cycle}: {recovery:?}");
        assert_eq!(stream.info().next_offset, confirmed.len() as u64, "the next offset is right after the last confirmed one");
    }
}

#[test]
fn a_torn_index_write_loses_only_the_unconfirmed_chunk() {
    let file_system = file_system();
    let (stream, _) = open(&file_system);
    for offset in 0..10 {
        stream.append_record(&record(offset), NOW_MS).expect("append");
    }
    flush(&stream);
    let data = batch_of(&(10..20).map(record).collect::<Vec<_>>());
    stream.append_batch(&EntryBatch::counted(&data).expect("batch"), None, NOW_MS).expect("append");
    // The segment's write, then the index's, neither synced: the index's is torn.
    stream.write_pending(SyncDue::Now).expect("write");
    drop(stream);
    let file_system = file_system.power_cut(PowerCut::TearLastWrite { bytes_kept: 30 });
    let (stream, recovery) = open(&file_system);
    assert!(recovery.truncated.is_empty(), "{recovery:?}");
    assert_eq!(read_all(&stream, OffsetSpec::First), (0..10).map(|offset| (offset, record(offset))).collect::<Vec<_>>());
    assert_eq!(stream.info().next_offset, 10);
    assert_eq!(read_index(&file_system, 0).len(), 1, "the torn entry was cut off the index");
}

#[test]
fn a_torn_segment_write_is_cut_and_reported_with_its_file_and_offset() {
    let file_system = file_system();
    let (stream, _) = open(&file_system);
    for offset in 0..10 {
        stream.append_record(&record(offset), NOW_MS).expect("append");
    }
    flush(&stream);
    let second_chunk = read_index(&file_system, 0)[0].end_position();
    let data = batch_of(&(10..20).map(record).collect::<Vec<_>>());
    stream.append_batch(&EntryBatch::counted(&data).expect("batch"), None, NOW_MS).expect("append");
    let written = stream.write_pending(SyncDue::Now).expect("write");
    // The index reached the disk; the segment's write is the last one, and torn.
    written.sync_now[1].sync().expect("sync the index");
    let segment_path = directory().join(index::segment_file_name(0));
    let chunk_bytes = file_system.contents(&segment_path).expect("contents")[second_chunk as usize..].to_vec();
    let segment = crate::file_system::FileSystem::open(&file_system, &segment_path, crate::file_system::OpenMode::ReadWrite).expect("open");
    crate::file_system::StorageFile::write_all_at(&*segment, &chunk_bytes, second_chunk).expect("write again");
    drop((stream, written, segment));
    let file_system = file_system.power_cut(PowerCut::TearLastWrite { bytes_kept: 40 });
    let (stream, recovery) = open(&file_system);
    assert_eq!(recovery.truncated.len(), 1, "{recovery:?}");
    assert_eq!(recovery.truncated[0].path, segment_path);
    assert_eq!(recovery.truncated[0].position, second_chunk);
    assert_eq!(read_all(&stream, OffsetSpec::First).len(), 10);
    assert_eq!(stream.info().next_offset, 10, "the next offset follows the last intact chunk");
    assert_eq!(read_index(&file_system, 0).len(), 1, "the index entry of the cut chunk was removed");
    // Reported once: the next start finds a clean segment.
    drop(stream);
    assert!(open(&file_system).1.truncated.is_empty());
}

#[test]
fn a_flipped_bit_in_the_newest_segment_cuts_it_at_that_chunk() {
    let file_system = file_system();
    let (stream, _) = open(&file_system);
    for round in 0..4u64 {
        for offset in round * 5..round * 5 + 5 {
            stream.append_record(&record(offset), NOW_MS).expect("append");
        }
        flush(&stream);
    }
    let third_chunk = read_index(&file_system, 0)[2];
    drop(stream);
    let segment_path = directory().join(index::segment_file_name(0));
    file_system.flip_bit_on_read(&segment_path, u64::from(third_chunk.position) + 60, 3).expect("flip");
    let (stream, recovery) = open(&file_system);
    assert_eq!(recovery.truncated.len(), 1, "{recovery:?}");
    assert_eq!(recovery.truncated[0].position, u64::from(third_chunk.position));
    assert_eq!(read_all(&stream, OffsetSpec::First).len(), 10, "the records before the damaged chunk");
}

fn read_index(file_system: &MemoryFileSystem, segment: u64) -> Vec<IndexEntry> {
    let bytes = file_system.contents(&directory().join(index::index_file_name(segment))).expect("index");
    index::parse_entries(&bytes[index::FILE_HEADER_BYTES as usize..]).0
}

/// A segment file's bytes and its index's entries after `chunks` batches of records.
fn written_segment(chunks: &[Vec<Vec<u8>>]) -> (Vec<u8>, Vec<IndexEntry>) {
    let file_system = file_system();
    let (stream, _) = open(&file_system);
    for (round, bodies) in chunks.iter().enumerate() {
        let data = batch_of(bodies);
        let publisher = (round % 2 == 0).then_some((b"publisher".as_slice(), round as u64));
        stream.append_batch(&EntryBatch::counted(&data).expect("batch"), publisher, NOW_MS + round as i64).expect("append");
    }
    flush(&stream);
    let bytes = file_system.contents(&directory().join(index::segment_file_name(0))).expect("segment");
    (bytes, read_index(&file_system, 0))
}

fn scan_bytes(bytes: &[u8], indexed: &[IndexEntry]) -> recovery::SegmentScan {
    let file_system = MemoryFileSystem::new();
    let path = Path::new("/segment");
    let file = crate::file_system::FileSystem::open(&file_system, path, crate::file_system::OpenMode::CreateReadWrite).expect("create");
    crate::file_system::StorageFile::write_all_at(&*file, bytes, 0).expect("write");
    let mut tracking = tracking::Tracking::default();
    scan_segment(&*file, 0, indexed, Some(&mut tracking)).expect("scan in memory")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Arbitrary bytes never panic the scanner.
    #[test]
    fn the_scanner_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048), prefix in any::<bool>()) {
        let mut segment = if prefix { index::SEGMENT_HEADER.to_vec() } else { Vec::new() };
        segment.extend_from_slice(&bytes);
        let _ = scan_bytes(&segment, &[]);
        let _ = index::parse_entries(&bytes);
        let _ = chunk::EntryBatch::counted(&bytes);
    }

    /// A damaged segment (bytes flipped, cut, or garbage appended) never yields a chunk that was
    /// not written: what the scan keeps is a prefix of the written chunks, byte for byte.
    #[test]
    fn the_scanner_never_claims_a_chunk_that_was_not_written(
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..6), 1..8),
        damage in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<proptest::sample::Index>()),
        garbage in proptest::collection::vec(any::<u8>(), 0..64),
        with_index in any::<bool>(),
    ) {
        let (original, indexed) = written_segment(&chunks);
        let mut damaged = original.clone();
        for (at, mask) in &damage {
            let at = at.index(damaged.len());
            damaged[at] ^= mask;
        }
        if let Some(cut) = cut {
            damaged.truncate(cut.index(damaged.len() + 1));
        }
        damaged.extend_from_slice(&garbage);
        let scan = scan_bytes(&damaged, if with_index { &indexed } else { &[] });
        prop_assert!(scan.entries.len() <= indexed.len());
        for (found, written) in scan.entries.iter().zip(&indexed) {
            prop_assert_eq!((found.chunk_id, found.records, found.position, found.chunk_bytes), (written.chunk_id, written.records, written.position, written.chunk_bytes));
            let (start, end) = (found.position as usize, found.end_position() as usize);
            prop_assert_eq!(&damaged[start..end][chunk::CHUNK_HEADER_BYTES..], &original[start..end][chunk::CHUNK_HEADER_BYTES..]);
            if with_index {
                prop_assert_eq!(found, written);
            }
        }
        if damage.is_empty() && cut.is_none() {
            prop_assert_eq!(scan.entries.len(), indexed.len(), "an intact segment lost chunks");
        }
    }
}

/// What the model test does to a stream.
#[derive(Debug, Clone)]
enum Step {
    /// An AMQP-style record of this many bytes.
    Record(usize),
    /// A protocol batch of this many records, deduplicated by a publisher (whether, and which).
    Batch { records: usize, publisher: Option<u8> },
    /// A consumer offset stored under one of a few references.
    StoreOffset { reference: u8, offset: u64 },
    /// A group commit: written, fdatasynced, committed (confirmed).
    Flush,
    /// Written but not synced (`--sync interval` between fdatasyncs): a power cut may lose it.
    WriteOnly,
    /// The power goes: unsynced writes lost, the last one maybe torn after `kept` bytes.
    PowerCut { torn: Option<usize> },
    /// The broker stops (no cut) and starts again: everything written survives.
    Restart,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1usize..300).prop_map(Step::Record),
        2 => (1usize..6, proptest::option::of(0u8..3)).prop_map(|(records, publisher)| Step::Batch { records, publisher }),
        1 => (0u8..3, 0u64..500).prop_map(|(reference, offset)| Step::StoreOffset { reference, offset }),
        3 => Just(Step::Flush),
        1 => Just(Step::WriteOnly),
        1 => proptest::option::of(0usize..400).prop_map(|torn| Step::PowerCut { torn }),
        1 => Just(Step::Restart),
    ]
}

/// What the model knows: every user record appended with the offset it got, which of them are
/// confirmed, and the tracking values stored (confirmed or not) in order.
#[derive(Debug, Default)]
struct StreamModel {
    records: Vec<(u64, Vec<u8>)>,
    confirmed: usize,
    offsets: Vec<(u8, u64, bool)>,
    sequences: Vec<(u8, u64, bool)>,
}

impl StreamModel {
    fn confirm(&mut self) {
        self.confirmed = self.records.len();
        self.offsets.iter_mut().for_each(|entry| entry.2 = true);
        self.sequences.iter_mut().for_each(|entry| entry.2 = true);
    }

    /// Checks a recovered stream: the confirmed records, then a prefix of the unconfirmed ones,
    /// each at the offset it was given, nothing else; tracking at its last confirmed value or a
    /// later one. Forgets what the crash lost.
    fn check_recovered(&mut self, stream: &Arc<Stream>) -> Result<(), TestCaseError> {
        let recovered = read_all(stream, OffsetSpec::First);
        prop_assert!(recovered.len() >= self.confirmed, "confirmed records lost: {} of {}", recovered.len(), self.confirmed);
        prop_assert_eq!(&recovered[..], &self.records[..recovered.len()], "a record recovered that was not appended, or not at its offset");
        self.records.truncate(recovered.len());
        self.confirmed = recovered.len();
        for (label, values, found) in [
            ("offset", &mut self.offsets, &(|reference: u8| stream.query_offset(&[b'c', reference])) as &dyn Fn(u8) -> Option<u64>),
            ("sequence", &mut self.sequences, &|reference: u8| stream.publisher_sequence(&[b'p', reference])),
        ] {
            for reference in 0..3u8 {
                let stored: Vec<(u64, bool)> = values.iter().filter(|entry| entry.0 == reference).map(|entry| (entry.1, entry.2)).collect();
                let last_confirmed = stored.iter().rposition(|entry| entry.1);
                let allowed: Vec<Option<u64>> = match last_confirmed {
                    Some(at) => stored[at..].iter().map(|entry| Some(entry.0)).collect(),
                    None => std::iter::once(None).chain(stored.iter().map(|entry| Some(entry.0))).collect(),
                };
                let value = found(reference);
                prop_assert!(allowed.contains(&value), "{} of reference {}: {:?}, allowed {:?}", label, reference, value, allowed);
                // From now on the recovered value is the confirmed one.
                values.retain(|entry| entry.0 != reference);
                if let Some(value) = value {
                    values.push((reference, value, true));
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The store against a model through any mix of records, batches with publisher sequences,
    /// stored offsets, group commits, writes without a sync, power cuts (with or without a torn
    /// last write) and clean restarts, with segments small enough to roll: after every start
    /// every confirmed record is read back at its offset, what else comes back is a prefix of
    /// what was appended (never an invented record, never a record at another offset), offsets
    /// continue right after what was recovered, and tracking holds its last confirmed value or
    /// a later one.
    #[test]
    fn the_store_matches_the_model_through_power_cuts(steps in proptest::collection::vec(step(), 1..80), segment_bytes in 300u64..3000) {
        let settings = small_segments(segment_bytes);
        let mut file_system = file_system();
        let (mut stream, _) = open_with(&file_system, settings);
        let mut model = StreamModel::default();
        for (index, step) in steps.into_iter().enumerate() {
            match step {
                Step::Record(bytes) => {
                    let body = vec![(index % 251) as u8; bytes];
                    let offset = stream.append_record(&body, NOW_MS + index as i64).expect("append");
                    model.records.push((offset, body));
                }
                Step::Batch { records, publisher } => {
                    let bodies: Vec<Vec<u8>> = (0..records).map(|record| format!("batch {index} record {record}").into_bytes()).collect();
                    let data = batch_of(&bodies);
                    let batch = EntryBatch::counted(&data).expect("batch");
                    let reference = publisher.map(|publisher| [b'p', publisher]);
                    let first = stream.append_batch(&batch, reference.as_ref().map(|reference| (&reference[..], index as u64)), NOW_MS).expect("append");
                    model.records.extend(bodies.into_iter().enumerate().map(|(at, body)| (first + at as u64, body)));
                    if let Some(publisher) = publisher {
                        model.sequences.push((publisher, index as u64, false));
                    }
                }
                Step::StoreOffset { reference, offset } => {
                    stream.store_offset(&[b'c', reference], offset, NOW_MS).expect("store");
                    model.offsets.push((reference, offset, false));
                }
                Step::Flush => {
                    flush(&stream);
                    model.confirm();
                }
                Step::WriteOnly => {
                    // As a group commit of `--sync interval` between fdatasyncs: written (and
                    // readable), synced by the next batch that syncs, lost if the power goes first.
                    stream.write_pending(SyncDue::Later).expect("write");
                }
                Step::PowerCut { torn } => {
                    drop(stream);
                    let cut = match torn {
                        Some(bytes_kept) => PowerCut::TearLastWrite { bytes_kept },
                        None => PowerCut::LoseUnsynced,
                    };
                    file_system = file_system.power_cut(cut);
                    let (reopened, _) = open_with(&file_system, settings);
                    stream = reopened;
                    model.check_recovered(&stream)?;
                }
                Step::Restart => {
                    // A clean stop: what was appended is written and synced, as at a shutdown.
                    flush(&stream);
                    model.confirm();
                    drop(stream);
                    let (reopened, recovery) = open_with(&file_system, settings);
                    prop_assert!(recovery.truncated.is_empty(), "a clean restart cut a segment: {:?}", recovery);
                    stream = reopened;
                    model.check_recovered(&stream)?;
                }
            }
        }
    }
}
