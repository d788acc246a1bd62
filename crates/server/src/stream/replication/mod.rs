//! Stream queues replicated across the cluster's members (docs/streams.md, "Replication"), as
//! RabbitMQ's osiris replicates them: one member leads a stream and takes its publishes; the
//! others copy its chunks byte for byte ([`storage::stream`]'s replication seam) and serve
//! their own readers from their copy.
//!
//! - A follower pulls: it sends its leader a [`wire::Fetch`] naming the end of its log and how
//!   far it has fdatasynced, and the leader answers with the chunks that follow and the
//!   cluster's commit offset ([`wire::Data`]). The leader commits what a majority of the
//!   members has synced, counting only once a chunk of its own epoch is among it (Raft's rule,
//!   so a chunk of an earlier leader that a later one may still cut is never confirmed by
//!   counting); a publisher is confirmed once its message is committed.
//! - Who leads is the metadata group's (Raft) decision, with an epoch that grows at each
//!   change: a stream's first leader is the node that declared it. A follower that hears
//!   nothing from its leader for [`LEADER_SILENCE_MS`] runs an election ([`worker`]): it asks
//!   the members for the ends of their logs, fencing each at the new epoch (a fenced member
//!   no longer takes chunks from, nor acknowledges to, an older leader), and with a majority's
//!   answers proposes the member whose log is the most up to date (last epoch, then length).
//!   Any committed chunk is on a majority, which meets the majority that answered, so the new
//!   leader holds it. A member whose log goes past the new leader's cuts it where their epochs
//!   part (Kafka's leader-epoch rule) before it takes the leader's chunks.
//! - One thread per replicated stream on each member runs its role: [`worker`].

mod forwarded;
pub mod marks;
pub mod wire;
mod worker;

use crate::quorum::tickets::{CommitSlot, SlotOutcome};
use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;
use storage::stream::{Stream, StreamTail};
use storage::syncer::Syncer;
pub use wire::{ForwardedEntries, ForwardedEntry, ReplicaMessage, StoredOffset, StreamKey, STREAM_REPLICATION_CHANNEL};

/// How long a follower waits without a word from its leader before it runs an election (a
/// leader answers a waiting fetch at least every [`worker::HEARTBEAT_MS`]).
pub const LEADER_SILENCE_MS: u64 = 3_000;

/// A publish forwarded to the leader is nacked when no answer came in this long.
pub const FORWARD_TIMEOUT_MS: u64 = 30_000;

/// How long an election waits for each member's answer.
pub const TAIL_QUESTION_TIMEOUT_MS: u64 = 1_000;

/// Events a stream's worker holds before the links' own are dropped (a follower fetches again,
/// a leader answers the next fetch): 1,024.
const EVENTS_MAX: usize = 1_024;

/// Publishes waiting for their commit on one stream; past it publishes are refused (nacked):
/// 1,000,000, about 40 MB of waiters.
const WAITERS_MAX: usize = 1_000_000;

/// Who leads a stream and which members hold it, as the metadata group decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leadership {
    /// Grows with every change of leader; the leader writes its chunks with it.
    pub epoch: u64,
    /// The leader's node id.
    pub leader: u64,
    /// The members' node ids (the leader among them).
    pub members: Vec<u64>,
}

/// What replication needs of the cluster.
pub trait ReplicaTransport: Send + Sync + 'static {
    /// This node's id.
    fn node_id(&self) -> u64;
    /// Queues a message for node `to`; false when it cannot (no link, its queue full).
    fn send(&self, to: u64, message: Bytes) -> bool;
    /// Asks node `to` for the end of its copy of `key`, fencing it at `epoch`; `None` when it
    /// does not answer in time.
    fn ask_tail(&self, to: u64, key: &StreamKey, epoch: u64) -> Option<StreamTail>;
    /// Proposes a new leadership to the metadata group; returns once applied here.
    fn propose_leadership(&self, key: &StreamKey, leadership: Leadership) -> Result<(), String>;
}

/// What the worker is told.
pub(crate) enum Event {
    /// The metadata group's decision; `live` is false while the metadata log is replayed at
    /// start (a leadership naming this node then is an old one: it must not lead in it).
    Leadership(Leadership, bool),
    /// A message from another member.
    Message(u64, ReplicaMessage),
    /// This node's appends were fdatasynced.
    Synced,
    /// The stream is gone.
    Stop,
}

/// What a publish waits for.
pub enum CommitWaiter {
    /// An AMQP publisher's confirm.
    Slot(Arc<CommitSlot>),
    /// A stream protocol publisher's confirm (true: committed).
    Callback(Box<dyn FnOnce(bool) + Send>),
}

impl CommitWaiter {
    fn settle(self, committed: bool) {
        match self {
            CommitWaiter::Slot(slot) => {
                let outcome = if committed { SlotOutcome::Accepted } else { SlotOutcome::Failed };
                if let Some(gate) = slot.fill(outcome) {
                    gate.wake();
                }
            }
            CommitWaiter::Callback(callback) => callback(committed),
        }
    }
}

/// What this node does for the stream now, as publishers see it.
#[derive(Debug, Clone, Copy, Default)]
struct View {
    /// The epoch it leads in, when it leads.
    leading: Option<u64>,
    /// The leader's node id.
    leader: u64,
    /// The highest epoch it was fenced at by an election.
    fence: u64,
}

/// One replicated stream on this node.
pub struct StreamReplication {
    key: StreamKey,
    stream: Arc<Stream>,
    transport: Arc<dyn ReplicaTransport>,
    syncer: Syncer,
    events: SyncSender<Event>,
    view: Mutex<View>,
    /// Publishes waiting for their commit: the offset after the message, its epoch, the waiter.
    waiters: Mutex<VecDeque<(u64, u64, CommitWaiter)>>,
    sync_requested: AtomicBool,
    fence_path: PathBuf,
    commit_path: PathBuf,
    /// Publishes forwarded to the leader, by request number, until it answers.
    forwarded: Mutex<HashMap<u64, (Instant, CommitWaiter)>>,
    next_request: AtomicU64,
}

impl std::fmt::Debug for StreamReplication {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("StreamReplication").field("key", &self.key).finish_non_exhaustive()
    }
}

impl StreamReplication {
    /// Starts replicating `stream` (opened, with replication enabled, not written to yet) under
    /// `leadership`, with its worker thread; its marks ([`marks`]) are beside the stream's
    /// directory.
    pub fn start(
        key: StreamKey,
        stream: Arc<Stream>,
        transport: Arc<dyn ReplicaTransport>,
        syncer: Syncer,
        leadership: Leadership,
        live: bool,
    ) -> std::io::Result<Arc<StreamReplication>> {
        let (fence_path, commit_path) = marks::paths(stream.directory());
        let fence = marks::read_fence(&fence_path);
        stream.set_writable(false);
        let (events, inbox) = sync_channel(EVENTS_MAX);
        let replication = Arc::new(StreamReplication {
            key,
            stream,
            transport,
            syncer,
            events,
            view: Mutex::new(View { leading: None, leader: leadership.leader, fence }),
            waiters: Mutex::new(VecDeque::new()),
            sync_requested: AtomicBool::new(false),
            fence_path,
            commit_path,
            forwarded: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
        });
        let name = format!("stream-replica-{}", replication.key.name.chars().take(20).collect::<String>());
        let worker = worker::Worker::new(replication.clone(), inbox, leadership, live);
        std::thread::Builder::new().name(name).spawn(move || worker.run())?;
        Ok(replication)
    }

    /// The metadata group decided a leadership (`live`: not a replay at start).
    pub fn set_leadership(&self, leadership: Leadership, live: bool) {
        let changed = std::mem::replace(&mut self.view.lock().leader, leadership.leader) != leadership.leader;
        if changed {
            // Their fate at the old leader is unknown: nacked, the publishers send them again.
            self.fail_forwarded(|_| true);
        }
        self.tell(Event::Leadership(leadership, live));
    }

    /// A message from member `from`.
    pub fn receive(&self, from: u64, message: ReplicaMessage) {
        match message {
            ReplicaMessage::Published(_, outcome) => {
                let waiter = self.forwarded.lock().remove(&outcome.request);
                if let Some((_, waiter)) = waiter {
                    waiter.settle(outcome.committed);
                }
            }
            message => self.tell(Event::Message(from, message)),
        }
    }

    /// A publish to a member that does not lead the stream: the record goes to the leader,
    /// which appends it and answers once it is committed (or not).
    pub fn forward(&self, record: bytes::Bytes, waiter: CommitWaiter) {
        self.forward_with(waiter, |key, request| ReplicaMessage::Publish(key, wire::Forwarded { request, records: vec![record] }));
    }

    /// A stream-protocol publish to a member that does not lead: forwarded whole to the leader,
    /// which deduplicates, appends and answers once it is committed (or not).
    pub fn forward_entries(&self, reference: Option<Bytes>, entries: Vec<ForwardedEntry>, data: Bytes, waiter: CommitWaiter) {
        self.forward_with(waiter, |key, request| {
            ReplicaMessage::PublishEntries(key, ForwardedEntries { request, reference, entries, data })
        });
    }

    /// A consumer's offset stored through a member that does not lead: written by the leader
    /// (false when it could not be sent; the protocol has no answer to give).
    pub fn forward_stored_offset(&self, reference: Bytes, offset: u64) -> bool {
        let message = ReplicaMessage::StoreOffset(self.key.clone(), StoredOffset { reference, offset });
        self.transport.send(self.leader(), message.encode())
    }

    /// Sends the message `build` makes under a new request number to the leader; `waiter` is
    /// settled by its answer, or failed now when there is no leader to send it to.
    fn forward_with(&self, waiter: CommitWaiter, build: impl FnOnce(StreamKey, u64) -> ReplicaMessage) {
        let leader = self.leader();
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        {
            let mut forwarded = self.forwarded.lock();
            if leader == self.transport.node_id() || forwarded.len() >= WAITERS_MAX {
                drop(forwarded);
                return waiter.settle(false);
            }
            forwarded.insert(request, (Instant::now(), waiter));
        }
        if !self.transport.send(leader, build(self.key.clone(), request).encode()) {
            self.fail_forwarded(|number| number == request);
        }
    }

    /// Nacks the forwarded publishes `doomed` names by request number.
    fn fail_forwarded(&self, doomed: impl Fn(u64) -> bool) {
        let failed: Vec<CommitWaiter> = {
            let mut forwarded = self.forwarded.lock();
            let numbers: Vec<u64> = forwarded.keys().copied().filter(|number| doomed(*number)).collect();
            numbers.into_iter().filter_map(|number| forwarded.remove(&number)).map(|(_, waiter)| waiter).collect()
        };
        for waiter in failed {
            waiter.settle(false);
        }
    }

    /// Nacks the forwarded publishes the leader did not answer in [`FORWARD_TIMEOUT_MS`].
    fn expire_forwarded(&self) {
        let timeout = std::time::Duration::from_millis(FORWARD_TIMEOUT_MS);
        let expired: Vec<u64> = {
            let forwarded = self.forwarded.lock();
            forwarded.iter().filter(|(_, (sent_at, _))| sent_at.elapsed() >= timeout).map(|(number, _)| *number).collect()
        };
        if !expired.is_empty() {
            tracing::warn!(stream = %self.key.name, publishes = expired.len(), "the leader did not answer forwarded publishes: nacked");
            self.fail_forwarded(|number| expired.contains(&number));
        }
    }

    /// The stream is gone: the worker stops and publishes still waiting are nacked.
    pub fn stop(&self) {
        self.tell(Event::Stop);
        self.fail_waiters();
        self.fail_forwarded(|_| true);
    }

    fn tell(&self, event: Event) {
        match self.events.try_send(event) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => tracing::warn!(stream = %self.key.name, "stream replication events full; one dropped"),
        }
    }

    /// The epoch this node leads the stream in, if it does (publishes are taken only then).
    pub fn leading_epoch(&self) -> Option<u64> {
        self.view.lock().leading
    }

    /// The node that leads the stream, as this node knows it.
    pub fn leader(&self) -> u64 {
        self.view.lock().leader
    }

    /// An election asks for the end of this copy: fenced at `epoch` from now on (kept on disk
    /// first), so no older leader gets another acknowledgement from it.
    pub fn answer_tail(&self, epoch: u64) -> Result<StreamTail, String> {
        let mut view = self.view.lock();
        if epoch > view.fence {
            marks::write_fence(&self.fence_path, epoch).map_err(|error| format!("could not keep the fence: {error}"))?;
            view.fence = epoch;
            if view.leading.is_some_and(|leading| leading < epoch) {
                // Replaced soon: its publishes could no longer be committed.
                view.leading = None;
                self.stream.set_writable(false);
            }
        }
        Ok(self.stream.tail())
    }

    fn fence(&self) -> u64 {
        self.view.lock().fence
    }

    /// Asks the syncer to write and fdatasync this node's appends, once for however many came
    /// meanwhile; the worker hears when it is done.
    pub fn request_sync(self: &Arc<Self>) {
        if self.sync_requested.swap(true, Ordering::AcqRel) {
            return;
        }
        let replication = self.clone();
        let callback = Box::new(move |_synced: bool| {
            replication.sync_requested.store(false, Ordering::Release);
            if replication.stream.has_pending() {
                replication.request_sync();
            }
            replication.tell(Event::Synced);
        });
        self.syncer.sync_with_streams(Vec::new(), vec![self.stream.clone()], Some(callback));
    }

    /// A publish appended in `epoch`, ending before `next_offset`, waits for its commit (settled
    /// at once if it is committed already, failed if this node no longer leads in `epoch`).
    pub fn when_committed(&self, next_offset: u64, epoch: u64, waiter: CommitWaiter) {
        let settled = {
            let mut waiters = self.waiters.lock();
            if self.leading_epoch() != Some(epoch) || waiters.len() >= WAITERS_MAX {
                Some((waiter, false))
            } else if self.stream.committed().next_offset >= next_offset {
                Some((waiter, true))
            } else {
                waiters.push_back((next_offset, epoch, waiter));
                None
            }
        };
        if let Some((waiter, committed)) = settled {
            waiter.settle(committed);
        }
    }

    /// The stream is readable below `next_offset`: the publishes it covers are confirmed.
    pub fn release_waiters(&self, next_offset: u64) {
        let leading = self.leading_epoch();
        let mut released = Vec::new();
        {
            let mut waiters = self.waiters.lock();
            while waiters.front().is_some_and(|(end, _, _)| *end <= next_offset) {
                if let Some(waiter) = waiters.pop_front() {
                    released.push(waiter);
                }
            }
        }
        for (_, epoch, waiter) in released {
            waiter.settle(leading == Some(epoch));
        }
    }

    /// Nacks every publish still waiting (this node stopped leading: they may or may not be
    /// committed, and a nack is what lets their publishers send them again).
    fn fail_waiters(&self) {
        let waiters: Vec<_> = self.waiters.lock().drain(..).collect();
        for (_, _, waiter) in waiters {
            waiter.settle(false);
        }
    }
}
