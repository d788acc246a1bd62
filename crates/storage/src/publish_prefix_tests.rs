//! A publish record keeps the expiry its queue fixed at enqueue, so a page-in or a restart reads
//! the message back with its time to live counted from its publish, and the message's BCC keys,
//! so its dead letter is routed by them; records of segment format 2, which kept neither, are
//! still read, their expiry reported unrecorded.

use crate::queue_log::tests::{message, temporary_dir};
use crate::queue_log::{QueueLog, SyncDue, SEGMENT_FORMAT_VERSION_OLDEST_READ};
use crate::record::{self, RecordedExpiry, SegmentIdentity, CURRENT_TERM, LENGTH_AND_CHECKSUM_BYTES, RECORD_HEADER_BYTES};
use bytes::{BufMut, BytesMut};
use std::path::Path;

const SEGMENT_BYTES_MAX: u64 = 1 << 20;

/// What a start reads back of the log in `directory`: (position, body, expiry).
fn recovered_with_expiries(directory: &Path) -> Vec<(u64, Vec<u8>, RecordedExpiry)> {
    let (mut log, recovery) = QueueLog::open(directory, SEGMENT_BYTES_MAX).expect("open");
    let mut cursor = log.recovered_tail(&recovery);
    let plan = log.plan_tail_read(&cursor).expect("plan");
    let read = plan.read_with_expiries(&mut cursor, usize::MAX, usize::MAX).expect("read");
    read.into_iter().map(|(position, message, expiry)| (position, message.body.to_vec(), expiry)).collect()
}

#[test]
fn a_publish_keeps_its_expiry_through_a_page_in_and_a_restart() {
    let directory = temporary_dir("expiry-kept").join("q");
    let (mut log, _) = QueueLog::open(&directory, SEGMENT_BYTES_MAX).expect("open");
    let first = log.append_publish(0, &message("expiring"), true, Some(1_700_000_123_456));
    log.append_publish(1, &message("forever"), true, None);
    log.append_publish(2, &message("transient"), false, Some(5));
    log.write_pending(SyncDue::Now).expect("write");
    // A page-in while the broker runs reads the transient one too.
    let mut cursor = crate::queue_log::TailCursor::new(first, 0);
    let paged = log.plan_tail_read(&cursor).expect("plan").read_with_expiries(&mut cursor, usize::MAX, usize::MAX).expect("read");
    let expiries: Vec<(u64, RecordedExpiry)> = paged.into_iter().map(|(position, _, expiry)| (position, expiry)).collect();
    assert_eq!(expiries, [(0, RecordedExpiry::AtMs(1_700_000_123_456)), (1, RecordedExpiry::Never), (2, RecordedExpiry::AtMs(5))]);
    drop(log);
    assert_eq!(
        recovered_with_expiries(&directory),
        [(0, b"expiring".to_vec(), RecordedExpiry::AtMs(1_700_000_123_456)), (1, b"forever".to_vec(), RecordedExpiry::Never)]
    );
}

/// Rewrites the only segment of `directory` as segment format 2 wrote it: a version 2 header and
/// publish records without flags, for `bodies` at positions 0, 1, ...
fn rewrite_as_format_2(directory: &Path, segment_path: &Path, bodies: &[&str]) {
    let header = std::fs::read(segment_path).expect("read");
    let (_, nonce) = record::decode_segment_header(&header[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + 9]).expect("a segment header");
    let identity = SegmentIdentity { first_position: 0, nonce };
    let mut file = BytesMut::new();
    record::encode(&mut file, record::HEADER_SEED, record::KIND_SEGMENT_HEADER, CURRENT_TERM, 0, |buffer| {
        buffer.put_u8(SEGMENT_FORMAT_VERSION_OLDEST_READ);
        buffer.put_u64(nonce);
    });
    for (position, body) in bodies.iter().enumerate() {
        let message = message(body);
        record::encode(&mut file, identity.seed(), record::KIND_PUBLISH, CURRENT_TERM, position as u64, |buffer| {
            crate::queue_log::put_message(buffer, &message)
        });
    }
    file.put_bytes(0, LENGTH_AND_CHECKSUM_BYTES);
    std::fs::write(segment_path, &file).expect("write");
    // The segment index would let the start trust a summary of the file as it was.
    let _ = std::fs::remove_file(directory.join(crate::segment_index::INDEX_FILE_NAME));
}

#[test]
fn a_segment_of_format_2_is_read_with_its_expiries_unrecorded() {
    let directory = temporary_dir("expiry-format-2").join("q");
    let (mut log, _) = QueueLog::open(&directory, SEGMENT_BYTES_MAX).expect("open");
    let location = log.append_publish(0, &message("old"), true, Some(5));
    log.write_pending(SyncDue::Now).expect("write");
    drop(log);
    let segment = std::fs::read_dir(&directory)
        .expect("list")
        .map(|entry| entry.expect("entry").path())
        .find(|path| path.extension().is_some_and(|extension| extension == "seg"))
        .expect("a segment");
    assert_eq!(location.segment, 0);
    rewrite_as_format_2(&directory, &segment, &["old", "older"]);
    assert_eq!(
        recovered_with_expiries(&directory),
        [(0, b"old".to_vec(), RecordedExpiry::Unrecorded), (1, b"older".to_vec(), RecordedExpiry::Unrecorded)]
    );
    // A start of this build appends format 3 records after them, and reads both kinds.
    let (mut log, recovery) = QueueLog::open(&directory, SEGMENT_BYTES_MAX).expect("reopen");
    assert_eq!(recovery.next_position, 2);
    log.append_publish(2, &message("new"), true, Some(9));
    log.write_pending(SyncDue::Now).expect("write");
    drop(log);
    let expiries: Vec<RecordedExpiry> = recovered_with_expiries(&directory).into_iter().map(|(_, _, expiry)| expiry).collect();
    assert_eq!(expiries, [RecordedExpiry::Unrecorded, RecordedExpiry::Unrecorded, RecordedExpiry::AtMs(9)]);
}

#[test]
fn flags_that_do_not_parse_are_not_a_message() {
    assert_eq!(record::split_publish(record::KIND_PUBLISH_FLAGGED, bytes::Bytes::from_static(&[2, 0])), None);
    assert_eq!(record::split_publish(record::KIND_PUBLISH_FLAGGED, bytes::Bytes::from_static(&[1, 0, 0])), None);
    assert_eq!(record::split_publish(record::KIND_PUBLISH_FLAGGED, bytes::Bytes::new()), None);
    // BCC keys announced, one key's length past the end.
    assert_eq!(record::split_publish(record::KIND_PUBLISH_FLAGGED, bytes::Bytes::from_static(&[2, 0, 1, 5, b'a'])), None);
}

#[test]
fn a_publish_keeps_its_bcc_keys_through_a_restart() {
    let directory = temporary_dir("bcc-kept").join("q");
    let (mut log, _) = QueueLog::open(&directory, SEGMENT_BYTES_MAX).expect("open");
    let keys: std::sync::Arc<[amqp_codec::ShortStr]> = vec![amqp_codec::ShortStr::from("blind"), amqp_codec::ShortStr::from("")].into();
    let blind = broker_core::Message { bcc_routing_keys: Some(keys.clone()), ..message("blind") };
    log.append_publish(0, &blind, true, Some(77));
    log.append_publish(1, &message("plain"), true, None);
    log.write_pending(SyncDue::Now).expect("write");
    drop(log);
    let (mut log, recovery) = QueueLog::open(&directory, SEGMENT_BYTES_MAX).expect("reopen");
    let mut cursor = log.recovered_tail(&recovery);
    let read = log.read_tail(&mut cursor, usize::MAX, usize::MAX).expect("read");
    assert_eq!(read[0].1.bcc_routing_keys.as_deref(), Some(&keys[..]));
    assert_eq!(read[0].1, blind, "the whole message back, its keys too");
    assert_eq!(read[1].1.bcc_routing_keys, None);
    let mut cursor = log.recovered_tail(&recovery);
    let plan = log.plan_tail_read(&cursor).expect("plan");
    let expiries: Vec<RecordedExpiry> =
        plan.read_with_expiries(&mut cursor, usize::MAX, usize::MAX).expect("read").into_iter().map(|(_, _, expiry)| expiry).collect();
    assert_eq!(expiries, [RecordedExpiry::AtMs(77), RecordedExpiry::Never]);
}
