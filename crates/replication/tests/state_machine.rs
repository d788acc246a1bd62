//! The replicated state machine alone: the same batches give the same state and the same
//! delivery plan on every replica, time comes from the batch, and an entry is applied once.

use bytes::Bytes;
use replication::command::{Batch, DeduplicationKey, ProposedCommand, QueueCommand};
use replication::state_machine::{CommandResult, Outcome, QueueStateMachine};

/// A declaration without a name or limits.
fn declare() -> QueueCommand {
    QueueCommand::Declare { name: bytes::Bytes::new(), incarnation: 0, limits: queue_core::Limits::NONE, single_active_consumer: false }
}

/// A batch of commands that are not deduplicated (sequence 0).
fn batch(now_ms: u64, commands: Vec<QueueCommand>) -> Batch {
    let commands = commands.into_iter().map(|command| ProposedCommand { queue: 1, proposer: 9, sequence: 0, command }).collect();
    Batch { now_ms, commands }
}

fn enqueue(body: &'static str, own_ttl_ms: Option<u64>) -> QueueCommand {
    QueueCommand::Enqueue { persistent: true, own_ttl_ms, body: Bytes::from_static(body.as_bytes()), deduplication: None }
}

fn log() -> Vec<Batch> {
    vec![
        batch(1_000, vec![declare(), enqueue("a", None), enqueue("b", None), enqueue("c", None)]),
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
fn a_machine_restored_from_its_image_tells_what_is_checked_out_to_a_proposers_consumers() {
    // What a node that installed a snapshot finds there: the deliveries the skipped entries made.
    let batches = vec![
        batch(1_000, vec![declare(), enqueue("a", None), enqueue("b", None), enqueue("c", None), enqueue("d", None)]),
        batch(1_010, vec![QueueCommand::AddConsumer { consumer: 5, priority: 0, prefetch: 2 }]),
        batch(1_020, vec![QueueCommand::AddConsumer { consumer: 6, priority: 0, prefetch: 1 }, QueueCommand::Settle { position: 0 }]),
    ];
    let (machine, outcomes) = replay(&batches);
    let restored = QueueStateMachine::decode_image(Bytes::from(machine.encode_image())).expect("decodes");
    let checked_out = restored.checked_out_to(9);
    assert_eq!(checked_out.iter().map(|message| (message.consumer, message.position)).collect::<Vec<_>>(), vec![(5, 1), (6, 2), (5, 3)]);
    assert_eq!(checked_out, machine.checked_out_to(9));
    assert_eq!(checked_out.len(), machine.queue(1).expect("declared").messages().unacked_count());
    for message in &checked_out {
        let last_delivery = outcomes.iter().rev().find_map(|outcome| match outcome {
            Outcome::Delivered { position, consumer, body, .. } if *position == message.position => Some((*consumer, body.clone())),
            _ => None,
        });
        assert_eq!(last_delivery, Some((message.consumer, message.body.clone())), "{message:?}");
    }
    assert!(restored.checked_out_to(8).is_empty(), "another proposer's consumers hold nothing");
}

#[test]
fn expiry_uses_the_batch_time_not_a_clock() {
    let batches = vec![
        batch(1_000, vec![declare(), enqueue("short", Some(100)), enqueue("long", Some(10_000))]),
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
    let (_, outcomes) = replay(&[batch(1, vec![enqueue("a", None), declare(), declare(), QueueCommand::Delete, QueueCommand::Delete])]);
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
            &CommandResult::Declared { queue: 1 },
            &CommandResult::Declared { queue: 1 },
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
    machine.apply(1, batch(1, vec![declare()]), &mut outcomes);
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
    machine.apply(1, Batch { now_ms: 1, commands: vec![numbered(3, 1, declare()), numbered(3, 2, enqueue("a", None))] }, &mut outcomes);
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

fn results(outcomes: &[Outcome]) -> Vec<CommandResult> {
    outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Outcome::Committed { result, .. } => Some(result.clone()),
            _ => None,
        })
        .collect()
}

/// A proposer's numbers are applied only without a gap: a command that overtook an earlier one
/// (lost, or slower on its way to the leader) is refused `OutOfOrder`, so a later retry of the
/// earlier one is applied rather than taken for a duplicate (which would lose it).
#[test]
fn a_command_past_a_gap_in_its_proposers_numbers_is_refused_until_the_gap_is_filled() {
    let numbered = |sequence: u64, command: QueueCommand| ProposedCommand { queue: 1, proposer: 3, sequence, command };
    let mut machine = QueueStateMachine::new();
    let mut outcomes = Vec::new();
    machine.apply(1, Batch { now_ms: 1, commands: vec![numbered(1, declare())] }, &mut outcomes);
    // Number 2 was lost; 3 arrives first.
    machine.apply(2, Batch { now_ms: 1, commands: vec![numbered(3, enqueue("c", None))] }, &mut outcomes);
    machine.apply(3, Batch { now_ms: 1, commands: vec![numbered(2, enqueue("b", None)), numbered(3, enqueue("c", None))] }, &mut outcomes);
    let results = results(&outcomes);
    assert_eq!(results[1], CommandResult::OutOfOrder);
    assert_eq!(&results[2..], &[CommandResult::Core(queue_core::Reply::Ok), CommandResult::Core(queue_core::Reply::Ok)]);
    assert_eq!(machine.queue(1).expect("declared").stats().published, 2);
}

/// Declared by name, a queue gets an id from the machine (never one a deleted queue had), and is
/// found by its name, also in a replica restored from a snapshot.
#[test]
fn a_named_queue_gets_a_fresh_id_and_is_found_by_its_name() {
    let named = |name: &'static str| ProposedCommand {
        queue: 0,
        proposer: 9,
        sequence: 0,
        command: QueueCommand::Declare {
            name: Bytes::from_static(name.as_bytes()),
            incarnation: 0,
            limits: queue_core::Limits::NONE,
            single_active_consumer: false,
        },
    };
    let mut machine = QueueStateMachine::new();
    let mut outcomes = Vec::new();
    machine.apply(1, Batch { now_ms: 1, commands: vec![named("a"), named("b"), named("a")] }, &mut outcomes);
    let ids: Vec<u64> = results(&outcomes)
        .iter()
        .map(|result| match result {
            CommandResult::Declared { queue } => *queue,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_ne!(ids[0], ids[1]);
    assert_eq!(ids[0], ids[2], "a second declaration of a name answers with the queue that exists");
    let first = ids[0];
    outcomes.clear();
    let delete = ProposedCommand { queue: first, proposer: 9, sequence: 0, command: QueueCommand::Delete };
    machine.apply(2, Batch { now_ms: 1, commands: vec![delete, named("a")] }, &mut outcomes);
    let again = match &results(&outcomes)[1] {
        CommandResult::Declared { queue } => *queue,
        other => panic!("{other:?}"),
    };
    assert_ne!(again, first, "a queue declared again after a delete never gets the old id");
    let restored = QueueStateMachine::decode_image(Bytes::from(machine.encode_image())).expect("decodes");
    assert_eq!(restored.queue_by_name(b"a"), Some((again, 0)));
    assert_eq!(restored.queue_by_name(b"b"), Some((ids[1], 0)));
}

/// Every node of a cluster proposes each declaration and deletion it applies, so a slow node's
/// declaration of a queue deleted since can commit after the name was declared again. Its
/// incarnation (the metadata log's order) keeps it off the later queue, whose messages its
/// deletion would otherwise take; a later incarnation replaces an earlier one still there.
#[test]
fn a_late_declaration_of_an_earlier_incarnation_never_answers_with_the_later_queue() {
    let declare = |proposer: u64, incarnation: u64| ProposedCommand {
        queue: 0,
        proposer,
        sequence: 0,
        command: QueueCommand::Declare {
            name: Bytes::from_static(b"/\0reborn"),
            incarnation,
            limits: queue_core::Limits::NONE,
            single_active_consumer: false,
        },
    };
    let declared = |outcomes: &[Outcome]| match results(outcomes).last() {
        Some(CommandResult::Declared { queue }) => *queue,
        other => panic!("{other:?}"),
    };
    let mut machine = QueueStateMachine::new();
    let mut outcomes = Vec::new();
    machine.apply(1, Batch { now_ms: 1, commands: vec![declare(2, 10)] }, &mut outcomes);
    let first = declared(&outcomes);
    let delete = |queue: u64| ProposedCommand { queue, proposer: 2, sequence: 0, command: QueueCommand::Delete };
    machine.apply(2, Batch { now_ms: 1, commands: vec![delete(first), declare(2, 20)] }, &mut outcomes);
    let second = declared(&outcomes);
    let enqueue = ProposedCommand { queue: second, proposer: 2, sequence: 0, command: enqueue("kept", None) };
    machine.apply(3, Batch { now_ms: 1, commands: vec![enqueue] }, &mut outcomes);

    // The slow node's declaration of incarnation 10, then its own copy of incarnation 20.
    outcomes.clear();
    machine.apply(4, Batch { now_ms: 1, commands: vec![declare(1, 10), declare(1, 20)] }, &mut outcomes);
    assert_eq!(results(&outcomes), vec![CommandResult::Superseded, CommandResult::Declared { queue: second }]);
    assert_eq!(machine.queue(second).map(|core| core.messages().ready_count()), Some(1));

    // Incarnation 30 declared while 20's deletion is not committed yet: 30 replaces it.
    outcomes.clear();
    machine.apply(5, Batch { now_ms: 1, commands: vec![declare(1, 30), delete(second)] }, &mut outcomes);
    let third = match &results(&outcomes)[..] {
        [CommandResult::Declared { queue }, CommandResult::NoSuchQueue] => *queue,
        other => panic!("{other:?}"),
    };
    assert_ne!(third, second);
    assert!(machine.queue(second).is_none());
    assert_eq!(machine.queue(third).map(|core| core.messages().ready_count()), Some(0));
    let restored = QueueStateMachine::decode_image(Bytes::from(machine.encode_image())).expect("decodes");
    assert_eq!(restored.queue_by_name(b"/\0reborn"), Some((third, 30)));
}

/// basic.get hands the message to its proposer, which holds it; a reject drops it (the dead-letter
/// outcome) and releasing a node gives back what its consumers and gets held, redelivered.
#[test]
fn releasing_a_node_cancels_its_consumers_and_requeues_what_they_and_its_gets_held() {
    let from = |proposer: u64, command: QueueCommand| ProposedCommand { queue: 1, proposer, sequence: 0, command };
    let mut machine = QueueStateMachine::new();
    let mut outcomes = Vec::new();
    let setup = vec![
        from(1, declare()),
        from(1, QueueCommand::RegisterProposer { node: 10 }),
        from(2, QueueCommand::RegisterProposer { node: 20 }),
        from(1, enqueue("a", None)),
        from(1, enqueue("b", None)),
        from(1, enqueue("c", None)),
        from(1, QueueCommand::Get { no_ack: false }),
        from(1, QueueCommand::AddConsumer { consumer: 7, priority: 0, prefetch: 1 }),
        from(2, QueueCommand::Get { no_ack: false }),
    ];
    machine.apply(1, Batch { now_ms: 1, commands: setup }, &mut outcomes);
    let got: Vec<u64> = results(&outcomes)
        .iter()
        .filter_map(|result| match result {
            CommandResult::Got { position, .. } => Some(*position),
            _ => None,
        })
        .collect();
    assert_eq!(got, vec![0, 2]);
    let delivered: Vec<(u64, u64, u64)> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Outcome::Delivered { owner, consumer, position, .. } => Some((*owner, *consumer, *position)),
            _ => None,
        })
        .collect();
    assert_eq!(delivered, vec![(1, 7, 1)], "the consumer's delivery names its owner and the owner's name for it");
    outcomes.clear();
    machine.apply(2, Batch { now_ms: 2, commands: vec![from(2, QueueCommand::Reject { position: 2 })] }, &mut outcomes);
    assert!(outcomes
        .iter()
        .any(|outcome| matches!(outcome, Outcome::Dropped { position: 2, reason: queue_core::DeadLetterReason::Rejected, .. })));
    // Node 10 restarted as proposer 3: proposer 1's consumer and get go, their messages come back.
    outcomes.clear();
    let restart = vec![from(3, QueueCommand::RegisterProposer { node: 10 }), from(3, QueueCommand::ReleaseNode { node: 10, keep: 3 })];
    machine.apply(3, Batch { now_ms: 3, commands: restart }, &mut outcomes);
    let core = machine.queue(1).expect("declared");
    assert_eq!(core.messages().ready_count(), 2);
    assert_eq!(core.messages().unacked_count(), 0);
    assert_eq!(core.consumer_ids().count(), 0);
    assert!(!machine.proposer_holds_anything(1));
    outcomes.clear();
    machine.apply(4, Batch { now_ms: 4, commands: vec![from(1, enqueue("late", None))] }, &mut outcomes);
    assert_eq!(results(&outcomes), vec![CommandResult::Retired], "a released proposer's late command is refused");
    let restored = QueueStateMachine::decode_image(Bytes::from(machine.encode_image())).expect("decodes");
    assert_eq!(restored.encode_image(), machine.encode_image());
}

/// A queue that dead-letters at least once (reject-publish, as RabbitMQ requires) with a length limit.
fn at_least_once(max_length: u64, at_least_once: bool) -> queue_core::Limits {
    queue_core::Limits {
        max_length: Some(max_length),
        overflow: queue_core::Overflow::RejectPublish,
        dead_letters: true,
        dead_letter_at_least_once: at_least_once,
        ..queue_core::Limits::NONE
    }
}

fn dropped(outcomes: &[Outcome]) -> Vec<(u64, bool)> {
    outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Outcome::Dropped { position, held, .. } => Some((*position, *held)),
            _ => None,
        })
        .collect()
}

#[test]
fn at_least_once_dead_letters_stay_until_settled_count_toward_the_limit_and_survive_a_snapshot() {
    let declare =
        QueueCommand::Declare { name: Bytes::new(), incarnation: 0, limits: at_least_once(2, true), single_active_consumer: false };
    let mut machine = QueueStateMachine::new();
    let mut outcomes = Vec::new();
    let get = QueueCommand::Get { no_ack: false };
    machine.apply(1, batch(1_000, vec![declare, enqueue("a", None), enqueue("b", None), get.clone(), get]), &mut outcomes);
    outcomes.clear();
    machine.apply(2, batch(1_001, vec![QueueCommand::Reject { position: 0 }, QueueCommand::Reject { position: 1 }]), &mut outcomes);
    assert_eq!(dropped(&outcomes), vec![(0, true), (1, true)]);
    let held = machine.held_dead_letters(1).expect("declared");
    assert_eq!((held.len(), held.payload_bytes()), (2, 2));
    // Two held letters fill a queue of two: reject-publish refuses while it is over the limit (the
    // third message is taken, as RabbitMQ takes it, the fourth refused).
    outcomes.clear();
    machine.apply(3, batch(1_002, vec![enqueue("c", None), enqueue("d", None)]), &mut outcomes);
    assert_eq!(results(&outcomes), vec![CommandResult::Core(queue_core::Reply::Ok), CommandResult::Core(queue_core::Reply::Rejected)]);
    let restored = QueueStateMachine::decode_image(Bytes::from(machine.encode_image())).expect("decodes");
    assert_eq!(restored.encode_image(), machine.encode_image());
    assert_eq!(restored.held_dead_letters(1).map(|held| held.len()), Some(2), "a snapshot keeps the held letters");
    outcomes.clear();
    machine.apply(4, batch(1_003, vec![enqueue("e", None)]), &mut outcomes);
    assert_eq!(results(&outcomes), vec![CommandResult::Core(queue_core::Reply::Rejected)], "one ready and two held: over 2");
    outcomes.clear();
    let settles = vec![QueueCommand::SettleDeadLetter { position: 0 }, QueueCommand::SettleDeadLetter { position: 1 }, enqueue("f", None)];
    machine.apply(5, batch(1_004, settles), &mut outcomes);
    assert_eq!(results(&outcomes)[2], CommandResult::Core(queue_core::Reply::Ok), "settled letters no longer count");
    assert!(machine.held_dead_letters(1).is_some_and(|held| held.is_empty()));
}

#[test]
fn without_at_least_once_drops_are_not_held_and_a_strategy_change_releases_the_held_ones() {
    let declare =
        QueueCommand::Declare { name: Bytes::new(), incarnation: 0, limits: at_least_once(10, false), single_active_consumer: false };
    let mut machine = QueueStateMachine::new();
    let mut outcomes = Vec::new();
    let get = QueueCommand::Get { no_ack: false };
    machine.apply(1, batch(1_000, vec![declare, enqueue("a", None), enqueue("b", None), get.clone(), get]), &mut outcomes);
    outcomes.clear();
    machine.apply(2, batch(1_001, vec![QueueCommand::Reject { position: 0 }]), &mut outcomes);
    assert_eq!(dropped(&outcomes), vec![(0, false)], "at most once: nothing kept");
    outcomes.clear();
    let limits = at_least_once(10, true);
    machine.apply(3, batch(1_002, vec![QueueCommand::SetLimits { limits }, QueueCommand::Reject { position: 1 }]), &mut outcomes);
    assert_eq!(dropped(&outcomes), vec![(1, true)]);
    outcomes.clear();
    // Drop-head makes at least once ineffective (RabbitMQ falls back to at most once): the held
    // letter leaves at most once.
    let limits = queue_core::Limits { overflow: queue_core::Overflow::DropHead, ..at_least_once(10, true) };
    machine.apply(4, batch(1_003, vec![QueueCommand::SetLimits { limits }]), &mut outcomes);
    assert_eq!(dropped(&outcomes), vec![(1, false)]);
    assert!(machine.held_dead_letters(1).is_some_and(|held| held.is_empty()));
}

#[test]
fn the_single_active_consumer_is_named_by_its_proposer_and_its_name_there() {
    let declare_single_active =
        || QueueCommand::Declare { name: Bytes::new(), incarnation: 0, limits: queue_core::Limits::NONE, single_active_consumer: true };
    let add = |consumer| QueueCommand::AddConsumer { consumer, priority: 0, prefetch: 1 };
    let (machine, _) = replay(&[batch(1_000, vec![declare_single_active(), add(5), add(6)])]);
    assert_eq!(machine.single_active_consumer(1), Some((9, 5)), "the first consumer is the active one");
    let (machine, _) = replay(&[
        batch(1_000, vec![declare_single_active(), add(5), add(6)]),
        batch(1_010, vec![QueueCommand::CancelConsumer { consumer: 5 }]),
    ]);
    assert_eq!(machine.single_active_consumer(1), Some((9, 6)), "the next one takes over");
    let (machine, _) = replay(&[batch(1_000, vec![declare(), add(5)])]);
    assert_eq!(machine.single_active_consumer(1), None, "no single active consumer without the argument");
    assert_eq!(machine.single_active_consumer(2), None, "no such queue");
}

fn keyed(body: &'static str, key: &'static str, ttl_ms: Option<u64>) -> QueueCommand {
    let deduplication = Some(DeduplicationKey { key: Bytes::from_static(key.as_bytes()), ttl_ms, cache_size: 2 });
    QueueCommand::Enqueue { persistent: true, own_ttl_ms: None, body: Bytes::from_static(body.as_bytes()), deduplication }
}

#[test]
fn a_deduplicated_key_is_enqueued_once_on_every_replica_and_through_a_snapshot() {
    let batches = vec![
        batch(1_000, vec![declare(), keyed("a1", "a", Some(300)), keyed("a2", "a", None), keyed("b1", "b", None)]),
        // 300 ms on by the batch's clock "a" stopped counting and is enqueued again; the cache
        // holds 2 keys, so recording "c" evicts the oldest inserted ("b"), which then gets in.
        batch(1_300, vec![keyed("a3", "a", None), keyed("c1", "c", None), keyed("b2", "b", None), enqueue("plain", None)]),
    ];
    let (first, outcomes) = replay(&batches);
    let (second, _) = replay(&batches);
    assert_eq!(first.encode_image(), second.encode_image(), "replicas agree, cache included");
    let duplicate = CommandResult::DuplicateMessage;
    let committed = results(&outcomes);
    assert_eq!(committed[2], duplicate, "{committed:?}");
    assert_eq!(committed.iter().filter(|result| **result == duplicate).count(), 1, "{committed:?}");
    let queue = first.queue(1).expect("declared");
    assert_eq!(queue.messages().ready_count(), 6, "a1, b1, a3, c1, b2 (b evicted by c), plain");
    assert_eq!(first.deduplication(1).map(|cache| cache.duplicates()), Some(1));

    // A replica restored from a snapshot deduplicates as the original does from then on.
    let mut restored = QueueStateMachine::decode_image(Bytes::from(first.encode_image())).expect("decodes");
    assert_eq!(restored.encode_image(), first.encode_image());
    let mut original = first;
    let next = batch(1_400, vec![keyed("b3", "b", None), keyed("c2", "c", None), keyed("a4", "a", None)]);
    let (mut from_original, mut from_restored) = (Vec::new(), Vec::new());
    original.apply(3, next.clone(), &mut from_original);
    restored.apply(3, next, &mut from_restored);
    assert_eq!(from_original, from_restored);
    assert_eq!(results(&from_original), vec![duplicate.clone(), duplicate, CommandResult::Core(queue_core::Reply::Ok)]);
}

#[test]
fn held_delayed_messages_are_the_same_on_every_replica_and_through_a_snapshot_until_released() {
    let hold = |due_ms: u64, body: &'static str| QueueCommand::HoldDelayed { due_ms, origin: 2, body: Bytes::from_static(body.as_bytes()) };
    let batches = vec![batch(1_000, vec![declare(), hold(5_000, "late"), hold(3_000, "early")])];
    let (mut machine, outcomes) = replay(&batches);
    assert!(results(&outcomes)
        .iter()
        .all(|result| matches!(result, CommandResult::Declared { .. } | CommandResult::Core(queue_core::Reply::Ok))));
    let (again, _) = replay(&batches);
    assert_eq!(machine.encode_image(), again.encode_image());
    let held: Vec<(u64, Bytes)> = machine.delayed(1).expect("held").in_due_order().map(|(id, entry)| (id, entry.body.clone())).collect();
    assert_eq!(held.iter().map(|(_, body)| body.as_ref()).collect::<Vec<_>>(), [b"early".as_ref(), b"late"]);
    assert_eq!(machine.queue(1).expect("declared").messages().ready_count(), 0, "held back, not enqueued");
    let mut restored = QueueStateMachine::decode_image(Bytes::from(machine.encode_image())).expect("decodes");
    assert_eq!(restored.encode_image(), machine.encode_image());
    let release = batch(1_100, vec![QueueCommand::ReleaseDelayed { id: held[0].0 }]);
    for replica in [&mut machine, &mut restored] {
        replica.apply(2, release.clone(), &mut Vec::new());
        let left: Vec<u64> = replica.delayed(1).expect("held").in_due_order().map(|(id, _)| id).collect();
        assert_eq!(left, [held[1].0]);
    }
    assert_eq!(machine.encode_image(), restored.encode_image());
}

#[test]
fn a_duplicate_to_a_full_reject_publish_queue_is_confirmed_not_refused() {
    let limits = queue_core::Limits { max_length: Some(1), overflow: queue_core::Overflow::RejectPublish, ..queue_core::Limits::NONE };
    let full = QueueCommand::Declare { name: Bytes::new(), incarnation: 0, limits, single_active_consumer: false };
    // RabbitMQ's quorum rule: over the limit only once it holds more than one, so "a" and "b" get in.
    let batches =
        vec![batch(1_000, vec![full, keyed("a1", "a", None), keyed("b1", "b", None), keyed("c1", "c", None), keyed("a2", "a", None)])];
    let (_, outcomes) = replay(&batches);
    let committed = results(&outcomes);
    assert_eq!(committed[3], CommandResult::Core(queue_core::Reply::Rejected), "{committed:?}");
    assert_eq!(committed[4], CommandResult::DuplicateMessage, "a duplicate is answered before the limit: {committed:?}");
}
