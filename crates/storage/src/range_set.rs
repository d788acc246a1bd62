//! A set of queue positions kept as ranges, so that millions of settled or delivered positions
//! that mostly come in runs (acks in order) cost a few entries, not one each.

use std::collections::BTreeMap;

/// Positions as disjoint, non-adjacent half-open ranges `start..end`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Whether `position` is in the set.
    pub fn contains(&self, position: u64) -> bool {
        self.ranges.range(..=position).next_back().is_some_and(|(_, &end)| position < end)
    }

    /// Adds one position.
    pub fn insert(&mut self, position: u64) {
        self.insert_range(position, position + 1);
    }

    /// Adds `start..end`, merging with neighbours.
    pub fn insert_range(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&previous_start, &previous_end)) = self.ranges.range(..=start).next_back() {
            if previous_end >= start {
                start = previous_start;
                end = end.max(previous_end);
            }
        }
        let overlapping: Vec<(u64, u64)> = self.ranges.range(start..=end).map(|(&s, &e)| (s, e)).collect();
        for (overlap_start, overlap_end) in overlapping {
            self.ranges.remove(&overlap_start);
            end = end.max(overlap_end);
        }
        self.ranges.insert(start, end);
    }

    /// Removes one position.
    pub fn remove(&mut self, position: u64) {
        let Some((&start, &end)) = self.ranges.range(..=position).next_back() else { return };
        if position >= end {
            return;
        }
        self.ranges.remove(&start);
        if start < position {
            self.ranges.insert(start, position);
        }
        if position + 1 < end {
            self.ranges.insert(position + 1, end);
        }
    }

    /// Removes `start..end`.
    pub fn remove_range(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let first = self.ranges.range(..start).next_back().map(|(&s, &e)| (s, e));
        let overlapping: Vec<(u64, u64)> =
            first.into_iter().filter(|&(_, e)| e > start).chain(self.ranges.range(start..end).map(|(&s, &e)| (s, e))).collect();
        for (range_start, range_end) in overlapping {
            self.ranges.remove(&range_start);
            if range_start < start {
                self.ranges.insert(range_start, start);
            }
            if range_end > end {
                self.ranges.insert(end, range_end);
            }
        }
    }

    /// The parts of the set's ranges within `start..end`, in order.
    pub fn ranges_within(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let first = self.ranges.range(..start).next_back().map(|(&s, &e)| (s, e));
        first
            .into_iter()
            .chain(self.ranges.range(start..end).map(|(&s, &e)| (s, e)))
            .map(|(range_start, range_end)| (range_start.max(start), range_end.min(end)))
            .filter(|(low, high)| low < high)
            .collect()
    }

    /// The ranges, in order.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&start, &end)| (start, end))
    }

    /// Forgets every position below `floor`.
    pub fn remove_below(&mut self, floor: u64) {
        let below: Vec<(u64, u64)> = self.ranges.range(..floor).map(|(&s, &e)| (s, e)).collect();
        for (start, end) in below {
            self.ranges.remove(&start);
            if end > floor {
                self.ranges.insert(floor, end);
            }
        }
    }

    /// How many positions of `start..end` the set holds.
    pub fn count_in(&self, start: u64, end: u64) -> u64 {
        let mut count = 0;
        let first = self.ranges.range(..start).next_back().map(|(&s, &e)| (s, e));
        for (range_start, range_end) in first.into_iter().chain(self.ranges.range(start..end).map(|(&s, &e)| (s, e))) {
            let (low, high) = (range_start.max(start), range_end.min(end));
            if low < high {
                count += high - low;
            }
        }
        count
    }

    /// How many ranges the set holds (its memory cost).
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use super::RangeSet;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn behaves_like_a_set(operations in proptest::collection::vec((0u8..4, 0u64..64, 0u64..8), 0..200)) {
            let mut ranges = RangeSet::new();
            let mut model = BTreeSet::new();
            for (kind, position, length) in operations {
                match kind {
                    0 => { ranges.insert(position); model.insert(position); }
                    1 => { ranges.insert_range(position, position + length); model.extend(position..position + length); }
                    2 => {
                        ranges.remove_range(position, position + length);
                        for removed in position..position + length { model.remove(&removed); }
                    }
                    _ => { ranges.remove(position); model.remove(&position); }
                }
                for probe in 0..80 {
                    prop_assert_eq!(ranges.contains(probe), model.contains(&probe), "position {}", probe);
                }
                let within: BTreeSet<u64> = ranges.ranges_within(10, 40).into_iter().flat_map(|(low, high)| low..high).collect();
                prop_assert_eq!(within, model.range(10..40).copied().collect::<BTreeSet<u64>>());
                let mut previous_end = None;
                for (start, end) in ranges.ranges() {
                    prop_assert!(start < end && previous_end.is_none_or(|previous| previous < start), "disjoint, not adjacent, in order");
                    previous_end = Some(end);
                }
            }
        }
    }

    #[test]
    fn runs_cost_one_entry() {
        let mut ranges = RangeSet::new();
        for position in 0..100_000 {
            ranges.insert(position);
        }
        assert_eq!(ranges.range_count(), 1);
        ranges.remove_below(50_000);
        assert!(!ranges.contains(49_999) && ranges.contains(50_000));
    }
}
