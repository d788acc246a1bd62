//! A start that trusts summaries does not read sealed segments; the page-in that reads them
//! checks every record and quarantines what fails (see [`crate::quarantine`]).

use crate::janitor;
use crate::queue_log::tests::indexed_log;
use crate::queue_log::{QueueLog, SyncDue};
use crate::record::{RecordHeader, RECORD_HEADER_BYTES, SEGMENT_HEADER_RECORD_BYTES};
use crate::segment_index::INDEX_FILE_NAME;
use crate::StorageError;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The segment size of [`indexed_log`]'s logs.
const SEGMENT_BYTES: u64 = 2048;

/// A log of a dozen summarised segments: its directory and live positions.
fn summarised_log(name: &str) -> (PathBuf, Vec<u64>) {
    indexed_log(&format!("quarantine-{name}"), 12)
}

fn segments(directory: &Path) -> Vec<PathBuf> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(directory)
        .expect("list")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "seg"))
        .collect();
    names.sort();
    names
}

/// The offsets and positions of a segment's publish records.
fn publishes(path: &Path) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(path).expect("read");
    let mut offset = SEGMENT_HEADER_RECORD_BYTES as usize;
    let mut found = Vec::new();
    while let Some(header) = bytes.get(offset..offset + RECORD_HEADER_BYTES).and_then(RecordHeader::decode) {
        if header.length == 0 {
            break;
        }
        if crate::record::is_persistent_publish(header.kind) {
            found.push((offset as u64, header.position));
        }
        offset += header.record_bytes() as usize;
    }
    found
}

fn flip_byte(path: &Path, offset: u64) {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).expect("open");
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, offset).expect("read");
    file.write_all_at(&[byte[0] ^ 0x5a], offset).expect("write");
}

fn read_all(log: &mut QueueLog, cursor: &mut crate::queue_log::TailCursor) -> Result<Vec<u64>, StorageError> {
    let mut got = Vec::new();
    loop {
        let batch = log.read_tail(cursor, 7, usize::MAX)?;
        if batch.is_empty() {
            return Ok(got);
        }
        got.extend(batch.into_iter().map(|(position, _)| position));
    }
}

#[test]
fn a_damaged_summarised_segment_is_not_read_at_start_and_its_bad_records_are_quarantined_at_page_in() {
    let (directory, live) = summarised_log("flip");
    let files = segments(&directory);
    assert!(files.len() >= 10, "{} segments", files.len());
    assert!(std::fs::metadata(directory.join(INDEX_FILE_NAME)).is_ok_and(|meta| meta.len() > 0), "no index");
    // A flipped body byte in one record of segment 3 (the next record still checks: only that
    // record is lost) and a flipped length in segment 6 (the length leads nowhere: reading
    // resumes at the next record that checks, so only that record is lost too).
    let in_three = publishes(&files[3]);
    let (body_offset, body_position) = *in_three.iter().find(|(_, position)| position % 5 != 0).expect("a live publish");
    let next_offset = in_three.iter().find(|(offset, _)| *offset > body_offset).expect("a later publish").0;
    flip_byte(&files[3], next_offset - 1);
    let in_six = publishes(&files[6]);
    // A live publish with another after it in the segment.
    let victim = (1..in_six.len() - 1).find(|index| !in_six[*index].1.is_multiple_of(5)).expect("a live publish");
    let (length_offset, length_position) = in_six[victim];
    flip_byte(&files[6], length_offset + 1);
    let after_length_position = in_six[victim + 1].1;

    let (mut log, recovery) = QueueLog::open(&directory, SEGMENT_BYTES).expect("reopen");
    assert!(recovery.truncated.is_empty() && recovery.unsealed.is_empty(), "a start that read the damage: {recovery:?}");
    assert_eq!(recovery.live_count, live.len() as u64, "the summaries count every live message");

    // A cursor that does not quarantine fails, as before.
    let mut plain = log.recovered_tail(&recovery);
    assert!(matches!(read_all(&mut log, &mut plain), Err(StorageError::Corrupt { .. })));

    let mut cursor = log.recovered_tail(&recovery).quarantining();
    let got = read_all(&mut log, &mut cursor).expect("a quarantining read steps over damage");
    let lost_in_six: Vec<u64> = live.iter().copied().filter(|p| (length_position..after_length_position).contains(p)).collect();
    assert_eq!(lost_in_six, vec![length_position], "the record whose length was hit is live");
    let expected: Vec<u64> = live.iter().copied().filter(|p| *p != body_position && !lost_in_six.contains(p)).collect();
    assert_eq!(got, expected, "every intact record served, in order");
    let quarantined = cursor.take_quarantined();
    assert_eq!(quarantined.len(), 2, "{quarantined:?}");
    assert_eq!((quarantined[0].path.clone(), quarantined[0].offsets.clone()), (files[3].clone(), body_offset..next_offset));
    assert_eq!(quarantined[0].positions.ranges().collect::<Vec<_>>(), vec![(body_position, body_position + 1)]);
    assert!(quarantined[0].exact);
    assert_eq!((quarantined[1].path.clone(), quarantined[1].offsets.start), (files[6].clone(), length_offset));
    let lost: Vec<u64> = quarantined[1].positions.ranges().flat_map(|(start, end)| start..end).collect();
    assert_eq!(lost, lost_in_six);
    assert_eq!(recovery.live_count - quarantined.iter().map(|bad| bad.count()).sum::<u64>(), got.len() as u64, "counts consistent");

    // Set aside and settled (the queue's part): the copy is left alone by the next start, which
    // counts exactly what was served.
    for bad in &quarantined {
        let copy = bad.set_aside_and_report(&*log.file_system(), "q").expect("copied aside");
        assert_eq!(std::fs::metadata(&copy).expect("copy").len(), bad.offsets.end - bad.offsets.start);
        for (start, end) in bad.positions.ranges() {
            (start..end).for_each(|position| log.append_settled(position));
        }
    }
    log.write_pending(SyncDue::Now).expect("write");
    drop(log);
    janitor::wait_idle();
    let (mut log, recovery) = QueueLog::open(&directory, SEGMENT_BYTES).expect("reopen after the quarantine");
    assert_eq!(recovery.live_count, expected.len() as u64);
    let mut cursor = log.recovered_tail(&recovery).quarantining();
    assert_eq!(read_all(&mut log, &mut cursor).expect("read again"), expected);
    assert!(cursor.take_quarantined().iter().all(|bad| bad.count() == 0), "nothing more is lost");
    let _ = std::fs::remove_dir_all(directory.parent().expect("parent"));
}

#[test]
fn a_cut_summarised_segment_is_still_found_at_start() {
    let (directory, _) = summarised_log("cut");
    let files = segments(&directory);
    let length = std::fs::metadata(&files[4]).expect("meta").len();
    std::fs::OpenOptions::new().write(true).open(&files[4]).expect("open").set_len(length / 2).expect("cut");
    let (_, recovery) = QueueLog::open(&directory, SEGMENT_BYTES).expect("reopen");
    assert_eq!(recovery.truncated.iter().map(|(path, _)| path.clone()).collect::<Vec<_>>(), vec![files[4].clone()]);
    let _ = std::fs::remove_dir_all(directory.parent().expect("parent"));
}
