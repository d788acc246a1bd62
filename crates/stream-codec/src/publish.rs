//! The messages of a publish frame: each a publishing id and a data entry. Decoding checks the
//! whole list once and keeps it as one shared slice of the frame; iterating it then allocates
//! nothing, and each entry's bytes go into a chunk as they came.

use crate::entry::{put_simple_entry, DataEntry};
use crate::frame::{begin_frame, end_frame};
use crate::wire::Reader;
use crate::{key, DecodeError, VERSION_1};
use bytes::{BufMut, Bytes, BytesMut};

/// One published message (or sub-batch) with the id its publisher gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedEntry {
    /// The publisher's sequence number, echoed in the confirm and used for deduplication.
    pub publishing_id: u64,
    /// The entry as a chunk stores it.
    pub entry: DataEntry,
}

/// The messages of one publish frame, checked when decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedMessages {
    /// The count the frame announced. RabbitMQ takes it for its credit and counters without
    /// checking it against the entries, so it is kept as sent.
    pub message_count: u32,
    entries: Bytes,
}

impl PublishedMessages {
    /// Reads the count and the entries to the end of the frame, checking every entry.
    pub(crate) fn read(reader: &mut Reader) -> Result<PublishedMessages, DecodeError> {
        let message_count = reader.u32()?;
        let entries = reader.rest();
        let mut check = Reader::new(entries.clone());
        while check.remaining() > 0 {
            check.u64()?;
            DataEntry::read(&mut check)?;
        }
        Ok(PublishedMessages { message_count, entries })
    }

    /// Messages from entries (for tests and clients that build them one by one).
    pub fn from_entries(entries: &[PublishedEntry]) -> PublishedMessages {
        let mut bytes = BytesMut::new();
        for published in entries {
            bytes.put_u64(published.publishing_id);
            bytes.put_slice(published.entry.raw());
        }
        PublishedMessages { message_count: entries.len() as u32, entries: bytes.freeze() }
    }

    /// The entries, in order.
    pub fn iter(&self) -> PublishedEntries {
        PublishedEntries { reader: Reader::new(self.entries.clone()) }
    }

    /// The entries' bytes (publishing id and entry, one after the other).
    pub fn raw(&self) -> &Bytes {
        &self.entries
    }

    pub(crate) fn write(&self, writer: &mut BytesMut) {
        writer.put_u32(self.message_count);
        writer.put_slice(&self.entries);
    }
}

/// The entries of a [`PublishedMessages`].
pub struct PublishedEntries {
    reader: Reader,
}

impl Iterator for PublishedEntries {
    type Item = PublishedEntry;

    fn next(&mut self) -> Option<PublishedEntry> {
        // Every entry was checked when the frame was decoded, so the reads cannot fail here;
        // should they, the iteration ends rather than panics.
        let publishing_id = self.reader.u64().ok()?;
        let entry = DataEntry::read(&mut self.reader).ok()?;
        Some(PublishedEntry { publishing_id, entry })
    }
}

/// Writes a publish frame in place, message by message, without building the list first: the
/// perf client's hot path.
pub struct PublishFrame {
    size_at: usize,
    count_at: usize,
    message_count: u32,
}

impl PublishFrame {
    /// Starts a publish frame for `publisher_id` at the end of `writer`.
    pub fn begin(writer: &mut BytesMut, publisher_id: u8) -> PublishFrame {
        let size_at = begin_frame(writer, key::PUBLISH, VERSION_1);
        writer.put_u8(publisher_id);
        let count_at = writer.len();
        writer.put_u32(0);
        PublishFrame { size_at, count_at, message_count: 0 }
    }

    /// Appends one message as a simple entry.
    pub fn push(&mut self, writer: &mut BytesMut, publishing_id: u64, body: &[u8]) {
        writer.put_u64(publishing_id);
        put_simple_entry(writer, body);
        self.message_count += 1;
    }

    /// Messages pushed so far.
    pub fn message_count(&self) -> u32 {
        self.message_count
    }

    /// Writes the count and the frame size.
    pub fn finish(self, writer: &mut BytesMut) {
        writer[self.count_at..self.count_at + 4].copy_from_slice(&self.message_count.to_be_bytes());
        end_frame(writer, self.size_at);
    }
}
