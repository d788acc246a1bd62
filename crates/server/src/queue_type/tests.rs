//! Unit tests of the queue-type seam, without a socket: what each type refuses (code and text, as
//! RabbitMQ 3.10.8 answers), what a publish's confirm waits for (through a real log and syncer on
//! the real filesystem), and settling deliveries by the id their queue gave them.

use super::*;
use crate::shared::{ConnectionShared, Outbound};
use amqp_codec::{BasicProperties, ContentHeader, FieldTable, FieldValue};
use broker_core::vhost::QueueType;
use bytes::Bytes;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use storage::journal::Journal;
use storage::memory_file_system::{FaultOperation, MemoryFileSystem};
use storage::syncer::SyncPolicy;
use tokio::sync::mpsc;

const VHOST: &str = "/";

fn definition(name: &str, arguments: &[(&str, FieldValue)]) -> QueueDefinition {
    let mut table = FieldTable::new();
    for (key, value) in arguments {
        table.insert(key, value.clone());
    }
    QueueDefinition {
        name: ShortStr::from(name),
        durable: true,
        exclusive_owner: None,
        auto_delete: false,
        arguments: table,
        queue_type: QueueType::Classic,
    }
}

fn text(value: &str) -> FieldValue {
    FieldValue::LongStr(Bytes::copy_from_slice(value.as_bytes()))
}

/// The reply code and text of a refusal, as a client would read them.
fn refusal(result: Result<(), AmqpError>) -> (u16, String) {
    let error = result.expect_err("refused");
    (error.code, error.text)
}

#[test]
fn classic_queues_take_every_property_and_their_implemented_arguments() {
    let classic = capabilities(QueueType::Classic);
    let mut transient = definition(
        "q",
        &[
            ("x-queue-type", text("classic")),
            ("x-max-length", FieldValue::I32(10)),
            ("x-message-ttl", FieldValue::I64(1000)),
            ("x-overflow", text("reject-publish")),
            // Hints RabbitMQ takes and that change no outcome are ignored, as are unknown arguments.
            ("x-queue-mode", text("lazy")),
            ("x-custom", text("anything")),
        ],
    );
    transient.durable = false;
    transient.auto_delete = true;
    transient.exclusive_owner = Some(7);
    assert_eq!(classic.check_declare(&transient, VHOST), Ok(()));
    assert_eq!(classic.check_consume(&transient.name, VHOST, true, true), Ok(()));
    assert_eq!(classic.check_get(&transient.name, VHOST), Ok(()));
}

#[test]
fn classic_queues_refuse_other_types_arguments_and_bad_values_with_406() {
    let classic = capabilities(QueueType::Classic);
    // Another type's argument, as RabbitMQ 3.10.8 refuses it on a classic queue (its value unchecked).
    for key in ["x-max-age", "x-quorum-initial-group-size", "x-dead-letter-strategy", "x-max-in-memory-length", "x-queue-leader-locator"] {
        let declared = definition("q", &[(key, FieldValue::I32(1))]);
        assert_eq!(
            refusal(classic.check_declare(&declared, VHOST)),
            (406, format!("PRECONDITION_FAILED - invalid arg '{key}' for queue 'q' in vhost '/' of queue type rabbit_classic_queue"))
        );
    }
    // x-delivery-limit is Lepus's extension on classic queues, not another type's.
    assert_eq!(classic.check_declare(&definition("q", &[("x-delivery-limit", FieldValue::I32(3))]), VHOST), Ok(()));
    // The values of the classic arguments are checked before the other types' keys, as RabbitMQ does.
    let later = definition("q", &[("x-max-age", text("1D")), ("x-max-length", FieldValue::I32(-1))]);
    assert_eq!(
        refusal(classic.check_declare(&later, VHOST)),
        (406, "PRECONDITION_FAILED - invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}".to_string())
    );
    let negative = definition("q", &[("x-max-length", FieldValue::I32(-1))]);
    assert_eq!(
        refusal(classic.check_declare(&negative, VHOST)),
        (406, "PRECONDITION_FAILED - invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}".to_string())
    );
    // In the order the client sent them: a bad value before an unimplemented argument is a 406.
    let both = definition("q", &[("x-overflow", text("sideways")), ("x-max-age", text("1D"))]);
    assert_eq!(
        refusal(classic.check_declare(&both, VHOST)),
        (406, "PRECONDITION_FAILED - invalid arg 'x-overflow' for queue 'q' in vhost '/': invalid_overflow".to_string())
    );
}

#[test]
fn dead_letter_and_byte_limit_arguments_are_checked_with_rabbitmq_texts() {
    let classic = capabilities(QueueType::Classic);
    let refused = |arguments: &[(&str, FieldValue)]| refusal(classic.check_declare(&definition("q", arguments), VHOST));
    let prefix = "PRECONDITION_FAILED - invalid arg";
    assert_eq!(
        refused(&[("x-dead-letter-exchange", FieldValue::I32(1))]),
        (406, "PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'".to_string())
    );
    assert_eq!(
        refused(&[("x-dead-letter-routing-key", text("k"))]),
        (406, format!("{prefix} 'x-dead-letter-routing-key' for queue 'q' in vhost '/': routing_key_but_no_dlx_defined"))
    );
    assert_eq!(
        refused(&[("x-dead-letter-exchange", text("x")), ("x-dead-letter-routing-key", FieldValue::I32(5))]),
        (406, format!("{prefix} 'x-dead-letter-routing-key' for queue 'q' in vhost '/': {{unacceptable_type,signedint}}"))
    );
    assert_eq!(
        refused(&[("x-max-length-bytes", FieldValue::I32(-1))]),
        (406, format!("{prefix} 'x-max-length-bytes' for queue 'q' in vhost '/': {{value_negative,-1}}"))
    );
    assert_eq!(
        refused(&[("x-max-length-bytes", text("a"))]),
        (406, format!("{prefix} 'x-max-length-bytes' for queue 'q' in vhost '/': \"expected integer, got longstr\""))
    );
    let accepted = definition(
        "q",
        &[
            ("x-dead-letter-exchange", text("")),
            ("x-dead-letter-routing-key", text("k")),
            ("x-max-length-bytes", FieldValue::I64(10)),
            ("x-overflow", text("reject-publish-dlx")),
            ("x-delivery-limit", FieldValue::I32(3)),
        ],
    );
    assert_eq!(classic.check_declare(&accepted, VHOST), Ok(()));
    assert_eq!(
        refused(&[("x-delivery-limit", FieldValue::I32(-1))]),
        (406, format!("{prefix} 'x-delivery-limit' for queue 'q' in vhost '/': {{value_negative,-1}}"))
    );
}

#[test]
fn quorum_and_stream_queues_must_be_durable_not_auto_delete_and_not_exclusive() {
    // RabbitMQ 3.10.8's order and names (measured): auto-delete, then exclusive-owner, then
    // non-durable.
    for queue_type in [QueueType::Quorum, QueueType::Stream] {
        let type_capabilities = capabilities(queue_type);
        let mut declared = definition("q", &[]);
        assert_eq!(type_capabilities.check_properties(&declared, "v"), Ok(()));
        declared.exclusive_owner = Some(1);
        assert_eq!(
            refusal(type_capabilities.check_properties(&declared, "v")),
            (406, "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue 'q' in vhost 'v'".to_string())
        );
        declared.auto_delete = true;
        declared.durable = false;
        assert_eq!(
            refusal(type_capabilities.check_properties(&declared, "v")),
            (406, "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'q' in vhost 'v'".to_string())
        );
        declared.auto_delete = false;
        declared.exclusive_owner = None;
        assert_eq!(
            refusal(type_capabilities.check_properties(&declared, "v")),
            (406, "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'q' in vhost 'v'".to_string())
        );
    }
}

#[test]
fn a_quorum_queue_checks_its_arguments_before_its_properties_and_names_its_type() {
    let quorum = capabilities(QueueType::Quorum);
    let mut declared = definition("q", &[("x-queue-type", text("quorum")), ("x-max-length", FieldValue::I32(-1))]);
    declared.queue_type = QueueType::Quorum;
    declared.exclusive_owner = Some(1);
    assert_eq!(
        refusal(quorum.check_declare(&declared, VHOST)),
        (406, "PRECONDITION_FAILED - invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}".to_string())
    );
    let mut declared = definition("q", &[("x-queue-mode", text("lazy")), ("x-max-priority", FieldValue::I32(3))]);
    declared.queue_type = QueueType::Quorum;
    assert_eq!(
        refusal(quorum.check_declare(&declared, VHOST)),
        (406, "PRECONDITION_FAILED - invalid arg 'x-queue-mode' for queue 'q' in vhost '/' of queue type rabbit_quorum_queue".to_string())
    );
    let strategy = [("x-dead-letter-exchange", text("dlx")), ("x-dead-letter-strategy", text("at-least-once"))];
    let mut declared = definition("q", &strategy);
    declared.queue_type = QueueType::Quorum;
    assert_eq!(quorum.check_declare(&declared, VHOST), Ok(()), "at-least-once dead-lettering is honoured on quorum queues");
    let mut declared = definition("q", &[("x-dead-letter-strategy", text("sometimes"))]);
    declared.queue_type = QueueType::Quorum;
    assert_eq!(
        refusal(quorum.check_declare(&declared, VHOST)),
        (406, "PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': invalid_dlx_strategy".to_string())
    );
    let mut declared = definition("q", &[("x-expires", FieldValue::I32(1000))]);
    declared.queue_type = QueueType::Quorum;
    assert_eq!(quorum.check_declare(&declared, VHOST), Ok(()), "x-expires is honoured on quorum queues");
}

#[test]
fn quorum_and_stream_queues_refuse_a_consumer_under_global_qos_and_streams_refuse_basic_get_and_no_ack() {
    let name = ShortStr::from("q");
    for queue_type in [QueueType::Quorum, QueueType::Stream] {
        assert_eq!(
            refusal(capabilities(queue_type).check_consume(&name, "v", false, true)),
            (540, "NOT_IMPLEMENTED - queue 'q' in vhost 'v' does not support global qos".to_string())
        );
    }
    let quorum = capabilities(QueueType::Quorum);
    assert_eq!(quorum.check_consume(&name, "v", true, false), Ok(()));
    assert_eq!(quorum.check_get(&name, "v"), Ok(()));
    let stream = capabilities(QueueType::Stream);
    assert_eq!(
        refusal(stream.check_get(&name, "v")),
        (540, "NOT_IMPLEMENTED - basic.get not supported by stream queues queue 'q' in vhost 'v'".to_string())
    );
    assert_eq!(
        refusal(stream.check_consume(&name, "v", true, false)),
        (540, "NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue 'q' in vhost 'v'".to_string())
    );
    assert_eq!(stream.check_consume(&name, "v", false, false), Ok(()));
}

/// A data directory for one test, removed when dropped.
struct DataDir(PathBuf);

impl DataDir {
    fn new(test: &str) -> DataDir {
        let path = std::env::temp_dir().join(format!("lepus-queue-type-{test}-{}", std::process::id()));
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

/// Records the confirms a syncer sends.
#[derive(Default)]
struct RecordedConfirms(Mutex<Vec<(u64, bool)>>);

impl ConfirmSink for RecordedConfirms {
    fn confirm_batch(&self, confirms: &[(u64, bool)]) {
        self.0.lock().extend_from_slice(confirms);
    }
}

impl RecordedConfirms {
    fn wait_for(&self, count: usize) -> Vec<(u64, bool)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.0.lock().len() < count {
            assert!(Instant::now() < deadline, "the confirms never came: {:?}", self.0.lock());
            std::thread::sleep(Duration::from_millis(5));
        }
        self.0.lock().clone()
    }
}

/// Classic queue storage in `data_dir` for these tests: 1 MiB segments, no dead-letter worker.
fn classic_storage<'a>(
    data_dir: &'a std::path::Path,
    syncer: &'a storage::syncer::Syncer,
    journaled: bool,
    expiry_timers: &'a Arc<crate::queue_expiry::ExpiryTimers>,
) -> ClassicStorage<'a> {
    ClassicStorage { data_dir, segment_bytes_max: 1 << 20, journaled, syncer, dead_letters: None, expiry_timers }
}

fn message(body: &'static str, persistent: bool) -> Arc<Message> {
    let properties = BasicProperties { delivery_mode: Some(if persistent { 2 } else { 1 }), ..Default::default() };
    Arc::new(Message {
        exchange: ShortStr::from(""),
        routing_key: ShortStr::from("q"),
        header: ContentHeader::from_properties(60, body.len() as u64, &properties),
        body: Bytes::from_static(body.as_bytes()),
        published_at_ns: 0,
        bcc_routing_keys: None,
    })
}

fn log_of(ticket: &ConfirmTicket) -> Option<&SharedLog> {
    match ticket {
        ConfirmTicket::Immediate => None,
        ConfirmTicket::LogSynced(log) => Some(log),
        ConfirmTicket::Committed(_) => None,
        ConfirmTicket::StreamCommitted(_) => None,
    }
}

#[test]
fn a_publish_outcome_carries_the_ticket_its_confirm_waits_for() {
    let data_dir = DataDir::new("outcome");
    // The journal, whose fdatasync every confirm of a journaled log waits for, is on a file system
    // that can fail its syncs; the queue logs are on the real one.
    let journal_file_system = MemoryFileSystem::new();
    let journal_directory = data_dir.0.join("journal");
    journal_file_system.create_durable_directory(&data_dir.0);
    let (journal, _) = Journal::open_in(journal_file_system.shared(), &journal_directory).expect("journal");
    let syncer = Syncer::start(SyncPolicy::Always, Some(journal));
    let expiry_timers = Arc::default();
    let storage = classic_storage(&data_dir.0, &syncer, true, &expiry_timers);
    let durable = storage.create(&definition("durable", &[]), VHOST).expect("create");
    let mut transient_definition = definition("transient", &[]);
    transient_definition.durable = false;
    let transient = storage.create(&transient_definition, VHOST).expect("create");
    let full = storage.create(&definition("full", &[("x-max-length", FieldValue::I32(0)), ("x-overflow", text("reject-publish"))]), VHOST);
    let full = full.expect("create");

    // A persistent message in a durable queue waits for that queue's log; anything else for nothing.
    let PublishOutcome::Accepted(logged) = durable.publish(message("one", true)) else { panic!("a durable queue took it") };
    let durable_log = durable.durable_log().expect("a durable queue has a log");
    assert!(log_of(&logged).is_some_and(|log| Arc::ptr_eq(log, durable_log)));
    let PublishOutcome::Accepted(transient_message) = durable.publish(message("two", false)) else { panic!("taken") };
    assert!(log_of(&transient_message).is_none());
    let PublishOutcome::Accepted(to_transient_queue) = transient.publish(message("three", true)) else { panic!("taken") };
    assert!(log_of(&to_transient_queue).is_none());
    assert!(matches!(full.publish(message("four", true)), PublishOutcome::Rejected));

    // A batch holds each log once and says which tickets must be waited for.
    let mut tickets = ConfirmTickets::default();
    assert!(!tickets.add(transient_message));
    assert!(tickets.is_empty());
    assert!(tickets.add(logged));
    let PublishOutcome::Accepted(again) = durable.publish(message("five", true)) else { panic!("taken") };
    assert!(tickets.add(again));
    assert_eq!(tickets.logs.len(), 1);

    // The confirms are sent once the group commit synced the log: acks, and a nack kept in place.
    let sink = Arc::new(RecordedConfirms::default());
    let confirm = |delivery_tag, accepted| PendingConfirm { sink: sink.clone(), delivery_tag, accepted };
    tickets.confirm_when_settled(&syncer, vec![confirm(1, true), confirm(2, false), confirm(3, true)]);
    assert_eq!(sink.wait_for(3), vec![(1, true), (2, false), (3, true)]);

    // When the sync fails, what waited for it is nacked, never acked.
    journal_file_system.fail(FaultOperation::Sync, libc::EIO, &journal_directory, u64::MAX);
    let PublishOutcome::Accepted(unsynced) = durable.publish(message("six", true)) else { panic!("taken") };
    let mut tickets = ConfirmTickets::default();
    assert!(tickets.add(unsynced));
    tickets.confirm_when_settled(&syncer, vec![confirm(4, true)]);
    assert_eq!(sink.wait_for(4)[3], (4, false));
    let (settled, outcome) = std::sync::mpsc::channel();
    let PublishOutcome::Accepted(committed) = durable.publish(message("seven", true)) else { panic!("taken") };
    let mut tickets = ConfirmTickets::default();
    tickets.add(committed);
    tickets.when_settled(
        &syncer,
        Box::new(move |durable| {
            let _ = settled.send(durable);
        }),
    );
    assert_eq!(outcome.recv_timeout(Duration::from_secs(10)), Ok(false), "a failed sync must not commit a transaction");
    journal_file_system.clear_faults();
}

/// A channel on a connection without a socket: what would be written arrives on the receiver.
fn channel() -> (Arc<ChannelShared>, mpsc::UnboundedReceiver<Outbound>) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let connection = Arc::new(ConnectionShared::detached(1, sender));
    (Arc::new(ChannelShared::new(1, connection)), receiver)
}

/// The (delivery tag, body, redelivered) of each basic.deliver sent so far.
fn deliveries(receiver: &mut mpsc::UnboundedReceiver<Outbound>) -> Vec<(u64, Bytes, bool)> {
    let mut delivered = Vec::new();
    while let Ok(item) = receiver.try_recv() {
        if let Outbound::Deliver { delivery_tag, message, redelivered, .. } = item {
            delivered.push((delivery_tag, message.body.clone(), redelivered));
        }
    }
    delivered
}

#[test]
fn deliveries_are_settled_by_the_id_their_queue_gave_them() {
    let data_dir = DataDir::new("settle");
    let syncer = Syncer::start(SyncPolicy::Always, None);
    let expiry_timers = Arc::default();
    let storage = classic_storage(&data_dir.0, &syncer, false, &expiry_timers);
    let mut transient = definition("q", &[]);
    transient.durable = false;
    let queue = storage.create(&transient, VHOST).expect("create");
    let (channel, mut receiver) = channel();
    let consumer = Arc::new(ConsumerHandle {
        tag: ShortStr::from("c"),
        channel: channel.clone(),
        no_ack: false,
        prefetch: 0,
        unacked: Default::default(),
        priority: 0,
        cancelled: Default::default(),
    });
    let mut accepted = false;
    queue.consume(consumer.clone(), false, || accepted = true).expect("consume");
    assert!(accepted);
    for body in ["a", "b", "c"] {
        queue.publish(message(body, false));
    }
    let delivered = deliveries(&mut receiver);
    assert_eq!(
        delivered.iter().map(|(tag, body, _)| (*tag, body.clone())).collect::<Vec<_>>(),
        vec![(1, Bytes::from("a")), (2, Bytes::from("b")), (3, Bytes::from("c"))]
    );
    let unacked: Vec<_> = std::mem::take(&mut channel.ledger.lock().unacked).into_values().collect();
    assert!(unacked.iter().all(|delivery| delivery.queue.same(&queue)), "each delivery names its queue");
    assert_eq!(queue.snapshot().unacked, 3);

    // Ack "a", requeue "b": "b" comes back redelivered; "c" stays unacked.
    // What the channel does as it takes deliveries off its ledger.
    for _ in &unacked {
        consumer.release_delivery();
    }
    queue.settle(&[unacked[0].position], Settlement::Ack);
    queue.settle(&[unacked[1].position], Settlement::Requeue);
    let redelivered = deliveries(&mut receiver);
    assert_eq!(redelivered, vec![(4, Bytes::from("b"), true)]);
    let snapshot = queue.snapshot();
    assert_eq!((snapshot.ready, snapshot.unacked, snapshot.stats.acked, snapshot.stats.requeued), (0, 2, 1, 1));

    // A reject without requeue settles as an ack does; the queue then holds only the redelivery.
    queue.settle(&[unacked[2].position], Settlement::Ack);
    let snapshot = queue.snapshot();
    assert_eq!((snapshot.ready, snapshot.unacked, snapshot.stats.acked), (0, 1, 2));
    assert_eq!(queue.cancel(&consumer), ConsumerRemoval::Removed);
    assert_eq!(queue.cancel(&consumer), ConsumerRemoval::NotFound);
}

#[test]
fn a_queue_that_found_the_writer_full_is_remembered_once_and_not_kept_alive() {
    let data_dir = DataDir::new("stalled");
    let syncer = Syncer::start(SyncPolicy::Always, None);
    let expiry_timers = Arc::default();
    let storage = classic_storage(&data_dir.0, &syncer, false, &expiry_timers);
    let mut transient = definition("q", &[]);
    transient.durable = false;
    let queue = storage.create(&transient, VHOST).expect("create");
    let (channel, _receiver) = channel();
    let consumer = Arc::new(ConsumerHandle {
        tag: ShortStr::from("c"),
        channel: channel.clone(),
        no_ack: true,
        prefetch: 0,
        unacked: Default::default(),
        priority: 0,
        cancelled: Default::default(),
    });
    queue.consume(consumer, false, || {}).expect("consume");
    // The writer is full: the queue keeps its messages and asks to be woken when it drains.
    channel.connection.outbound_deliveries.store(crate::shared::OUTBOUND_DELIVERIES_MAX, Ordering::Release);
    queue.publish(message("a", false));
    queue.publish(message("b", false));
    assert_eq!(queue.snapshot().ready, 2);
    let stalled = channel.connection.stalled_queues.lock().clone();
    assert_eq!(stalled.len(), 1, "one entry per queue, however often it found the writer full");
    assert!(stalled[0].upgrade().is_some_and(|woken| woken.same(&queue)));
    // Once the writer drained, waking the queue delivers what it held.
    channel.connection.outbound_deliveries.store(0, Ordering::Release);
    stalled[0].upgrade().expect("alive").dispatch();
    assert_eq!(queue.snapshot().ready, 0);
    channel.connection.stalled_queues.lock().clear();
    drop(queue);
    assert!(stalled[0].upgrade().is_none(), "a deleted queue is not kept alive by a stalled writer");
}

#[test]
fn a_message_a_queue_drops_at_once_is_dropped_without_a_log_record() {
    let data_dir = DataDir::new("dropped");
    let syncer = Syncer::start(SyncPolicy::Always, None);
    let expiry_timers = Arc::default();
    let storage = classic_storage(&data_dir.0, &syncer, false, &expiry_timers);
    // x-max-length 0 with the default overflow, drop-head: RabbitMQ acks the confirm and returns
    // nothing (the message was routed), and keeps nothing.
    let zero_length = storage.create(&definition("zero", &[("x-max-length", FieldValue::I32(0))]), VHOST).expect("create");
    let log = zero_length.durable_log().expect("a durable queue has a log").clone();
    let end_before = log.lock().end_location();
    assert!(matches!(zero_length.publish(message("one", true)), PublishOutcome::Dropped));
    assert_eq!(log.lock().end_location(), end_before, "a dropped message writes no record, so none waits to be settled");
    assert_eq!(zero_length.counts(), (0, 0));
    // A queue being deleted drops what is still routed to it.
    let deleted = storage.create(&definition("deleted", &[]), VHOST).expect("create");
    deleted.delete();
    assert!(matches!(deleted.publish(message("two", true)), PublishOutcome::Dropped));
}

/// A stream declaration is checked in RabbitMQ 3.10.8's order, with its texts (each measured on
/// the reference node): the values of the arguments a stream takes, then a known argument it
/// does not take, then the properties (auto-delete, exclusive, durable), then the segment size.
#[test]
fn stream_declarations_are_checked_in_rabbitmq_order_with_its_texts() {
    let stream = capabilities(QueueType::Stream);
    let refused = |arguments: &[(&str, FieldValue)], durable: bool, auto_delete: bool, exclusive: bool| {
        let mut declared = definition("s", arguments);
        declared.queue_type = QueueType::Stream;
        declared.durable = durable;
        declared.auto_delete = auto_delete;
        declared.exclusive_owner = exclusive.then_some(1);
        stream.check_declare(&declared, VHOST).map_err(|error| (error.code, error.text))
    };
    let prefix = "PRECONDITION_FAILED - invalid arg";
    let accepted = [
        ("x-queue-type", text("stream")),
        ("x-max-length-bytes", FieldValue::I64(1000)),
        ("x-max-age", text("7D")),
        ("x-stream-max-segment-size-bytes", FieldValue::I64(3_000_000_000)),
        ("x-initial-cluster-size", FieldValue::I32(1)),
        ("x-queue-leader-locator", text("balanced")),
        ("x-custom", text("ignored")),
    ];
    assert_eq!(refused(&accepted, true, false, false), Ok(()));
    for argument in ["x-max-length", "x-message-ttl", "x-dead-letter-exchange", "x-overflow", "x-expires", "x-queue-mode", "x-max-priority"]
    {
        assert_eq!(
            refused(&[(argument, FieldValue::I32(1))], false, false, false),
            Err((406, format!("{prefix} '{argument}' for queue 's' in vhost '/' of queue type rabbit_stream_queue"))),
            "{argument}: arguments come before properties"
        );
    }
    // A bad value of an argument streams take comes first, whatever the order.
    assert_eq!(
        refused(&[("x-max-length", FieldValue::I32(1)), ("x-max-age", FieldValue::I32(1))], true, false, false),
        Err((406, format!("{prefix} 'x-max-age' for queue 's' in vhost '/': {{unacceptable_type,signedint}}")))
    );
    assert_eq!(
        refused(&[("x-max-age", text("5x"))], true, false, false),
        Err((406, format!("{prefix} 'x-max-age' for queue 's' in vhost '/': invalid_max_age")))
    );
    assert_eq!(refused(&[("x-max-age", text("bad"))], true, false, false), Err((541, "INTERNAL_ERROR".to_string())));
    assert_eq!(
        refused(&[("x-stream-max-segment-size-bytes", text("x"))], true, false, false),
        Err((406, format!("{prefix} 'x-stream-max-segment-size-bytes' for queue 's' in vhost '/': \"expected integer, got longstr\"")))
    );
    let property = |name: &str| Err((406, format!("PRECONDITION_FAILED - invalid property '{name}' for queue 's' in vhost '/'")));
    assert_eq!(refused(&[], false, true, true), property("auto-delete"));
    assert_eq!(refused(&[], false, false, true), property("exclusive-owner"));
    assert_eq!(refused(&[], false, false, false), property("non-durable"));
    let too_large = [("x-stream-max-segment-size-bytes", FieldValue::I64(3_000_000_001))];
    assert_eq!(refused(&too_large, true, false, true), property("exclusive-owner"));
    assert_eq!(
        refused(&too_large, true, false, false),
        Err((406, "PRECONDITION_FAILED - Exceeded max value for x-stream-max-segment-size-bytes".to_string()))
    );
}

/// basic.consume on a stream: x-priority, then the prefetch, then no-ack, then a global prefetch.
#[test]
fn stream_consumers_need_a_prefetch_and_acks_and_take_no_priority() {
    let (stream, name) = (capabilities(QueueType::Stream), ShortStr::from("s"));
    let mut priority = FieldTable::new();
    priority.insert("x-priority", FieldValue::I32(5));
    let check = |arguments: &FieldTable, prefetch: u32, no_ack: bool, global: bool| {
        stream.check_stream_consume(&name, VHOST, arguments, prefetch, no_ack, global).map_err(|error| (error.code, error.text))
    };
    assert_eq!(
        check(&priority, 0, true, true),
        Err((
            406,
            "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 's' in vhost '/' of queue type rabbit_stream_queue".to_string()
        ))
    );
    let none = FieldTable::new();
    assert_eq!(
        check(&none, 0, true, true),
        Err((406, "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue 's' in vhost '/''".to_string()))
    );
    assert_eq!(
        check(&none, 10, true, true),
        Err((540, "NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue 's' in vhost '/'".to_string()))
    );
    assert_eq!(
        check(&none, 10, false, true),
        Err((540, "NOT_IMPLEMENTED - queue 's' in vhost '/' does not support global qos".to_string()))
    );
    assert_eq!(check(&none, 10, false, false), Ok(()));
}

/// The management sampler reads a classic queue only when a command ran since its last look
/// (`management/rates.rs`): an idle queue costs it one atomic load, a changed one shows up in the
/// next sample, and one whose head can expire by its TTL is looked at every time.
#[test]
fn the_sampler_reads_a_queue_only_after_a_change_or_while_its_head_can_expire() {
    let data_dir = DataDir::new("sampled");
    let syncer = Syncer::start(SyncPolicy::Always, None);
    let expiry_timers = Arc::default();
    let storage = classic_storage(&data_dir.0, &syncer, false, &expiry_timers);
    let queue = storage.create(&definition("sampled", &[]), VHOST).expect("create");
    assert!(queue.changed_since_sample(), "a new queue is sampled once");
    assert_eq!(queue.sample_if_changed().map(|snapshot| snapshot.ready), Some(0));
    assert!(!queue.changed_since_sample());
    assert!(queue.sample_if_changed().is_none(), "idle: nothing to read");
    let _ = queue.publish(message("one", false));
    let snapshot = queue.sample_if_changed().expect("a publish is a change");
    assert_eq!((snapshot.ready, snapshot.stats.published), (1, 1));
    assert!(queue.sample_if_changed().is_none(), "idle again");
    let expiring = storage.create(&definition("expiring", &[("x-message-ttl", FieldValue::I32(60_000))]), VHOST).expect("create");
    assert!(expiring.sample_if_changed().is_some());
    assert!(expiring.sample_if_changed().is_none(), "empty: nothing can expire");
    let _ = expiring.publish(message("two", false));
    assert_eq!(expiring.sample_if_changed().map(|snapshot| snapshot.ready), Some(1));
    assert!(expiring.sample_if_changed().is_some(), "its head can expire: looked at every time");
}
