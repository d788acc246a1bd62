//! The replicated state machine alone: the same batches give the same state and the same
//! delivery plan on every replica, time comes from the batch, and an entry is applied once.

use bytes::Bytes;
use replication::command::{Batch, ProposedCommand, QueueCommand};
use replication::state_machine::{CommandResult, Outcome, QueueStateMachine};

/// A batch of commands that are not deduplicated (sequence 0).
fn batch(now_ms: u64, commands: Vec<QueueCommand>) -> Batch {
    let commands = commands.into_iter().map(|command| ProposedCommand { queue: 1, proposer: 9, sequence: 0, command }).collect();
    Batch { now_ms, commands }
}

fn enqueue(body: &'static str, own_ttl_ms: Option<u64>) -> QueueCommand {
    QueueCommand::Enqueue { persistent: true, own_ttl_ms, body: Bytes::from_static(body.as_bytes()) }
}

fn log() -> Vec<Batch> {
    vec![
        batch(1_000, vec![QueueCommand::Declare, enqueue("a", None), enqueue("b", None), enqueue("c", None)]),
        batch(
            1_010,
            vec![
                QueueCommand::AddConsumer { consumer: 5, priority: 0, prefetch: 2 },
                QueueCommand::AddConsumer { consumer: 6, priority: 0, prefetch: 1 },
            ],
        ),
        batch(1_020, vec![QueueCommand::Settle { position: 0 }, QueueCommand::Requeue { position: 1 }, enqueue("d", None)]),
        batch(1_030, vec![QueueCommand::CancelConsumer { consumer: 5 }, QueueCommand::Settle { position: 2 }]),
    ]
}

fn replay(batches: &[Batch]) -> (QueueStateMachine, Vec<Outcome>) {
    let mut machine = QueueStateMachine::new();
    let mut outcomes = Vec::new();
    for (offset, batch) in batches.iter().enumerate() {
        // Through the entry encoding, as a replica receives it.
        let decoded = Batch::decode(Bytes::from(batch.encode())).expect("decodes");
        machine.apply(offset as u64 + 1, decoded, &mut outcomes);
    }
    (machine, outcomes)
}

#[test]
fn replicas_applying_the_same_log_agree_on_state_and_deliveries() {
    let (first, first_outcomes) = replay(&log());
    let (second, second_outcomes) = replay(&log());
    assert_eq!(first_outcomes, second_outcomes);
    assert_eq!(first.encode_image(), second.encode_image());
    let deliveries = first_outcomes.iter().filter(|outcome| matches!(outcome, Outcome::Delivered { .. })).count();
    assert!(deliveries >= 4, "{first_outcomes:?}");
    let restored = QueueStateMachine::decode_image(Bytes::from(first.encode_image())).expect("decodes");
    assert_eq!(restored.encode_image(), first.encode_image());
    assert_eq!(restored.applied_index(), 4);
}

#[test]
fn expiry_uses_the_batch_time_not_a_clock() {
    let batches = vec![
        batch(1_000, vec![QueueCommand::Declare, enqueue("short", Some(100)), enqueue("long", Some(10_000))]),
        // 200 ms later by the leader's clock: "short" is past its TTL when the consumer comes.
        batch(1_200, vec![QueueCommand::AddConsumer { consumer: 5, priority: 0, prefetch: 0 }]),
    ];
    let (_, outcomes) = replay(&batches);
    let delivered: Vec<&Bytes> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Outcome::Delivered { body, .. } => Some(body),
            _ => None,
        })
        .collect();
    assert_eq!(delivered, vec![&Bytes::from_static(b"long")]);
}

#[test]
fn commands_for_a_queue_that_does_not_exist_are_refused() {
    let (_, outcomes) = replay(&[batch(
        1,
        vec![enqueue("a", None), QueueCommand::Declare, QueueCommand::Declare, QueueCommand::Delete, QueueCommand::Delete],
    )]);
    let results: Vec<&CommandResult> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Outcome::Committed { result, .. } => Some(result),
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        vec![
            &CommandResult::NoSuchQueue,
            &CommandResult::Declared,
            &CommandResult::Declared,
            &CommandResult::Deleted,
            &CommandResult::NoSuchQueue
        ]
    );
}

#[test]
#[should_panic(expected = "applied after entry")]
fn an_entry_applied_twice_stops_the_replica() {
    let mut machine = QueueStateMachine::new();
    let mut outcomes = Vec::new();
    machine.apply(1, batch(1, vec![QueueCommand::Declare]), &mut outcomes);
    machine.apply(1, batch(1, vec![enqueue("again", None)]), &mut outcomes);
}

/// A forwarded command retried after a leader change may be committed twice (the first copy did
/// make it): the state machine applies it once and answers the retry `Duplicate`. The proposers'
/// last sequences travel in the snapshot image, so a replica restored from one deduplicates alike.
#[test]
fn a_retried_command_is_applied_once_even_after_a_snapshot() {
    let numbered = |proposer: u64, sequence: u64, command: QueueCommand| ProposedCommand { queue: 1, proposer, sequence, command };
    let mut machine = QueueStateMachine::new();
    let mut outcomes = Vec::new();
    machine.apply(
        1,
        Batch { now_ms: 1, commands: vec![numbered(3, 1, QueueCommand::Declare), numbered(3, 2, enqueue("a", None))] },
        &mut outcomes,
    );
    let mut restored = QueueStateMachine::decode_image(Bytes::from(machine.encode_image())).expect("decodes");
    for replica in [&mut machine, &mut restored] {
        outcomes.clear();
        let retry = vec![numbered(3, 2, enqueue("a", None)), numbered(4, 1, enqueue("b", None)), numbered(3, 1, QueueCommand::Purge)];
        replica.apply(2, Batch { now_ms: 2, commands: retry }, &mut outcomes);
        let results: Vec<&CommandResult> = outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                Outcome::Committed { result, .. } => Some(result),
                _ => None,
            })
            .collect();
        assert_eq!(results[0], &CommandResult::Duplicate);
        assert_eq!(results[2], &CommandResult::Duplicate, "a lower number after a higher one is never applied");
        assert_eq!(replica.queue(1).expect("declared").stats().published, 2);
    }
    assert_eq!(machine.encode_image(), restored.encode_image());
}
