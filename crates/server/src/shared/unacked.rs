//! A channel's unacked deliveries by delivery tag.
//!
//! Tags are handed out in sequence, one per delivery, and consumers mostly ack them in order, so
//! the recent ones live in a ring indexed by tag: an insert is a push at the back, an ack a pop
//! at the front. A BTreeMap here cost about 700 instructions a message for its insert and removal
//! (bench/results/hotpath-budget.md).
//!
//! A delivery held long while later ones are acked leaves holes behind it in the ring. So that a
//! single old delivery cannot make the ring grow with every later one, once the holes outnumber
//! both [`RECENT_HOLES_MAX`] and the live entries, the live entries move to an ordered map of
//! stragglers and the ring starts afresh: the ring holds at most `RECENT_HOLES_MAX` plus twice the
//! most deliveries unacked at once since it was last empty, whatever the number of tags.

use std::collections::{BTreeMap, VecDeque};

/// How many settled (or never ackable) tags the ring may hold between live ones before its live
/// entries move to the stragglers (when they are outnumbered by the holes too).
pub const RECENT_HOLES_MAX: usize = 4096;

/// Unacked deliveries by tag (see the module comment); `T` is [`super::Unacked`] in the broker.
#[derive(Debug)]
pub struct DeliveriesByTag<T> {
    /// The deliveries of tags `first_tag..first_tag + recent.len()`; `None` once settled, or for a
    /// tag that needed no ack. Its front is always live.
    recent: VecDeque<Option<T>>,
    /// The tag of `recent`'s front.
    first_tag: u64,
    /// Live entries in `recent`.
    recent_live: usize,
    /// Deliveries older than every tag in `recent`, moved out of it when its holes outgrew it.
    stragglers: BTreeMap<u64, T>,
}

impl<T> Default for DeliveriesByTag<T> {
    fn default() -> Self {
        DeliveriesByTag { recent: VecDeque::new(), first_tag: 0, recent_live: 0, stragglers: BTreeMap::new() }
    }
}

impl<T> DeliveriesByTag<T> {
    /// Unacked deliveries.
    pub fn len(&self) -> usize {
        self.recent_live + self.stragglers.len()
    }

    /// Whether none is unacked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records a delivery; tags must increase from one insert to the next.
    pub fn insert(&mut self, tag: u64, delivery: T) {
        let end_tag = self.first_tag + self.recent.len() as u64;
        if self.recent.is_empty() {
            self.first_tag = tag;
        } else {
            assert!(tag >= end_tag, "delivery tag {tag} inserted after {}", end_tag - 1);
            let gap = (tag - end_tag) as usize;
            if gap > RECENT_HOLES_MAX {
                self.move_recent_to_stragglers();
                self.first_tag = tag;
            } else {
                self.recent.extend(std::iter::repeat_with(|| None).take(gap));
            }
        }
        self.recent.push_back(Some(delivery));
        self.recent_live += 1;
        let holes = self.recent.len() - self.recent_live;
        if holes > RECENT_HOLES_MAX && holes > self.recent_live {
            self.move_recent_to_stragglers();
        }
    }

    /// Whether `tag` is unacked.
    pub fn contains_key(&self, tag: &u64) -> bool {
        match self.recent_index(*tag) {
            Some(index) => self.recent[index].is_some(),
            None => self.stragglers.contains_key(tag),
        }
    }

    /// The delivery of `tag`, when unacked.
    #[cfg(test)]
    pub fn get(&self, tag: &u64) -> Option<&T> {
        match self.recent_index(*tag) {
            Some(index) => self.recent[index].as_ref(),
            None => self.stragglers.get(tag),
        }
    }

    /// Forgets every delivery (their messages are the caller's to settle).
    #[cfg(test)]
    pub fn clear(&mut self) {
        *self = DeliveriesByTag::default();
    }

    /// Takes one delivery.
    pub fn remove(&mut self, tag: &u64) -> Option<T> {
        let Some(index) = self.recent_index(*tag) else {
            return self.stragglers.remove(tag);
        };
        let taken = self.recent[index].take();
        if taken.is_some() {
            self.recent_live -= 1;
            self.trim_front();
        }
        taken
    }

    /// Takes every delivery up to and including `tag`, oldest first, into `taken`.
    pub fn take_through(&mut self, tag: u64, taken: &mut Vec<T>) {
        while let Some(entry) = self.stragglers.first_entry() {
            if *entry.key() > tag {
                return;
            }
            taken.push(entry.remove());
        }
        while self.first_tag <= tag {
            let Some(slot) = self.recent.pop_front() else { break };
            self.first_tag += 1;
            if let Some(delivery) = slot {
                self.recent_live -= 1;
                taken.push(delivery);
            }
        }
        self.trim_front();
    }

    /// The oldest unacked delivery whose tag is `tag` or later.
    pub fn first_from(&self, tag: u64) -> Option<(u64, &T)> {
        if let Some((found, delivery)) = self.stragglers.range(tag..).next() {
            return Some((*found, delivery));
        }
        let start = tag.saturating_sub(self.first_tag) as usize;
        self.recent
            .iter()
            .enumerate()
            .skip(start)
            .find_map(|(index, slot)| slot.as_ref().map(|delivery| (self.first_tag + index as u64, delivery)))
    }

    /// Every unacked delivery, oldest first.
    pub fn into_values(self) -> impl Iterator<Item = T> {
        self.stragglers.into_values().chain(self.recent.into_iter().flatten())
    }

    fn recent_index(&self, tag: u64) -> Option<usize> {
        let index = tag.checked_sub(self.first_tag)?;
        (index < self.recent.len() as u64).then_some(index as usize)
    }

    /// Drops settled tags off the front, so the front is live (or the ring empty).
    fn trim_front(&mut self) {
        while let Some(None) = self.recent.front() {
            self.recent.pop_front();
            self.first_tag += 1;
        }
    }

    fn move_recent_to_stragglers(&mut self) {
        let first_tag = self.first_tag;
        for (index, slot) in std::mem::take(&mut self.recent).into_iter().enumerate() {
            if let Some(delivery) = slot {
                self.stragglers.insert(first_tag + index as u64, delivery);
            }
        }
        self.recent_live = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Operation {
        /// Deliver with this many tags skipped first (tags that needed no ack).
        Insert {
            skipped: u64,
        },
        Remove {
            back: u64,
        },
        TakeThrough {
            back: u64,
        },
        FirstFrom {
            back: u64,
        },
    }

    fn operation() -> impl Strategy<Value = Operation> {
        prop_oneof![
            6 => prop_oneof![3 => Just(0u64), 1 => 1u64..4, 1 => Just(RECENT_HOLES_MAX as u64 + 3)].prop_map(|skipped| Operation::Insert { skipped }),
            3 => (0u64..20).prop_map(|back| Operation::Remove { back }),
            1 => (0u64..20).prop_map(|back| Operation::TakeThrough { back }),
            1 => (0u64..20).prop_map(|back| Operation::FirstFrom { back }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn it_holds_what_an_ordered_map_holds(operations in proptest::collection::vec(operation(), 0..400)) {
            let mut ring = DeliveriesByTag::default();
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            let mut last_tag = 0u64;
            let mut live_peak = 0usize;
            for operation in operations {
                match operation {
                    Operation::Insert { skipped } => {
                        last_tag += skipped + 1;
                        ring.insert(last_tag, last_tag);
                        model.insert(last_tag, last_tag);
                    }
                    Operation::Remove { back } => {
                        let tag = last_tag.saturating_sub(back);
                        prop_assert_eq!(ring.contains_key(&tag), model.contains_key(&tag));
                        prop_assert_eq!(ring.remove(&tag), model.remove(&tag));
                    }
                    Operation::TakeThrough { back } => {
                        let tag = last_tag.saturating_sub(back);
                        let mut taken = Vec::new();
                        ring.take_through(tag, &mut taken);
                        let rest = model.split_off(&(tag + 1));
                        let expected: Vec<u64> = std::mem::replace(&mut model, rest).into_values().collect();
                        prop_assert_eq!(taken, expected);
                    }
                    Operation::FirstFrom { back } => {
                        let tag = last_tag.saturating_sub(back);
                        let expected = model.range(tag..).next().map(|(tag, value)| (*tag, value));
                        prop_assert_eq!(ring.first_from(tag), expected);
                    }
                }
                prop_assert_eq!(ring.len(), model.len());
                // Memory follows what was unacked at most, not how many tags went by.
                live_peak = live_peak.max(model.len());
                prop_assert!(ring.recent.len() <= RECENT_HOLES_MAX + 2 * live_peak + 1, "ring of {} slots, {} live at most", ring.recent.len(), live_peak);
            }
            let all: Vec<u64> = ring.into_values().collect();
            prop_assert_eq!(all, model.into_values().collect::<Vec<u64>>());
        }
    }

    #[test]
    fn a_delivery_held_while_many_later_ones_are_acked_does_not_grow_the_ring() {
        let mut ring = DeliveriesByTag::default();
        ring.insert(1, 1u64);
        for tag in 2..100_000u64 {
            ring.insert(tag, tag);
            assert_eq!(ring.remove(&tag), Some(tag));
        }
        assert!(ring.recent.len() <= RECENT_HOLES_MAX + 2, "{} slots for one unacked delivery", ring.recent.len());
        assert_eq!(ring.len(), 1);
        assert_eq!(ring.first_from(0), Some((1, &1)));
        let mut taken = Vec::new();
        ring.take_through(99_999, &mut taken);
        assert_eq!(taken, vec![1]);
        assert!(ring.is_empty());
    }
}
