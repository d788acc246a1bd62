//! Sampled histories behind the API's chart data: RabbitMQ's `lengths_age`/`lengths_incr`,
//! `msg_rates_age`/`msg_rates_incr` and `data_rates_age`/`data_rates_incr` query parameters, which
//! add `samples` (`[{"sample", "timestamp"}]`, newest first), `avg` and `avg_rate` to each
//! `*_details` object, as RabbitMQ 3.10.8's management API answers them.
//!
//! Each object (the node, a queue, an exchange, a connection) keeps a [`History`]: the values
//! sampled every [`super::rates::SAMPLE_INTERVAL_MS`], change-compressed (a sample equal to the
//! newest kept one adds nothing, so an idle object holds one entry) and bounded (a window of time
//! and a number of entries; see `rates.rs` for the bounds). A point of a requested range takes the
//! value of the newest sample taken at or before it.

use super::ApiError;
use serde_json::{json, Map, Value};
use std::collections::VecDeque;

/// RabbitMQ's `?MAX_RANGE`: a range may ask for at most this many increments (`age / incr`).
pub const RANGE_INCREMENTS_MAX: u64 = 500;

/// One sample: when, and the object's values then.
#[derive(Debug, Clone, Copy)]
struct Entry<const FIELDS: usize> {
    at_ms: u64,
    values: [u64; FIELDS],
}

/// An object's sampled values, oldest first.
#[derive(Debug, Clone)]
pub struct History<const FIELDS: usize> {
    entries: VecDeque<Entry<FIELDS>>,
    /// When the object was first sampled; before that its values read as zero (it did not exist,
    /// or nothing had happened yet), as RabbitMQ's samples before an object's first event.
    first_sampled_ms: u64,
    /// Whether older entries were dropped: a point before the oldest kept entry (and after the
    /// first sample) then takes the oldest kept values, the best the history still knows.
    truncated: bool,
}

impl<const FIELDS: usize> History<FIELDS> {
    /// A history whose first sample is `values`, taken at `at_ms`.
    pub fn new(at_ms: u64, values: [u64; FIELDS]) -> History<FIELDS> {
        let mut entries = VecDeque::with_capacity(1);
        entries.push_back(Entry { at_ms, values });
        History { entries, first_sampled_ms: at_ms, truncated: false }
    }

    /// The newest values.
    pub fn latest(&self) -> [u64; FIELDS] {
        self.entries.back().map(|entry| entry.values).unwrap_or([0; FIELDS])
    }

    /// Adds a sample taken at `at_ms`, keeping at most `entries_max` entries and dropping those
    /// no point within `window_ms` of `at_ms` needs.
    pub fn record(&mut self, at_ms: u64, values: [u64; FIELDS], entries_max: usize, window_ms: u64) {
        // A wall clock stepped back must not unsort the entries.
        let at_ms = self.entries.back().map_or(at_ms, |newest| at_ms.max(newest.at_ms));
        if self.entries.back().is_none_or(|newest| newest.values != values) {
            if self.entries.len() == self.entries.capacity() {
                // Grow by doubling up to the bound, never past it: an idle object stays at one entry.
                let grow = self.entries.len().max(1).min(entries_max.saturating_sub(self.entries.len()).max(1));
                self.entries.reserve_exact(grow);
            }
            self.entries.push_back(Entry { at_ms, values });
        }
        let window_start_ms = at_ms.saturating_sub(window_ms);
        // The entry in force at the window's start is kept; only those before it go.
        while self.entries.len() >= 2 && self.entries[1].at_ms <= window_start_ms {
            self.entries.pop_front();
            self.truncated = true;
        }
        while self.entries.len() > entries_max.max(1) {
            self.entries.pop_front();
            self.truncated = true;
        }
    }

    /// The values at `at_ms`: those of the newest sample taken at or before it.
    pub fn value_at(&self, at_ms: u64) -> [u64; FIELDS] {
        if at_ms < self.first_sampled_ms {
            return [0; FIELDS];
        }
        let after = self.entries.partition_point(|entry| entry.at_ms <= at_ms);
        match after.checked_sub(1) {
            Some(index) => self.entries[index].values,
            // Between the first sample and the oldest kept entry.
            None if self.truncated => self.entries.front().map(|entry| entry.values).unwrap_or([0; FIELDS]),
            None => [0; FIELDS],
        }
    }

    /// Entries held (for the memory bound's tests).
    #[cfg(test)]
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }
}

/// A range of points asked for with `PREFIX_age` and `PREFIX_incr` (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The newest point, a multiple of `incr_ms`.
    pub last_ms: u64,
    /// The distance between points.
    pub incr_ms: u64,
    /// How many points: `age / incr + 1`.
    pub count: u64,
}

/// How the newest point of a range is rounded: down (what has been sampled), or up (RabbitMQ
/// rounds queue lengths up on queue pages, so they match the queue's other current figures).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// To the multiple of the increment at or before now.
    Floor,
    /// To the multiple of the increment at or after now.
    Ceil,
}

impl Range {
    /// The range `age`/`incr` (seconds, as given in the query) ends at, or `None` when either is
    /// missing or not an integer (RabbitMQ then answers without samples); 400 with RabbitMQ's
    /// reason when they are integers out of bounds.
    pub fn parse(age: Option<&str>, incr: Option<&str>, now_ms: u64, rounding: Rounding) -> Result<Option<Range>, ApiError> {
        let (Some(age), Some(incr)) = (age.and_then(parse_integer), incr.and_then(parse_integer)) else {
            return Ok(None);
        };
        if age <= 0 || incr <= 0 || age / incr > RANGE_INCREMENTS_MAX as i64 {
            return Err(ApiError::bad_request(format!("Invalid range parameters: age {age}, incr {incr}")));
        }
        let (age_ms, incr_ms) = (age as u64 * 1000, incr as u64 * 1000);
        let floor_ms = now_ms / incr_ms * incr_ms;
        let last_ms = match rounding {
            Rounding::Ceil if floor_ms != now_ms => floor_ms + incr_ms,
            _ => floor_ms,
        };
        Ok(Some(Range { last_ms, incr_ms, count: age_ms / incr_ms + 1 }))
    }

    /// The points' timestamps, newest first.
    pub fn points(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.count).map(|index| self.last_ms.saturating_sub(index * self.incr_ms))
    }
}

/// Erlang's `list_to_integer` on a query value: an optional sign and digits.
fn parse_integer(text: &str) -> Option<i64> {
    text.parse::<i64>().ok()
}

/// One `*_details` object with samples: `rate` (the change over the newest increment, per second),
/// `samples` (newest first) and, for more than one point, `avg_rate` (the change over the whole
/// range, per second) and `avg` (the mean sample), as RabbitMQ computes them.
pub fn sampled_details(range: &Range, values: &[(u64, u64)]) -> Value {
    let samples: Vec<Value> = values.iter().map(|(at_ms, sample)| json!({"sample": sample, "timestamp": at_ms})).collect();
    let mut details = Map::new();
    let rate = match values {
        [(_, newest), (_, previous), ..] => (*newest as f64 - *previous as f64) * 1000.0 / range.incr_ms as f64,
        _ => 0.0,
    };
    details.insert("rate".to_owned(), json!(rate));
    details.insert("samples".to_owned(), Value::Array(samples));
    if let ([(newest_ms, newest), .., (oldest_ms, oldest)], true) = (values, values.len() > 1) {
        let span_ms = newest_ms.saturating_sub(*oldest_ms).max(1) as f64;
        details.insert("avg_rate".to_owned(), json!((*newest as f64 - *oldest as f64) * 1000.0 / span_ms));
        let total: f64 = values.iter().map(|(_, sample)| *sample as f64).sum();
        details.insert("avg".to_owned(), json!(total / values.len() as f64));
    }
    Value::Object(details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_object_keeps_one_entry_and_a_busy_one_is_bounded() {
        let mut idle = History::new(0, [7u64]);
        let mut busy = History::new(0, [0u64]);
        for tick in 1..1000u64 {
            idle.record(tick * 5000, [7], 122, 605_000);
            busy.record(tick * 5000, [tick], 122, 605_000);
        }
        assert_eq!(idle.entry_count(), 1);
        assert!(busy.entry_count() <= 122, "{}", busy.entry_count());
        // The window keeps the entry in force 605 s back, not more.
        assert_eq!(busy.value_at(999 * 5000 - 600_000), [999 - 120]);
        assert_eq!(idle.value_at(999 * 5000 - 3_600_000), [7]);
    }

    #[test]
    fn a_point_takes_the_newest_sample_at_or_before_it() {
        let mut history = History::new(10_000, [1u64, 100]);
        history.record(15_000, [4, 100], 122, 605_000);
        history.record(20_000, [4, 100], 122, 605_000);
        history.record(25_000, [9, 90], 122, 605_000);
        assert_eq!(history.value_at(9_999), [0, 0], "before the first sample");
        assert_eq!(history.value_at(10_000), [1, 100]);
        assert_eq!(history.value_at(24_999), [4, 100]);
        assert_eq!(history.value_at(60_000), [9, 90]);
    }

    #[test]
    fn a_bounded_history_answers_older_points_with_its_oldest_values() {
        let mut history = History::new(1000, [1u64]);
        for tick in 2..=10u64 {
            history.record(tick * 1000, [tick], 3, 1_000_000);
        }
        assert_eq!(history.entry_count(), 3);
        assert_eq!(history.value_at(2_000), [8], "truncated: the oldest kept value");
        assert_eq!(history.value_at(500), [0], "before the first sample, even when truncated");
    }

    #[test]
    fn ranges_follow_rabbitmq() {
        let range = Range::parse(Some("60"), Some("5"), 1_795_745_279_300, Rounding::Floor).unwrap().unwrap();
        assert_eq!(range, Range { last_ms: 1_795_745_275_000, incr_ms: 5000, count: 13 });
        let ceil = Range::parse(Some("60"), Some("5"), 1_795_745_279_300, Rounding::Ceil).unwrap().unwrap();
        assert_eq!(ceil.last_ms, 1_795_745_280_000);
        // 60 s in steps of 7 s: 9 points, as RabbitMQ 3.10.8 answers.
        assert_eq!(Range::parse(Some("60"), Some("7"), 1_000_000, Rounding::Floor).unwrap().unwrap().count, 9);
        assert_eq!(Range::parse(Some("500"), Some("1"), 0, Rounding::Floor).unwrap().unwrap().count, 501);
        for (age, incr) in [("501", "1"), ("60", "0"), ("-5", "1")] {
            let error = Range::parse(Some(age), Some(incr), 0, Rounding::Floor).unwrap_err();
            assert_eq!(error.reason, format!("Invalid range parameters: age {age}, incr {incr}"));
        }
        assert_eq!(Range::parse(Some("abc"), Some("5"), 0, Rounding::Floor).unwrap(), None);
        assert_eq!(Range::parse(Some("60"), None, 0, Rounding::Floor).unwrap(), None);
    }

    #[test]
    fn details_carry_rate_averages_and_samples_newest_first() {
        let range = Range { last_ms: 20_000, incr_ms: 5000, count: 3 };
        let details = sampled_details(&range, &[(20_000, 30), (15_000, 10), (10_000, 0)]);
        assert_eq!(details["rate"], json!(4.0));
        assert_eq!(details["avg_rate"], json!(3.0));
        assert_eq!(details["avg"], json!(40.0 / 3.0));
        assert_eq!(details["samples"][0], json!({"sample": 30, "timestamp": 20_000}));
        let one = sampled_details(&Range { last_ms: 20_000, incr_ms: 5000, count: 1 }, &[(20_000, 30)]);
        assert_eq!(one, json!({"rate": 0.0, "samples": [{"sample": 30, "timestamp": 20_000}]}));
    }
}
