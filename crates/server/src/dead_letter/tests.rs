//! At least once: a dead-lettered message is settled in its source's log only once its new queue
//! holds it durably, and not at all when that queue's sync fails.

use super::*;
use crate::queue_type::{ClassicStorage, ConfirmTickets, PublishOutcome, Queue};
use amqp_codec::{BasicProperties, ContentHeader, FieldTable, FieldValue};
use broker_core::vhost::{QueueDefinition, QueueType, Vhost};
use bytes::Bytes;
use parking_lot::RwLock;
use std::path::PathBuf;
use std::time::Instant;
use storage::journal::Journal;
use storage::memory_file_system::{FaultOperation, MemoryFileSystem};
use storage::syncer::SyncPolicy;

struct DataDir(PathBuf);

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn definition(name: &str, arguments: &[(&str, &str)], ttl_ms: Option<i32>) -> QueueDefinition {
    let mut table = FieldTable::new();
    for (key, value) in arguments {
        table.insert(key, FieldValue::LongStr(Bytes::copy_from_slice(value.as_bytes())));
    }
    if let Some(ttl_ms) = ttl_ms {
        table.insert("x-message-ttl", FieldValue::I32(ttl_ms));
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

fn persistent(body: &'static str) -> Arc<Message> {
    let properties = BasicProperties { delivery_mode: Some(2), ..Default::default() };
    Arc::new(Message {
        exchange: ShortStr::from(""),
        routing_key: ShortStr::from("source"),
        header: ContentHeader::from_properties(60, body.len() as u64, &properties),
        body: Bytes::from_static(body.as_bytes()),
        published_at_ns: 0,
        bcc_routing_keys: None,
    })
}

/// Publishes to `queue` and waits until the group commit made it durable.
fn publish_durably(queue: &Queue, syncer: &Syncer, message: Arc<Message>) {
    let PublishOutcome::Accepted(ticket) = queue.publish(message) else { panic!("the queue took it") };
    let mut tickets = ConfirmTickets::default();
    tickets.add(ticket);
    let (done, wait) = std::sync::mpsc::channel();
    tickets.when_settled(
        syncer,
        Box::new(move |durable| {
            let _ = done.send(durable);
        }),
    );
    assert_eq!(wait.recv_timeout(Duration::from_secs(10)), Ok(true));
}

fn end_of(queue: &Queue) -> storage::queue_log::RecordLocation {
    queue.durable_log().expect("a durable queue").lock().end_location()
}

#[test]
fn the_source_is_settled_only_once_the_target_holds_the_dead_letter() {
    let data_dir = DataDir(std::env::temp_dir().join(format!("lepus-dead-letter-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&data_dir.0);
    std::fs::create_dir_all(data_dir.0.join("queues")).expect("create the data directory");
    // The journal every log's sync goes through is on a file system that can fail its syncs.
    let journal_file_system = MemoryFileSystem::new();
    let journal_directory = data_dir.0.join("journal");
    journal_file_system.create_durable_directory(&data_dir.0);
    let (journal, _) = Journal::open_in(journal_file_system.shared(), &journal_directory).expect("journal");
    let syncer = Syncer::start(SyncPolicy::Always, Some(journal));
    let (sender, receiver) = channel();
    let storage = ClassicStorage {
        data_dir: &data_dir.0,
        segment_bytes_max: 1 << 20,
        journaled: true,
        syncer: &syncer,
        dead_letters: Some(&sender),
        expiry_timers: &Arc::default(),
    };
    // Every message expires at once into "target", through the default exchange.
    let source_definition = definition("source", &[("x-dead-letter-exchange", ""), ("x-dead-letter-routing-key", "target")], Some(0));
    let source = storage.create(&source_definition, "/").expect("create");
    let target = storage.create(&definition("target", &[], None), "/").expect("create");
    let topology: VhostTopology = Arc::new(RwLock::new(Vhost::new("/")));
    topology.write().restore_queue(source_definition, source.clone());
    topology.write().restore_queue(definition("target", &[], None), target.clone());
    let next_batch = || loop {
        // A source expiring at once may also wake the worker for its deadline: skip those.
        match receiver.receiver.recv_timeout(Duration::from_secs(10)).expect("the queue handed its dead letter over") {
            WorkerInput::Batch(batch) => break batch,
            WorkerInput::Wake => continue,
        }
    };
    let delayed = crate::delayed::DelayedMessages::open(&data_dir.0, 1 << 20, false).expect("delay store");

    // The target syncs: the source's settle record follows.
    publish_durably(&source, &syncer, persistent("first"));
    let batch = next_batch();
    assert_eq!(batch.letters.len(), 1);
    assert!(batch.letters[0].logged);
    let before = end_of(&source);
    publish_batch(Some(topology.clone()), &syncer, &delayed, &|_| true, batch);
    let deadline = Instant::now() + Duration::from_secs(10);
    while end_of(&source) == before {
        assert!(Instant::now() < deadline, "the source was never settled");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(target.counts().0, 1, "the target holds it");

    // The target's sync fails: the source keeps the message in its log (a restart brings it back).
    publish_durably(&source, &syncer, persistent("second"));
    let batch = next_batch();
    let before = end_of(&source);
    journal_file_system.fail(FaultOperation::Sync, libc::EIO, &journal_directory, u64::MAX);
    publish_batch(Some(topology.clone()), &syncer, &delayed, &|_| true, batch);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(end_of(&source), before, "settled in the source although the target could not make it durable");
    journal_file_system.clear_faults();

    // The target is a queue being declared whose definition could not be stored: its synced log
    // alone is no safe home (a restart would remove it as an orphan), so the source keeps it.
    publish_durably(&source, &syncer, persistent("third"));
    let batch = next_batch();
    let before = end_of(&source);
    let asked = parking_lot::Mutex::new(Vec::new());
    let definition_lost = |queues: &[Queue]| {
        asked.lock().extend(queues.iter().map(|queue| queue.name().to_string()));
        false
    };
    publish_batch(Some(topology.clone()), &syncer, &delayed, &definition_lost, batch);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(*asked.lock(), vec!["target".to_string()], "the target's definition was not waited for");
    assert_eq!(end_of(&source), before, "settled in the source although the target's definition was not stored");
}
