//! A queue's messages as plain data and back: what a replicated queue puts in a snapshot, so a
//! replica restored from it holds the same positions, flags and holders as the one that took it.

use super::{QueueState, Unacked};
use crate::{ConsumerId, Payload, QueuedMessage};

/// Every message of a [`QueueState`], in position order. A queue with priorities is not imaged
/// (only replicated queues are, and they take no x-max-priority): its state restores as a plain one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessagesImage<M> {
    /// The position the next message gets.
    pub next_position: u64,
    /// Ready messages in memory, by position.
    pub ready: Vec<(u64, QueuedMessage<M>)>,
    /// Unacked messages by position, with the consumer holding each (none: basic.get).
    pub unacked: Vec<(u64, QueuedMessage<M>, Option<ConsumerId>)>,
    /// Ready messages on disk only.
    pub paged: u64,
}

impl<M: Payload> QueueState<M> {
    /// The messages as data; unacked ones sorted by position so equal states give equal images.
    pub fn image(&self) -> MessagesImage<M> {
        let ready = self.ready.iter().map(|(key, queued)| (super::priority::position_of(*key), queued.clone())).collect();
        let mut unacked: Vec<_> =
            self.unacked.iter().map(|(position, unacked)| (*position, unacked.queued.clone(), unacked.consumer)).collect();
        unacked.sort_by_key(|(position, _, _)| *position);
        MessagesImage { next_position: self.next_position, ready, unacked, paged: self.paged }
    }

    /// The state an image was taken of.
    pub fn from_image(image: MessagesImage<M>) -> QueueState<M> {
        let mut state = QueueState::with_paged(image.next_position, image.paged);
        for (position, queued) in image.ready {
            state.insert_ready(position, queued);
        }
        for (position, queued, consumer) in image.unacked {
            state.track_unacked(position, Unacked { queued, consumer });
        }
        state
    }
}
