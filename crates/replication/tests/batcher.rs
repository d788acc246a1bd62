//! The proposing side: windows cut into batches within their bounds, and a retry after a lost
//! leadership applies every command exactly once.

use bytes::Bytes;
use replication::batcher::{Batcher, BatcherError};
use replication::command::{QueueCommand, BATCH_COMMANDS_MAX};
use replication::state_machine::{CommandResult, QueueStateMachine};

/// A declaration without a name or limits.
fn declare() -> QueueCommand {
    QueueCommand::Declare { name: bytes::Bytes::new(), incarnation: 0, limits: queue_core::Limits::NONE, single_active_consumer: false }
}

fn enqueue(bytes: usize) -> QueueCommand {
    QueueCommand::Enqueue { persistent: true, own_ttl_ms: None, body: Bytes::from(vec![7u8; bytes]), deduplication: None }
}

#[test]
fn a_window_is_cut_into_batches_within_their_bounds() {
    let mut batcher = Batcher::new(1, 64 * 1024, 100_000);
    for _ in 0..(BATCH_COMMANDS_MAX + 10) {
        batcher.push(1, enqueue(1)).expect("room");
    }
    let batches = batcher.cut(5);
    assert_eq!(batches.iter().map(|batch| batch.commands.len()).sum::<usize>(), BATCH_COMMANDS_MAX + 10);
    assert!(batches.iter().all(|batch| batch.commands.len() <= BATCH_COMMANDS_MAX && batch.now_ms == 5));
    for _ in 0..10 {
        batcher.push(1, enqueue(20_000)).expect("room");
    }
    let batches = batcher.cut(6);
    assert!(batches.len() >= 4, "10 bodies of 20 kB do not fit in one 64 kB batch");
    let sequences: Vec<u64> = batches.iter().flat_map(|batch| batch.commands.iter().map(|command| command.sequence)).collect();
    assert!(sequences.windows(2).all(|pair| pair[1] == pair[0] + 1), "numbers in proposal order");
}

#[test]
fn past_the_unconfirmed_bound_commands_are_refused() {
    let mut batcher = Batcher::new(1, 64 * 1024, 3);
    for _ in 0..3 {
        batcher.push(1, enqueue(1)).expect("room");
    }
    assert_eq!(batcher.push(1, enqueue(1)), Err(BatcherError::Full(3)));
}

/// A leader committed the first batch but lost its leadership before the confirms reached the
/// proposer, and the second batch was lost with it: the proposer retries everything unconfirmed;
/// the committed ones answer `Duplicate`, the lost ones are applied, each message once.
#[test]
fn a_retry_after_a_lost_leader_applies_every_command_once() {
    let mut batcher = Batcher::new(4, 100, 1_000);
    let mut machine = QueueStateMachine::new();
    let mut outcomes = Vec::new();
    let declare = batcher.push(1, declare()).expect("room");
    for _ in 0..6 {
        batcher.push(1, enqueue(30)).expect("room");
    }
    let batches = batcher.cut(1);
    assert!(batches.len() >= 2, "{} batches", batches.len());
    let mut index = 0;
    // The second and later batches were in entries the new leader overwrote.
    for batch in &batches[..1] {
        index += 1;
        machine.apply(index, batch.clone(), &mut outcomes);
    }
    outcomes.clear();
    for batch in batcher.retry(2) {
        index += 1;
        machine.apply(index, batch, &mut outcomes);
    }
    let confirmed = batcher.confirm(&outcomes);
    assert_eq!(confirmed.len(), 7, "every command confirmed after the retry");
    assert_eq!(confirmed.iter().find(|(sequence, _)| *sequence == declare).map(|(_, result)| result), Some(&CommandResult::Duplicate));
    assert_eq!(batcher.unconfirmed_count(), 0);
    assert_eq!(machine.queue(1).expect("declared").stats().published, 6);
}

/// Confirms in any order (a confirm seen twice, one past the front) each confirm their command
/// once, and the rest stay unconfirmed, retried in number order.
#[test]
fn confirms_out_of_order_are_taken_once_and_the_rest_retried_in_order() {
    let mut batcher = Batcher::new(9, 64 * 1024, 1_000);
    for _ in 0..5 {
        batcher.push(1, enqueue(1)).expect("room");
    }
    let _ = batcher.cut(1);
    let committed = |sequence: u64| replication::state_machine::Outcome::Committed {
        index: 1,
        queue: 1,
        proposer: 9,
        sequence,
        result: CommandResult::Touched,
    };
    let confirmed = batcher.confirm(&[committed(3), committed(1), committed(3), committed(5)]);
    assert_eq!(confirmed.iter().map(|(sequence, _)| *sequence).collect::<Vec<_>>(), vec![3, 1, 5]);
    assert_eq!(batcher.unconfirmed_count(), 2);
    let retried: Vec<u64> = batcher.retry(2).iter().flat_map(|batch| batch.commands.iter().map(|command| command.sequence)).collect();
    assert_eq!(retried, vec![2, 4]);
}
