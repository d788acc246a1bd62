//! A whole queue core as plain data and back (messages, consumers, round-robin turn, limits,
//! totals): the unit of a replicated queue's snapshot.

use crate::state::MessagesImage;
use crate::{ConsumerId, ConsumerSlot, Limits, PageIn, Payload, QueueCore, QueueState, QueueStats, Window};

/// A consumer as a snapshot holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerImage {
    /// The caller's id.
    pub id: ConsumerId,
    /// x-priority.
    pub priority: i64,
    /// basic.qos prefetch count (0: unlimited).
    pub prefetch: u32,
    /// Whether deliveries need no ack.
    pub no_ack: bool,
    /// Unacked deliveries counted against the prefetch.
    pub unacked: u32,
}

/// Everything a [`QueueCore`] holds except its paging window (a property of the node, not of the
/// queue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreImage<M> {
    /// The messages.
    pub messages: MessagesImage<M>,
    /// Consumers in the order they were added.
    pub consumers: Vec<ConsumerImage>,
    /// Where the round robin resumes.
    pub next_consumer: usize,
    /// Whether a consumer holds the queue exclusively.
    pub has_exclusive_consumer: bool,
    /// x-single-active-consumer.
    pub single_active_consumer: bool,
    /// The limits in force.
    pub limits: Limits,
    /// Totals.
    pub stats: QueueStats,
}

impl<M: Payload> QueueCore<M> {
    /// The queue as data.
    pub fn image(&self) -> CoreImage<M> {
        let consumers = self
            .consumers
            .iter()
            .map(|slot| ConsumerImage {
                id: slot.id,
                priority: slot.priority,
                prefetch: slot.prefetch,
                no_ack: slot.no_ack,
                unacked: slot.unacked,
            })
            .collect();
        CoreImage {
            messages: self.messages.image(),
            consumers,
            next_consumer: self.next_consumer,
            has_exclusive_consumer: self.has_exclusive_consumer,
            single_active_consumer: self.single_active_consumer,
            limits: self.limits,
            stats: self.stats,
        }
    }

    /// The queue an image was taken of, paging with `window` from now on.
    pub fn from_image(image: CoreImage<M>, window: Option<Window>) -> QueueCore<M> {
        let consumers = image
            .consumers
            .iter()
            .map(|consumer| ConsumerSlot {
                id: consumer.id,
                priority: consumer.priority,
                prefetch: consumer.prefetch,
                no_ack: consumer.no_ack,
                unacked: consumer.unacked,
            })
            .collect();
        QueueCore {
            messages: QueueState::from_image(image.messages),
            consumers,
            next_consumer: image.next_consumer,
            has_exclusive_consumer: image.has_exclusive_consumer,
            single_active_consumer: image.single_active_consumer,
            limits: image.limits,
            window,
            // A restored queue has no read under way: its messages are all in the image.
            page_in: PageIn::default(),
            stats: image.stats,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Command, Limits, Payload, QueueCore, QueueState};

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Body(u64);

    impl Payload for Body {
        fn size_bytes(&self) -> u64 {
            8
        }
    }

    /// A core restored from its image behaves as the original: same deliveries after the same
    /// commands, and the same image again.
    #[test]
    fn a_restored_core_continues_as_the_original() {
        let mut original = QueueCore::new(QueueState::default(), Limits::NONE, None);
        let mut effects = Vec::new();
        let mut can_take = |_| true;
        for consumer in [1, 2] {
            original.apply(
                Command::AddConsumer { consumer, priority: 0, exclusive: false, prefetch: 2, no_ack: false },
                0,
                &mut can_take,
                &mut effects,
            );
        }
        for body in 0..7 {
            original.apply(Command::Enqueue { message: Body(body), persistent: true, own_ttl_ms: None }, 0, &mut can_take, &mut effects);
        }
        original.apply(Command::Dispatch, 0, &mut can_take, &mut effects);
        original.apply(Command::Settle { position: 0 }, 0, &mut can_take, &mut effects);
        original.apply(Command::Requeue { position: 1 }, 0, &mut can_take, &mut effects);
        let mut restored = QueueCore::from_image(original.image(), None);
        assert_eq!(restored.image(), original.image());
        let mut original_effects = Vec::new();
        let mut restored_effects = Vec::new();
        original.apply(Command::Dispatch, 0, &mut can_take, &mut original_effects);
        restored.apply(Command::Dispatch, 0, &mut can_take, &mut restored_effects);
        assert_eq!(format!("{original_effects:?}"), format!("{restored_effects:?}"));
        assert!(!original_effects.is_empty());
        assert_eq!(restored.image(), original.image());
    }
}
