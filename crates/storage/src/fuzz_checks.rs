//! The properties the fuzz targets (`fuzz/fuzz_targets/*_scan.rs`) and the property tests below
//! check on the readers of what is on disk: arbitrary bytes never panic them, and damage to what
//! was written never makes them return a record that was not written (they end at the damage).
//! Each function takes the fuzzer's bytes and panics only when the property breaks.

use crate::definitions_log;
use crate::definitions_state::DefinitionChange;
use crate::file_cache::FileCache;
use crate::file_system::{FileSystem, OpenMode};
use crate::journal::Journal;
use crate::memory_file_system::MemoryFileSystem;
use crate::queue_log::{QueueLog, SyncDue};
use amqp_codec::{BasicProperties, ContentHeader, ShortStr};
use broker_core::Message;
use bytes::Bytes;
use std::path::Path;

/// The most records a structured check writes before damaging them.
const RECORDS_MAX: u8 = 24;
/// Segment size of the checked logs: small, so a few records span several segments.
const SEGMENT_BYTES: u64 = 1024;

fn message(position: u64) -> Message {
    let body = Bytes::from(format!("message {position} {}", "x".repeat((position % 40) as usize)));
    let properties = BasicProperties { delivery_mode: Some(2), ..Default::default() };
    Message {
        exchange: ShortStr::from("x"),
        routing_key: ShortStr::from("k"),
        header: ContentHeader::from_properties(60, body.len() as u64, &properties),
        body,
        published_at_ns: 0,
        bcc_routing_keys: None,
    }
}

/// Applies the fuzzer's damage to the files of `directory` whose names end in `suffix`: the
/// input, three bytes at a time, names a file, an offset and a byte to XOR there (zero:
/// truncate the file at that offset).
fn damage(file_system: &MemoryFileSystem, directory: &Path, suffix: &str, input: &[u8]) {
    let mut files: Vec<String> = file_system.list_directory(directory).unwrap_or_default();
    files.retain(|name| name.ends_with(suffix));
    if files.is_empty() {
        return;
    }
    for chunk in input.chunks_exact(3) {
        let path = directory.join(&files[usize::from(chunk[0]) % files.len()]);
        let Ok(file) = file_system.open(&path, OpenMode::ReadWrite) else { continue };
        let length = file.len().unwrap_or(0);
        if length == 0 {
            continue;
        }
        let offset = (u64::from(chunk[1]) * 17 + u64::from(chunk[2])) % length;
        if chunk[2] == 0 {
            let _ = file.set_len(offset);
            continue;
        }
        let mut byte = [0u8];
        if file.read_at(&mut byte, offset).is_ok() {
            let _ = file.write_all_at(&[byte[0] ^ chunk[2]], offset);
        }
    }
}

/// Arbitrary bytes as a segment file: recovery never panics.
pub fn segment_bytes(input: &[u8]) {
    let file_system = MemoryFileSystem::new();
    let directory = Path::new("/q");
    file_system.create_durable_directory(directory);
    if let Ok(file) = file_system.open(&directory.join(format!("{:020}.seg", 0)), OpenMode::CreateReadWrite) {
        let _ = file.write_all_at(input, 0);
    }
    let cache = FileCache::with_file_system(4, file_system.shared());
    if let Ok((mut log, recovery)) = QueueLog::open_with_cache(directory, SEGMENT_BYTES, cache) {
        let mut cursor = log.recovered_tail(&recovery);
        let _ = log.read_tail(&mut cursor, usize::MAX, usize::MAX);
    }
}

/// A log of a few messages, damaged as the input says: recovery never panics and every message
/// it returns is, byte for byte, the one written at that position.
pub fn segment_damage(input: &[u8]) {
    let Some((&count, damage_input)) = input.split_first() else { return };
    let count = u64::from(count % RECORDS_MAX) + 1;
    let file_system = MemoryFileSystem::new();
    let directory = Path::new("/q");
    file_system.create_durable_directory(directory);
    let cache = FileCache::with_file_system(4, file_system.shared());
    {
        let (mut log, _) = QueueLog::open_with_cache(directory, SEGMENT_BYTES, cache.clone()).expect("open an empty log in memory");
        for position in 0..count {
            log.append_publish(position, &message(position), true, None);
        }
        let written = log.write_pending(SyncDue::Now).expect("write in memory");
        written.sync_now.iter().for_each(|file| file.sync().expect("sync in memory"));
    }
    damage(&file_system, directory, ".seg", damage_input);
    let Ok((mut log, recovery)) = QueueLog::open_with_cache(directory, SEGMENT_BYTES, cache) else { return };
    let mut cursor = log.recovered_tail(&recovery);
    let Ok(recovered) = log.read_tail(&mut cursor, usize::MAX, usize::MAX) else { return };
    for (position, recovered_message) in recovered {
        assert!(position < count, "recovered position {position}, never written");
        let written = message(position);
        assert_eq!(recovered_message.body, written.body, "position {position} came back with another body");
        assert_eq!(recovered_message.header.properties_raw, written.header.properties_raw, "position {position}: other properties");
    }
}

/// Arbitrary bytes as a journal file: opening (reading its entries) never panics.
pub fn journal_bytes(input: &[u8]) {
    let file_system = MemoryFileSystem::new();
    let directory = Path::new("/journal");
    file_system.create_durable_directory(directory);
    if let Ok(file) = file_system.open(&directory.join(format!("{:020}.wal", 1)), OpenMode::CreateReadWrite) {
        let _ = file.write_all_at(input, 0);
    }
    let _ = Journal::open_in(file_system.shared(), directory);
}

/// A journal of a few entries, damaged as the input says: every entry read back was written,
/// in order (a prefix of what was written, from each file).
pub fn journal_damage(input: &[u8]) {
    let Some((&count, damage_input)) = input.split_first() else { return };
    let count = usize::from(count % RECORDS_MAX) + 1;
    let file_system = MemoryFileSystem::new();
    let directory = Path::new("/journal");
    file_system.create_durable_directory(directory);
    let entries: Vec<(String, u64, Vec<u8>)> = (0..count)
        .map(|index| (format!("q{}/{:020}.seg", index % 3, index), index as u64 * 100, vec![index as u8; index * 7 + 1]))
        .collect();
    {
        let (mut journal, _) = Journal::open_in(file_system.shared(), directory).expect("open a journal in memory");
        for (batch, chunk) in entries.chunks(4).enumerate() {
            chunk.iter().for_each(|(target, offset, payload)| journal.append(target, *offset, payload));
            journal.write_and_sync().expect("write in memory");
            if batch == 2 {
                journal.rotate().expect("rotate in memory");
            }
        }
    }
    damage(&file_system, directory, ".wal", damage_input);
    let Ok((_, read)) = Journal::open_in(file_system.shared(), directory) else { return };
    for entry in read {
        let written =
            entries.iter().any(|(target, offset, payload)| *target == entry.target && *offset == entry.offset && *payload == entry.payload);
        assert!(written, "the journal returned an entry never written: {} at {}", entry.target, entry.offset);
    }
}

/// Arbitrary bytes as a definitions change log: its header and records are read without a
/// panic; with the header of the generation the input names, damage ends replay.
pub fn definitions_log_bytes(input: &[u8]) {
    let path = Path::new("/data/definitions.log");
    let generation = definitions_log::decode_header(input).unwrap_or(1);
    let _ = definitions_log::read_records(path, input, generation);
}

/// A definitions change log of a few records, damaged as the input says: replay returns a
/// prefix of the records written, never another change.
pub fn definitions_log_damage(input: &[u8]) {
    let Some((&count, damage_input)) = input.split_first() else { return };
    let count = usize::from(count % RECORDS_MAX) + 1;
    let generation = 7;
    let changes: Vec<DefinitionChange> =
        (0..count).map(|index| DefinitionChange::DeleteExchange { vhost: "/".to_string(), name: format!("exchange-{index}") }).collect();
    let mut bytes = definitions_log::encode_header(generation);
    changes.iter().for_each(|change| definitions_log::encode_record(&mut bytes, generation, change));
    for chunk in damage_input.chunks_exact(3) {
        let offset = (usize::from(chunk[0]) * 256 + usize::from(chunk[1])) % bytes.len();
        match chunk[2] {
            0 => bytes.truncate(offset),
            mask => bytes[offset] ^= mask,
        }
        if bytes.is_empty() {
            return;
        }
    }
    let Ok(replayed) = definitions_log::read_records(Path::new("/data/definitions.log"), &bytes, generation) else { return };
    assert!(replayed.changes.len() <= changes.len(), "more changes replayed than written");
    for (index, change) in replayed.changes.iter().enumerate() {
        assert_eq!(*change, changes[index], "change {index} replayed as another");
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        #[test]
        fn segment_readers_never_panic_nor_invent(input in proptest::collection::vec(any::<u8>(), 0..600)) {
            super::segment_bytes(&input);
            super::segment_damage(&input);
        }

        #[test]
        fn journal_readers_never_panic_nor_invent(input in proptest::collection::vec(any::<u8>(), 0..600)) {
            super::journal_bytes(&input);
            super::journal_damage(&input);
        }

        #[test]
        fn definitions_log_readers_never_panic_nor_invent(input in proptest::collection::vec(any::<u8>(), 0..600)) {
            super::definitions_log_bytes(&input);
            super::definitions_log_damage(&input);
        }
    }
}
