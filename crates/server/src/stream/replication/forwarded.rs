//! The leader's side of publishes and stored offsets another member forwarded: they are
//! appended here as if a client of this node had sent them, and a publish is answered once the
//! cluster committed it (or at once, not taken, when this node does not lead).

use super::wire::{Forwarded, ForwardedEntries, Outcome, StoredOffset};
use super::{CommitWaiter, ReplicaMessage, StreamReplication};
use std::sync::Arc;
use storage::stream::chunk::EntryBatch;
use storage::stream::now_ms;

impl StreamReplication {
    /// AMQP records forwarded by member `from`, one after the other.
    pub(super) fn append_forwarded_records(self: &Arc<Self>, from: u64, forwarded: Forwarded) {
        let answer = self.forwarded_answer(from, forwarded.request);
        let Some(epoch) = self.leading_epoch() else { return answer(false) };
        let mut next_offset = None;
        for record in &forwarded.records {
            match self.stream.append_record(record, now_ms()) {
                Ok(offset) => next_offset = Some(offset + 1),
                Err(error) => {
                    tracing::warn!(stream = %self.key.name, %error, "a forwarded publish could not be appended");
                    next_offset = None;
                    break;
                }
            }
        }
        let Some(next_offset) = next_offset else { return answer(false) };
        self.request_sync();
        self.when_committed(next_offset, epoch, CommitWaiter::Callback(Box::new(answer)));
    }

    /// A stream-protocol publish forwarded by member `from`: deduplicated by its reference
    /// against this leader's tracking (an entry whose id is not above the last one stored is
    /// dropped and confirmed, as osiris drops it), then appended as one chunk.
    pub(super) fn append_forwarded_entries(self: &Arc<Self>, from: u64, forwarded: ForwardedEntries) {
        let ForwardedEntries { request, reference, entries, data } = forwarded;
        let answer = self.forwarded_answer(from, request);
        let Some(epoch) = self.leading_epoch() else { return answer(false) };
        let mut last_id = reference.as_ref().and_then(|reference| self.stream.publisher_sequence(reference)).unwrap_or(0);
        let mut kept = Vec::with_capacity(data.len());
        let (mut kept_entries, mut kept_records, mut start) = (0usize, 0u64, 0usize);
        for entry in &entries {
            // The decoder checked that the lengths add up to the data's.
            let end = start + entry.length as usize;
            let bytes = &data[start..end];
            start = end;
            if reference.is_some() && entry.publishing_id <= last_id {
                continue;
            }
            last_id = last_id.max(entry.publishing_id);
            kept.extend_from_slice(bytes);
            kept_entries += 1;
            kept_records += u64::from(entry.records);
        }
        if kept_entries == 0 {
            return answer(true);
        }
        let (Ok(entries_count), Ok(records_count)) = (u16::try_from(kept_entries), u32::try_from(kept_records)) else {
            tracing::warn!(stream = %self.key.name, "a forwarded publish holds more entries than one chunk");
            return answer(false);
        };
        let batch = EntryBatch { data: &kept, entries: entries_count, records: records_count };
        let tracked = reference.as_ref().map(|reference| (reference.as_ref(), last_id));
        match self.stream.append_batch(&batch, tracked, now_ms()) {
            Ok(first_offset) => {
                self.request_sync();
                self.when_committed(first_offset + kept_records, epoch, CommitWaiter::Callback(Box::new(answer)));
            }
            Err(error) => {
                tracing::warn!(stream = %self.key.name, %error, "a forwarded publish could not be appended");
                answer(false);
            }
        }
    }

    /// A consumer's offset stored through another member: written here if this node leads
    /// (otherwise dropped and logged: the client stores it again with its next offsets).
    pub(super) fn store_forwarded_offset(self: &Arc<Self>, stored: StoredOffset) {
        if self.leading_epoch().is_none() {
            tracing::warn!(stream = %self.key.name, "a forwarded stored offset reached a member that does not lead: dropped");
            return;
        }
        match self.stream.store_offset(&stored.reference, stored.offset, now_ms()) {
            Ok(()) => self.request_sync(),
            Err(error) => tracing::warn!(stream = %self.key.name, %error, "a forwarded stored offset was not stored"),
        }
    }

    /// Tells member `from` what became of its request `request`.
    fn forwarded_answer(&self, from: u64, request: u64) -> impl FnOnce(bool) + Send + 'static {
        let key = self.key.clone();
        let transport = self.transport.clone();
        move |committed: bool| {
            transport.send(from, ReplicaMessage::Published(key, Outcome { request, committed }).encode());
        }
    }
}
