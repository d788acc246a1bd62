//! The delay store without a broker: the index gives messages back when they are due, earliest
//! first; a restart rebuilds it from the persistent records alone; a routed message carries its
//! delay negated.

use super::*;
use amqp_codec::{BasicProperties, ContentHeader, FieldTable, FieldValue, ShortStr};
use bytes::Bytes;
use std::path::PathBuf;
use std::time::{Duration, Instant};

struct DataDir(PathBuf);

impl DataDir {
    fn new(name: &str) -> DataDir {
        let path = std::env::temp_dir().join(format!("lepus-delayed-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(path.join("queues")).expect("create the data directory");
        DataDir(path)
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn message(body: &str, persistent: bool) -> Message {
    let mut headers = FieldTable::new();
    headers.insert("x-delay", FieldValue::I32(1));
    headers.insert("other", FieldValue::LongStr(Bytes::from("kept")));
    let properties = BasicProperties { delivery_mode: Some(if persistent { 2 } else { 1 }), headers: Some(headers), ..Default::default() };
    Message {
        exchange: ShortStr::from("delayed"),
        routing_key: ShortStr::from("key"),
        header: ContentHeader::from_properties(60, body.len() as u64, &properties),
        body: Bytes::copy_from_slice(body.as_bytes()),
        published_at_ns: 0,
        bcc_routing_keys: None,
    }
}

fn route(delay_ms: u64) -> DelayedRoute {
    DelayedRoute { exchange: ShortStr::from("delayed"), delay_ms }
}

/// The bodies of the messages due now, read back from the store.
fn fire_bodies(store: &DelayedMessages, due: Vec<Due>) -> Vec<Bytes> {
    let mut log = store.log.lock();
    due.into_iter()
        .map(|due| {
            let plan = log.plan_tail_read(&storage::queue_log::TailCursor::new(due.location(), 0)).expect("plan");
            let (_, stored) = plan.read_at(due.location()).expect("read");
            envelope::unwrap(stored).expect("an envelope").1.body
        })
        .collect()
}

#[test]
fn messages_come_back_when_due_earliest_first() {
    let data_dir = DataDir::new("due");
    let store = DelayedMessages::open(&data_dir.0, 1 << 20, false).expect("open");
    let started = Instant::now();
    // Due times are wall-clock milliseconds, floored: compare them with the same clock, not with
    // `Instant`, which may run a fraction of a millisecond apart (CI saw 119.x ms).
    let started_ms = crate::queue_runtime::now_ms();
    for (body, delay_ms) in [("late", 120), ("early", 40), ("middle", 80)] {
        assert!(matches!(store.delay("/", &route(delay_ms), &message(body, true), true), ConfirmTicket::LogSynced(_)));
    }
    assert!(matches!(store.delay("/", &route(60), &message("transient", false), true), ConfirmTicket::Immediate));
    assert!(matches!(store.delay("/", &route(100), &message("transient exchange", true), false), ConfirmTicket::Immediate));
    assert_eq!(store.pending(), 5);
    let mut bodies = Vec::new();
    while bodies.len() < 5 {
        assert!(started.elapsed() < Duration::from_secs(5), "never due");
        let due = store.wait_for_due();
        for due in &due {
            let elapsed_ms = started.elapsed().as_millis() as u64;
            assert!(crate::queue_runtime::now_ms() >= due.due_ms, "handed out before its time ({elapsed_ms} ms in)");
        }
        bodies.extend(fire_bodies(&store, due));
    }
    assert_eq!(bodies, ["early", "transient", "middle", "transient exchange", "late"].map(Bytes::from));
    let finished_ms = crate::queue_runtime::now_ms();
    assert!(finished_ms >= started_ms + 120, "the latest message came back after {} ms", finished_ms - started_ms);
    assert_eq!(store.pending(), 0);
}

fn wall_clock_us() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_micros()
}

#[test]
fn no_message_is_routed_before_its_delay_has_passed() {
    let data_dir = DataDir::new("never-early");
    let store = DelayedMessages::open(&data_dir.0, 1 << 20, false).expect("open");
    let mut published_us = Vec::new();
    for index in 0..40 {
        published_us.push(wall_clock_us());
        store.delay("/", &route(2), &message(&index.to_string(), false), false);
        std::thread::sleep(Duration::from_micros(150));
    }
    let mut routed = 0;
    while routed < published_us.len() {
        let due = store.wait_for_due();
        let now_us = wall_clock_us();
        for body in fire_bodies(&store, due) {
            let index: usize = std::str::from_utf8(&body).expect("utf-8").parse().expect("an index");
            let waited_us = now_us - published_us[index];
            assert!(waited_us >= 2_000, "message {index} routed after {waited_us} us, before its 2 ms delay");
            routed += 1;
        }
    }
}

#[test]
fn a_restart_rebuilds_the_index_from_the_persistent_records() {
    let data_dir = DataDir::new("restart");
    {
        let store = DelayedMessages::open(&data_dir.0, 1 << 20, false).expect("open");
        store.delay("/", &route(3_600_000), &message("in an hour", true), true);
        store.delay("/", &route(1), &message("transient", false), true);
        store.delay("/", &route(2), &message("at once", true), true);
        store.log.lock().write_pending(storage::queue_log::SyncDue::Now).expect("write");
    }
    let store = DelayedMessages::open(&data_dir.0, 1 << 20, false).expect("reopen");
    assert_eq!(store.pending(), 2, "the transient message is gone");
    std::thread::sleep(Duration::from_millis(5));
    let due = store.wait_for_due();
    assert_eq!(fire_bodies(&store, due), vec![Bytes::from("at once")]);
    assert_eq!(store.pending(), 1);
}

#[test]
fn a_routed_message_carries_its_delay_negated_and_its_other_headers() {
    let routed = timer::with_routed_delay(message("m", true), 5000);
    let headers = routed.header.properties().expect("properties").headers.expect("headers");
    assert_eq!(headers.get("x-delay"), Some(&FieldValue::I32(-5000)));
    assert_eq!(headers.get("other"), Some(&FieldValue::LongStr(Bytes::from("kept"))));
    assert_eq!(routed.body, Bytes::from("m"));
}
