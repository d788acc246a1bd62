//! The thread that runs one replicated stream's role on this node: as leader it answers its
//! followers' fetches and commits what a majority synced; as follower it fetches, copies,
//! syncs and acknowledges, and runs an election when its leader falls silent.

use super::wire::{Data, Fetch, ReplicaMessage, DATA_BYTES_MAX};
use super::{Event, Leadership, StreamReplication, LEADER_SILENCE_MS};
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use storage::stream::{now_ms, StreamError};

/// A leader answers a waiting fetch at least this often, with nothing new if need be: the
/// follower hears it is alive, and learns the commit offset.
pub const HEARTBEAT_MS: u64 = 500;

/// How often the worker looks at its timers when nothing happens.
const TICK_MS: u64 = 50;

/// A follower fetches again when its last fetch got no answer for this long (lost on a link
/// that went down).
const FETCH_RETRY_MS: u64 = 1_000;

/// A follower that finds its leader silent asks once more and waits this long for an answer
/// before it runs an election.
const SUSPICION_MS: u64 = 500;

/// An election that did not complete is tried again after this long (plus up to as much at
/// random, so two members do not keep running theirs together).
const ELECTION_RETRY_MS: u64 = 1_000;

/// The tracking reference a new leader stores its epoch under when it inherits chunks not known
/// committed: its first chunk of its own, so they are committed without waiting for a publish.
const LEADER_MARK: &[u8] = b"lepus-stream-leader-epoch";

/// What the leader knows of one follower.
#[derive(Debug)]
struct FollowerProgress {
    /// Synced there, in agreement with this log: counts toward the commit.
    acknowledged: u64,
    /// Where its waiting fetch wants chunks from (none: no fetch waits).
    wanted: Option<u64>,
    /// Its log must be cut here first.
    truncate_to: Option<u64>,
    /// The commit offset it was last told.
    told_commit: u64,
    answered_at: Instant,
}

enum Role {
    Leader {
        epoch_start: u64,
        followers: HashMap<u64, FollowerProgress>,
    },
    Follower {
        last_heard: Instant,
        fetched_at: Option<Instant>,
        syncing: bool,
        election_at: Option<Instant>,
        /// When it found its leader silent and asked once more (a node that was paused finds
        /// every leader silent: it hears back at once and runs no election).
        suspect_since: Option<Instant>,
    },
}

pub(super) struct Worker {
    shared: Arc<StreamReplication>,
    inbox: Receiver<Event>,
    leadership: Leadership,
    role: Role,
    chunk: Vec<u8>,
    /// The commit offset last written to the stream's `.commit` mark, and when.
    commit_mark: (u64, Instant),
}

impl Worker {
    pub(super) fn new(shared: Arc<StreamReplication>, inbox: Receiver<Event>, leadership: Leadership, live: bool) -> Worker {
        let role = Role::Follower { last_heard: Instant::now(), fetched_at: None, syncing: false, election_at: None, suspect_since: None };
        let mut worker =
            Worker { shared, inbox, leadership: leadership.clone(), role, chunk: Vec::new(), commit_mark: (0, Instant::now()) };
        worker.follow(leadership, live);
        worker
    }

    pub(super) fn run(mut self) {
        loop {
            match self.inbox.recv_timeout(Duration::from_millis(TICK_MS)) {
                Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(Event::Leadership(leadership, live)) => self.follow(leadership, live),
                Ok(Event::Message(from, message)) => self.message(from, message),
                Ok(Event::Synced) => self.synced(),
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.tick();
        }
        self.shared.stream.set_writable(false);
        self.shared.view.lock().leading = None;
        self.shared.fail_waiters();
    }

    fn me(&self) -> u64 {
        self.shared.transport.node_id()
    }

    /// Takes the role a leadership gives this node. One naming this node while the metadata
    /// log is replayed at start is an epoch it may have lost writes of: it waits as a follower
    /// and, hearing no one, runs an election for a new epoch.
    fn follow(&mut self, leadership: Leadership, live: bool) {
        if leadership.epoch < self.leadership.epoch {
            return;
        }
        let was_leading = matches!(self.role, Role::Leader { .. });
        let same = leadership == self.leadership;
        self.leadership = leadership;
        if same && was_leading {
            return;
        }
        let me = self.me();
        if self.leadership.leader == me && live && self.shared.fence() <= self.leadership.epoch {
            self.lead();
            return;
        }
        if was_leading {
            self.step_down();
        }
        if !same || !matches!(self.role, Role::Follower { .. }) {
            self.role =
                Role::Follower { last_heard: Instant::now(), fetched_at: None, syncing: false, election_at: None, suspect_since: None };
        }
        if self.leadership.leader != me {
            self.fetch();
        }
    }

    fn lead(&mut self) {
        let stream = &self.shared.stream;
        let epoch = self.leadership.epoch;
        if let Err(error) = stream.set_epoch(epoch) {
            tracing::error!(stream = %self.shared.key.name, %error, "cannot lead the stream in this epoch");
            return;
        }
        let epoch_start = stream.tail().next_offset;
        stream.set_writable(true);
        // Only with an inherited tail not known committed: a new stream's offsets start at 0.
        if epoch_start > stream.committed().next_offset {
            if let Err(error) = stream.store_offset(LEADER_MARK, epoch, now_ms()) {
                tracing::warn!(stream = %self.shared.key.name, %error, "could not write the leader's first chunk");
            }
        }
        self.shared.view.lock().leading = Some(epoch);
        self.shared.request_sync();
        tracing::info!(stream = %self.shared.key.name, vhost = %self.shared.key.vhost, epoch, offset = epoch_start, "leading the stream");
        self.role = Role::Leader { epoch_start, followers: HashMap::new() };
    }

    fn step_down(&mut self) {
        self.shared.view.lock().leading = None;
        self.shared.stream.set_writable(false);
        self.shared.fail_waiters();
        tracing::info!(stream = %self.shared.key.name, leader = %format!("{:x}", self.leadership.leader), epoch = self.leadership.epoch,
            "no longer leading the stream");
    }

    fn message(&mut self, from: u64, message: ReplicaMessage) {
        match message {
            ReplicaMessage::Fetch(_, fetch) => self.fetched(from, fetch),
            ReplicaMessage::Data(_, data) => self.data(from, data),
            ReplicaMessage::Publish(_, forwarded) => self.shared.append_forwarded_records(from, forwarded),
            ReplicaMessage::PublishEntries(_, forwarded) => self.shared.append_forwarded_entries(from, forwarded),
            ReplicaMessage::StoreOffset(_, stored) => self.shared.store_forwarded_offset(stored),
            ReplicaMessage::Published(..) => {}
        }
    }

    fn synced(&mut self) {
        match &mut self.role {
            Role::Leader { .. } => {
                self.commit();
                self.answer_all();
            }
            Role::Follower { syncing, .. } => {
                if std::mem::take(syncing) {
                    self.fetch();
                }
            }
        }
    }

    fn tick(&mut self) {
        self.shared.expire_forwarded();
        self.mark_commit();
        match &self.role {
            Role::Leader { .. } => {
                self.commit();
                self.answer_all();
            }
            Role::Follower { last_heard, fetched_at, syncing, election_at, suspect_since } => {
                let silent = last_heard.elapsed() >= Duration::from_millis(LEADER_SILENCE_MS);
                let confirmed = suspect_since.is_some_and(|since| since.elapsed() >= Duration::from_millis(SUSPICION_MS));
                let election_due = election_at.is_none_or(|at| Instant::now() >= at);
                let member = self.leadership.members.contains(&self.me());
                if silent && suspect_since.is_none() {
                    if let Role::Follower { suspect_since, .. } = &mut self.role {
                        *suspect_since = Some(Instant::now());
                    }
                    self.fetch();
                } else if silent && confirmed && election_due && member {
                    self.elect();
                } else if !syncing && fetched_at.is_none_or(|at| at.elapsed() >= Duration::from_millis(FETCH_RETRY_MS)) {
                    self.fetch();
                }
            }
        }
    }

    /// Rewrites the `.commit` mark now and then, so a restart reads what it knew at once.
    fn mark_commit(&mut self) {
        let committed = self.shared.stream.committed().next_offset;
        let (written, at) = self.commit_mark;
        if committed <= written || at.elapsed() < Duration::from_millis(super::marks::COMMIT_MARK_INTERVAL_MS) {
            return;
        }
        if let Err(error) = super::marks::write_commit(&self.shared.commit_path, committed) {
            tracing::warn!(stream = %self.shared.key.name, %error, "could not write the stream's commit mark");
        }
        self.commit_mark = (committed, Instant::now());
    }

    /// Leader: a follower's fetch, which also acknowledges what it synced. A node that is not
    /// one of the members (it joined the cluster later) is served a copy too, as a learner: its
    /// acknowledgements count for nothing ([`Worker::commit`] counts the members').
    fn fetched(&mut self, from: u64, fetch: Fetch) {
        let fenced = self.shared.fence() > self.leadership.epoch;
        let Role::Leader { followers, .. } = &mut self.role else { return };
        if fenced || fetch.epoch > self.leadership.epoch {
            return;
        }
        let end = match self.shared.stream.epoch_end(fetch.tail_epoch) {
            Ok(end) => end,
            Err(error) => return tracing::error!(stream = %self.shared.key.name, %error, "reading the stream's epochs failed"),
        };
        let progress = followers.entry(from).or_insert(FollowerProgress {
            acknowledged: 0,
            wanted: None,
            truncate_to: None,
            told_commit: 0,
            answered_at: Instant::now(),
        });
        if fetch.tail_next > end {
            // Its log went on in an epoch this one does not have: cut it where they part.
            progress.truncate_to = Some(end);
            progress.wanted = Some(end);
        } else {
            progress.acknowledged = fetch.synced_next.min(fetch.tail_next);
            progress.truncate_to = None;
            progress.wanted = Some(fetch.tail_next);
        }
        self.commit();
        self.answer(from);
    }

    /// Leader: commits what a majority of the members synced, once that includes a chunk of
    /// this leader's own epoch.
    fn commit(&mut self) {
        if self.shared.fence() > self.leadership.epoch {
            return;
        }
        let Role::Leader { epoch_start, followers } = &self.role else { return };
        let me = self.me();
        let own = self.shared.stream.synced_next_offset();
        let mut synced: Vec<u64> = self
            .leadership
            .members
            .iter()
            .map(|member| if *member == me { own } else { followers.get(member).map_or(0, |progress| progress.acknowledged) })
            .collect();
        synced.sort_unstable_by(|a, b| b.cmp(a));
        let majority_synced = synced.get(self.leadership.members.len() / 2).copied().unwrap_or(0);
        if majority_synced > *epoch_start {
            self.shared.stream.commit_replicated(majority_synced);
        }
    }

    fn answer_all(&mut self) {
        let Role::Leader { followers, .. } = &self.role else { return };
        let waiting: Vec<u64> = followers.iter().filter(|(_, progress)| progress.wanted.is_some()).map(|(id, _)| *id).collect();
        for follower in waiting {
            self.answer(follower);
        }
    }

    /// Leader: answers a follower's waiting fetch when there is something to say (chunks, a
    /// cut, a new commit offset) or its heartbeat is due.
    fn answer(&mut self, to: u64) {
        if self.shared.fence() > self.leadership.epoch {
            return;
        }
        let commit = self.shared.stream.committed().next_offset;
        let first_offset = self.shared.stream.info().first_offset;
        let epoch = self.leadership.epoch;
        let Role::Leader { followers, .. } = &mut self.role else { return };
        let Some(progress) = followers.get_mut(&to) else { return };
        let Some(mut wanted) = progress.wanted else { return };
        // Retention deleted the offsets it asks for: it starts again at this log's first (a
        // cut comes first; it never ends before the first offset).
        let reset_to = (wanted < first_offset && progress.truncate_to.is_none()).then_some(first_offset);
        if reset_to.is_some() {
            tracing::info!(stream = %self.shared.key.name, follower = %format!("{to:x}"), wanted, first_offset,
                "a follower wants offsets retention deleted here; it starts again at this log's first");
            wanted = first_offset;
            progress.wanted = Some(wanted);
        }
        let chunks = match read_chunks(&self.shared, wanted, &mut self.chunk) {
            Ok(chunks) => chunks,
            Err(error) => return tracing::error!(stream = %self.shared.key.name, %error, "reading chunks for a follower failed"),
        };
        // A fetch with nothing new to answer waits (for chunks, a commit, or the heartbeat).
        let heartbeat_due = progress.answered_at.elapsed() >= Duration::from_millis(HEARTBEAT_MS);
        let news = !chunks.is_empty() || commit > progress.told_commit || progress.truncate_to.is_some() || reset_to.is_some();
        if !news && !heartbeat_due {
            return;
        }
        let data = Data { epoch, commit, truncate_to: progress.truncate_to, reset_to, chunks };
        if self.shared.transport.send(to, ReplicaMessage::Data(self.shared.key.clone(), data).encode()) {
            progress.wanted = None;
            progress.told_commit = commit;
            progress.truncate_to = None;
            progress.answered_at = Instant::now();
        }
    }

    /// Follower: asks the leader for what follows this copy, acknowledging what it synced.
    fn fetch(&mut self) {
        let Role::Follower { fetched_at, .. } = &mut self.role else { return };
        let leader = self.leadership.leader;
        if leader == self.shared.transport.node_id() {
            return;
        }
        let stream = &self.shared.stream;
        let tail = stream.tail();
        let fetch = Fetch {
            epoch: self.leadership.epoch,
            tail_epoch: tail.last_epoch,
            tail_next: tail.next_offset,
            synced_next: stream.synced_next_offset(),
        };
        *fetched_at = Some(Instant::now());
        self.shared.transport.send(leader, ReplicaMessage::Fetch(self.shared.key.clone(), fetch).encode());
    }

    /// Follower: the leader's answer.
    fn data(&mut self, from: u64, data: Data) {
        let fence = self.shared.fence();
        let Role::Follower { last_heard, syncing, suspect_since, .. } = &mut self.role else { return };
        if from != self.leadership.leader || data.epoch < self.leadership.epoch || data.epoch < fence {
            return;
        }
        *last_heard = Instant::now();
        *suspect_since = None;
        let stream = &self.shared.stream;
        if let Some(cut) = data.truncate_to {
            if let Err(error) = stream.truncate_from(cut) {
                tracing::error!(stream = %self.shared.key.name, %error, offset = cut, "could not cut the stream where the leader's log parts");
                return;
            }
            tracing::info!(stream = %self.shared.key.name, offset = cut, "cut chunks of an older epoch the leader does not have");
        }
        if let Some(first_offset) = data.reset_to {
            if !reset_copy(&self.shared, first_offset) {
                return;
            }
        }
        let mut appended = 0;
        for (starts_segment, bytes) in &data.chunks {
            match stream.append_replicated(bytes, *starts_segment, now_ms()) {
                Ok(_) => appended += 1,
                Err(error) => {
                    log_refused_copy(&self.shared.key.name, &error);
                    break;
                }
            }
        }
        stream.commit_replicated(data.commit);
        if appended > 0 {
            *syncing = true;
            self.shared.request_sync();
        } else {
            self.fetch();
        }
    }

    /// Follower: its leader is silent. Asks every member for the end of its copy (fencing it
    /// at the next epoch) and, with a majority's answers, proposes the most up-to-date one.
    fn elect(&mut self) {
        let epoch = self.leadership.epoch.max(self.shared.fence()) + 1;
        let me = self.me();
        let mut tails = match self.shared.answer_tail(epoch) {
            Ok(tail) => vec![(me, tail)],
            Err(error) => return tracing::error!(stream = %self.shared.key.name, %error, "cannot run an election"),
        };
        for member in self.leadership.members.iter().copied().filter(|member| *member != me) {
            if let Some(tail) = self.shared.transport.ask_tail(member, &self.shared.key, epoch) {
                tails.push((member, tail));
            }
        }
        let retry_ms = ELECTION_RETRY_MS + storage::entropy::random_u64() % ELECTION_RETRY_MS;
        if let Role::Follower { election_at, last_heard, .. } = &mut self.role {
            *election_at = Some(Instant::now() + Duration::from_millis(retry_ms));
            *last_heard = Instant::now() - Duration::from_millis(LEADER_SILENCE_MS);
        }
        if tails.len() * 2 <= self.leadership.members.len() {
            return tracing::warn!(stream = %self.shared.key.name, answers = tails.len(), members = self.leadership.members.len(),
                "no majority answered the stream's election; trying again");
        }
        let Some(&(leader, tail)) = tails.iter().max_by_key(|(id, tail)| (tail.last_epoch, tail.next_offset, std::cmp::Reverse(*id)))
        else {
            return;
        };
        let leadership = Leadership { epoch, leader, members: self.leadership.members.clone() };
        tracing::info!(stream = %self.shared.key.name, epoch, leader = %format!("{leader:x}"), offset = tail.next_offset, "electing a stream leader");
        if let Err(error) = self.shared.transport.propose_leadership(&self.shared.key, leadership) {
            tracing::warn!(stream = %self.shared.key.name, %error, "the stream's new leader was not recorded; trying again");
        }
    }
}

/// Reads the synced chunks from `from`, up to [`DATA_BYTES_MAX`] (at least one).
fn read_chunks(shared: &StreamReplication, from: u64, buffer: &mut Vec<u8>) -> Result<Vec<(bool, bytes::Bytes)>, StreamError> {
    let (mut chunks, mut bytes) = (Vec::new(), 0usize);
    if from >= shared.stream.synced_next_offset() {
        return Ok(chunks);
    }
    let mut reader = shared.stream.replication_reader(from)?;
    while bytes < DATA_BYTES_MAX {
        let Some(location) = reader.next_chunk()? else { break };
        if chunks.is_empty() && location.header.first_offset != from {
            // Retention ran since the answer was planned: the follower's next fetch is reset.
            tracing::warn!(stream = %shared.stream.directory().display(), wanted = from, found = location.header.first_offset,
                "a follower wants offsets this leader no longer holds (retention removed them)");
        }
        location.read_whole(buffer).map_err(|defect| StreamError::Damaged {
            path: shared.stream.directory().display().to_string(),
            position: location.position,
            defect,
        })?;
        bytes += buffer.len();
        chunks.push((location.starts_segment(), bytes::Bytes::copy_from_slice(buffer)));
    }
    Ok(chunks)
}

/// Follower: the leader's log starts at `first_offset`, past the end of this copy (its
/// retention deleted what this copy lacks): drops the copy and starts again there. Not when the
/// copy reaches that far already (the answer to an older fetch): nothing of it is to go then,
/// and chunks that do not follow on are refused and fetched again. False when the reset failed.
fn reset_copy(shared: &StreamReplication, first_offset: u64) -> bool {
    let next_offset = shared.stream.tail().next_offset;
    if next_offset >= first_offset {
        return true;
    }
    match shared.stream.reset_to(first_offset) {
        Ok(segments) => {
            tracing::warn!(stream = %shared.key.name, vhost = %shared.key.vhost, from = next_offset, to = first_offset, segments,
                "this copy ended before the leader's first offset (its retention deleted the rest): dropped it, starting again there");
            true
        }
        Err(error) => {
            tracing::error!(stream = %shared.key.name, %error, offset = first_offset, "could not start the copy again at the leader's first offset");
            false
        }
    }
}

fn log_refused_copy(name: &str, error: &StreamError) {
    match error {
        StreamError::OutOfSequence { .. } | StreamError::StaleEpoch { .. } => {
            tracing::debug!(stream = %name, %error, "a copied chunk that does not follow on; fetching again")
        }
        _ => tracing::error!(stream = %name, %error, "a chunk copied from the leader was refused"),
    }
}
