//! The links between nodes: one TCP connection per node pair, carrying [`LinkFrame`]s.
//!
//! Every node listens on its cluster port and dials every address it knows (the seeds, then the
//! members' advertised addresses) whenever it has no link to the node there. The handshake names
//! the cluster and the node, so a stray client, a node of another cluster name or of another
//! cluster is refused. When both nodes dial at once and two links come up, both keep the one
//! dialled by the lower node id and close the other.
//!
//! Each peer has one bounded send queue ([`super::settings::PEER_QUEUE_BYTES_MAX_DEFAULT`]) that
//! outlives its links: a writer task drains it into the socket. When the queue is full, or the peer
//! has no link, Raft messages to it are dropped (Raft resends them) and requests and payloads are
//! refused, so the caller answers an error at once instead of queueing without bound. A link
//! that received nothing (not even a heartbeat) for `link_timeout_ms` is closed and dialled again
//! with a growing backoff.
//!
//! The links run on their own small runtime (see `mod.rs`): the broker's workers may block on a
//! definition change waiting for a majority, which needs these links to get one.

use super::frame::{Hello, LinkFrame, FRAME_HEADER_BYTES, LINK_PROTOCOL_VERSION};
use super::settings::ClusterSettings;
use super::transfer::{take_part, IncomingTransfer, OutgoingTransfer, Part, PartTaken, RAFT_TRANSFER_BYTES_MIN};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

/// How long a handshake may take before the socket is closed.
const HANDSHAKE_TIMEOUT_MS: u64 = 5_000;
/// How long a dial may take.
const DIAL_TIMEOUT_MS: u64 = 3_000;
/// The first pause before dialling an address again; it doubles up to [`DIAL_BACKOFF_MAX_MS`].
const DIAL_BACKOFF_FIRST_MS: u64 = 100;
/// The longest pause between two dials of one address.
const DIAL_BACKOFF_MAX_MS: u64 = 3_000;
/// Bytes a writer takes off its queue for one socket write.
const WRITE_BATCH_BYTES_MAX: usize = 1 << 20;
/// The most requests a node waits answers for at once; one more is refused.
const PENDING_REQUESTS_MAX: usize = 4096;

/// What the node does with what its links receive. Called on the links' runtime: quick work only
/// (hand it to a thread or a channel).
pub trait LinkHandler: Send + Sync + 'static {
    /// A Raft message for `group` from the node `from`.
    fn raft(&self, from: u64, group: u32, message: Bytes);
    /// A request from `from`; the answer goes back as its response (run on a blocking thread).
    fn request(&self, from: u64, body: Bytes) -> Bytes;
    /// A payload of another protocol.
    fn payload(&self, from: u64, channel: u8, body: Bytes);
    /// A link to `peer` came up.
    fn peer_up(&self, peer: &Hello);
    /// The link to node `id` went down.
    fn peer_down(&self, id: u64);
}

/// Why a frame could not be sent or a request not answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// No link to the node now.
    #[error("no link to node {0:x}")]
    NotConnected(u64),
    /// Its send queue holds `peer_queue_bytes_max` already.
    #[error("the send queue to node {0:x} is full")]
    QueueFull(u64),
    /// No answer in time (or the link went down meanwhile).
    #[error("node {0:x} did not answer in time")]
    Timeout(u64),
    /// Too many requests wait for answers.
    #[error("too many requests wait for answers")]
    TooManyRequests,
}

/// Counters of the links, for metrics and tests.
#[derive(Debug, Default)]
pub struct LinkCounters {
    /// Raft messages dropped: no link, or the queue was full.
    pub raft_dropped: AtomicU64,
    /// Requests and payloads refused for the same reasons.
    pub sends_refused: AtomicU64,
    /// Handshakes refused (either side).
    pub handshakes_refused: AtomicU64,
    /// Links that came up.
    pub links_up: AtomicU64,
    /// Links closed for silence past `link_timeout_ms`.
    pub links_timed_out: AtomicU64,
}

struct SendQueue {
    frames: VecDeque<Bytes>,
    bytes: usize,
}

/// The link in use to a peer.
struct ActiveLink {
    generation: u64,
    dialled_by: u64,
    closed: watch::Sender<bool>,
}

/// What a node knows of another.
pub struct Peer {
    hello: Mutex<Hello>,
    queue: Mutex<SendQueue>,
    wake: Notify,
    link: Mutex<Option<ActiveLink>>,
    /// A Raft message too large for the queue, being sent in parts beside it.
    outgoing: Mutex<Option<OutgoingTransfer>>,
    /// One arriving in parts.
    incoming: Mutex<Option<IncomingTransfer>>,
}

impl Peer {
    fn new(hello: Hello) -> Peer {
        Peer {
            hello: Mutex::new(hello),
            queue: Mutex::new(SendQueue { frames: VecDeque::new(), bytes: 0 }),
            wake: Notify::new(),
            link: Mutex::new(None),
            outgoing: Mutex::new(None),
            incoming: Mutex::new(None),
        }
    }
}

/// The node's links.
pub struct Links {
    settings: ClusterSettings,
    local: Mutex<Hello>,
    peers: Mutex<HashMap<u64, Arc<Peer>>>,
    /// Addresses dialled (each by one task), and those found to be this node.
    dialled: Mutex<BTreeSet<String>>,
    own_addresses: Mutex<BTreeSet<String>>,
    handler: OnceLock<Arc<dyn LinkHandler>>,
    next_generation: AtomicU64,
    next_request: AtomicU64,
    pending: Mutex<HashMap<u64, std::sync::mpsc::SyncSender<Bytes>>>,
    runtime: tokio::runtime::Handle,
    /// Counters.
    pub counters: LinkCounters,
}

/// A peer as listed: its handshake and whether a link to it is up.
#[derive(Debug, Clone)]
pub struct PeerView {
    /// What it said in its last handshake.
    pub hello: Hello,
    /// Whether a link to it is up now.
    pub connected: bool,
}

impl Links {
    /// Links for a node that says `local` in its handshakes, on `runtime`.
    pub fn new(settings: ClusterSettings, local: Hello, runtime: tokio::runtime::Handle) -> Arc<Links> {
        Arc::new(Links {
            settings,
            local: Mutex::new(local),
            peers: Mutex::new(HashMap::new()),
            dialled: Mutex::new(BTreeSet::new()),
            own_addresses: Mutex::new(BTreeSet::new()),
            handler: OnceLock::new(),
            next_generation: AtomicU64::new(1),
            next_request: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            runtime,
            counters: LinkCounters::default(),
        })
    }

    /// Sets who handles what arrives (once, before links come up).
    pub fn set_handler(&self, handler: Arc<dyn LinkHandler>) {
        let _ = self.handler.set(handler);
    }

    /// This node's handshake.
    pub fn local_hello(&self) -> Hello {
        self.local.lock().clone()
    }

    /// Records that this node now belongs to cluster `cluster_id` (said in later handshakes).
    pub fn set_cluster_id(&self, cluster_id: u64) {
        self.local.lock().cluster_id = cluster_id;
    }

    /// Every peer known, with whether it is linked now.
    pub fn peers(&self) -> Vec<PeerView> {
        let peers: Vec<Arc<Peer>> = self.peers.lock().values().cloned().collect();
        peers.iter().map(|peer| PeerView { hello: peer.hello.lock().clone(), connected: peer.link.lock().is_some() }).collect()
    }

    fn peer(&self, id: u64) -> Option<Arc<Peer>> {
        self.peers.lock().get(&id).cloned()
    }

    /// Starts accepting links on `listener` (bound by the caller, so a taken port stops the start).
    pub fn listen(self: &Arc<Self>, listener: std::net::TcpListener) -> std::io::Result<()> {
        listener.set_nonblocking(true)?;
        let links = self.clone();
        let _guard = self.runtime.enter();
        let listener = TcpListener::from_std(listener)?;
        self.runtime.spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let links = links.clone();
                        tokio::spawn(async move { links.accept(stream).await });
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cluster port: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Ok(())
    }

    /// Keeps a link to whatever node is at `address` (a seed, a member), dialling again with a
    /// backoff whenever there is none. Idempotent.
    pub fn dial(self: &Arc<Self>, address: &str) {
        if !self.dialled.lock().insert(address.to_string()) {
            return;
        }
        let links = self.clone();
        let address = address.to_string();
        self.runtime.spawn(async move { links.keep_dialling(address).await });
    }

    async fn keep_dialling(self: Arc<Self>, address: String) {
        let mut backoff_ms = DIAL_BACKOFF_FIRST_MS;
        loop {
            if self.own_addresses.lock().contains(&address) {
                return;
            }
            let linked = self.peers.lock().values().any(|peer| peer.hello.lock().advertise == address && peer.link.lock().is_some());
            if linked {
                backoff_ms = DIAL_BACKOFF_FIRST_MS;
                tokio::time::sleep(Duration::from_millis(DIAL_BACKOFF_MAX_MS / 3)).await;
                continue;
            }
            match self.dial_once(&address).await {
                Ok(closed) => {
                    backoff_ms = DIAL_BACKOFF_FIRST_MS;
                    // Until this link ends: then dial at once.
                    let mut closed = closed;
                    let _ = closed.wait_for(|closed| *closed).await;
                }
                Err(reason) => {
                    tracing::debug!(%address, %reason, "cluster link: dial failed");
                    let jitter = rand::random::<u64>() % (backoff_ms / 2 + 1);
                    tokio::time::sleep(Duration::from_millis(backoff_ms + jitter)).await;
                    backoff_ms = (backoff_ms * 2).min(DIAL_BACKOFF_MAX_MS);
                }
            }
        }
    }

    /// One dial: connect, handshake, run the link. Returns the link's closing signal.
    async fn dial_once(self: &Arc<Self>, address: &str) -> Result<watch::Receiver<bool>, String> {
        let connect = tokio::time::timeout(Duration::from_millis(DIAL_TIMEOUT_MS), TcpStream::connect(address));
        let stream = connect.await.map_err(|_| "connect timed out".to_string())?.map_err(|error| error.to_string())?;
        let _ = stream.set_nodelay(true);
        let (reader, mut writer) = stream.into_split();
        let mut reader = BufReader::new(reader);
        let hello = self.local_hello();
        writer.write_all(&LinkFrame::Hello(hello.clone()).to_bytes()).await.map_err(|error| error.to_string())?;
        let answer = tokio::time::timeout(Duration::from_millis(HANDSHAKE_TIMEOUT_MS), read_frame(&mut reader))
            .await
            .map_err(|_| "handshake timed out".to_string())??;
        let peer = match answer {
            LinkFrame::Welcome(peer) => peer,
            LinkFrame::Refuse(reason) if reason == REFUSE_SELF => {
                self.own_addresses.lock().insert(address.to_string());
                return Err("this address is this node".to_string());
            }
            LinkFrame::Refuse(reason) => {
                self.counters.handshakes_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%address, %reason, "cluster link refused by the peer");
                return Err(reason);
            }
            other => return Err(format!("unexpected handshake answer {other:?}")),
        };
        if let Err(reason) = self.check_hello(&peer) {
            self.counters.handshakes_refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%address, %reason, "cluster link: refusing the node that answered");
            return Err(reason);
        }
        self.run_link(peer, hello.node_id, reader, writer).ok_or_else(|| "a link to that node is already up".to_string())
    }

    async fn accept(self: Arc<Self>, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let remote = stream.peer_addr().map(|address| address.to_string()).unwrap_or_default();
        let (reader, mut writer) = stream.into_split();
        let mut reader = BufReader::new(reader);
        let first = tokio::time::timeout(Duration::from_millis(HANDSHAKE_TIMEOUT_MS), read_frame(&mut reader)).await;
        let peer = match first {
            Ok(Ok(LinkFrame::Hello(peer))) => peer,
            Ok(Ok(other)) => return tracing::warn!(%remote, ?other, "cluster port: the first frame was not a handshake; closed"),
            Ok(Err(reason)) => return tracing::warn!(%remote, %reason, "cluster port: not a cluster link; closed"),
            Err(_) => return tracing::warn!(%remote, "cluster port: no handshake in time; closed"),
        };
        let local = self.local_hello();
        let verdict = if peer.node_id == local.node_id { Err(REFUSE_SELF.to_string()) } else { self.check_hello(&peer) };
        if let Err(reason) = verdict {
            if reason != REFUSE_SELF {
                self.counters.handshakes_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%remote, node = %peer.node_name, %reason, "cluster link refused");
            }
            let _ = writer.write_all(&LinkFrame::Refuse(reason).to_bytes()).await;
            return;
        }
        if writer.write_all(&LinkFrame::Welcome(local).to_bytes()).await.is_err() {
            return;
        }
        self.run_link(peer.clone(), peer.node_id, reader, writer);
    }

    /// Whether a node that said `peer` may link with this one.
    fn check_hello(&self, peer: &Hello) -> Result<(), String> {
        let local = self.local.lock();
        if peer.version != LINK_PROTOCOL_VERSION {
            return Err(format!("link protocol {} is not this node's {LINK_PROTOCOL_VERSION}", peer.version));
        }
        if peer.cluster_name != local.cluster_name {
            return Err(format!("cluster name '{}' is not this node's '{}'", peer.cluster_name, local.cluster_name));
        }
        if peer.cluster_id != 0 && local.cluster_id != 0 && peer.cluster_id != local.cluster_id {
            return Err(format!(
                "node {} belongs to another cluster ({:x}, this one is {:x})",
                peer.node_name, peer.cluster_id, local.cluster_id
            ));
        }
        if peer.node_id == 0 || peer.node_id == local.node_id {
            return Err(format!("node {} has id {:x}, which is not usable here", peer.node_name, peer.node_id));
        }
        Ok(())
    }

    /// Makes a handshaken connection the link to `peer`, unless a link dialled by a lower id is
    /// up already. Returns the link's closing signal when it is used.
    fn run_link(
        self: &Arc<Self>,
        peer_hello: Hello,
        dialled_by: u64,
        reader: BufReader<OwnedReadHalf>,
        writer: OwnedWriteHalf,
    ) -> Option<watch::Receiver<bool>> {
        let id = peer_hello.node_id;
        let peer = self.peers.lock().entry(id).or_insert_with(|| Arc::new(Peer::new(peer_hello.clone()))).clone();
        *peer.hello.lock() = peer_hello.clone();
        let (closed_sender, closed) = watch::channel(false);
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        {
            let mut link = peer.link.lock();
            if let Some(existing) = link.as_ref() {
                if existing.dialled_by <= dialled_by {
                    return None;
                }
                let _ = existing.closed.send(true);
            }
            *link = Some(ActiveLink { generation, dialled_by, closed: closed_sender });
        }
        self.counters.links_up.fetch_add(1, Ordering::Relaxed);
        tracing::info!(node = %peer_hello.node_name, address = %peer_hello.advertise, "cluster link up");
        if let Some(handler) = self.handler.get() {
            handler.peer_up(&peer_hello);
        }
        tokio::spawn(self.clone().write_loop(peer.clone(), writer, closed.clone()));
        tokio::spawn(self.clone().read_loop(peer, id, generation, reader, closed.clone()));
        Some(closed)
    }

    /// Ends link `generation` to `peer` (if it is still the one in use): its tasks stop, its
    /// queue is emptied (Raft resends what mattered; requests time out).
    fn close_link(&self, peer: &Peer, id: u64, generation: u64, reason: &str) {
        {
            let mut link = peer.link.lock();
            if link.as_ref().is_none_or(|link| link.generation != generation) {
                return;
            }
            if let Some(link) = link.take() {
                let _ = link.closed.send(true);
            }
        }
        let mut queue = peer.queue.lock();
        queue.frames.clear();
        queue.bytes = 0;
        drop(queue);
        // A transfer cut short is reported lost by its Raft group's timeout, and sent again.
        *peer.outgoing.lock() = None;
        *peer.incoming.lock() = None;
        tracing::warn!(node = %peer.hello.lock().node_name, %reason, "cluster link down");
        if let Some(handler) = self.handler.get() {
            handler.peer_down(id);
        }
    }

    async fn write_loop(self: Arc<Self>, peer: Arc<Peer>, mut writer: OwnedWriteHalf, mut closed: watch::Receiver<bool>) {
        let heartbeat = Duration::from_millis(self.settings.link_heartbeat_interval_ms);
        let mut buffer = Vec::with_capacity(64 * 1024);
        loop {
            let batch = {
                let mut queue = peer.queue.lock();
                let mut taken = 0;
                while taken < WRITE_BATCH_BYTES_MAX {
                    let Some(frame) = queue.frames.pop_front() else { break };
                    queue.bytes -= frame.len();
                    taken += frame.len();
                    buffer.extend_from_slice(&frame);
                }
                if taken < WRITE_BATCH_BYTES_MAX {
                    drop(queue);
                    taken += Self::next_transfer_part(&peer, &mut buffer);
                }
                taken
            };
            if batch == 0 {
                tokio::select! {
                    _ = peer.wake.notified() => continue,
                    _ = closed.wait_for(|closed| *closed) => return,
                    _ = tokio::time::sleep(heartbeat) => LinkFrame::Heartbeat.encode(&mut buffer),
                }
            }
            if *closed.borrow() {
                return;
            }
            if writer.write_all(&buffer).await.is_err() {
                // The reader sees the socket end too and closes the link.
                return;
            }
            buffer.clear();
        }
    }

    /// Appends the next part of the peer's transfer, if one is under way, to `buffer`; its bytes.
    fn next_transfer_part(peer: &Peer, buffer: &mut Vec<u8>) -> usize {
        let mut outgoing = peer.outgoing.lock();
        let Some(transfer) = outgoing.as_mut() else { return 0 };
        let (bytes, more) = transfer.encode_next_part(buffer);
        if !more {
            *outgoing = None;
        }
        bytes
    }

    async fn read_loop(
        self: Arc<Self>,
        peer: Arc<Peer>,
        id: u64,
        generation: u64,
        mut reader: BufReader<OwnedReadHalf>,
        mut closed: watch::Receiver<bool>,
    ) {
        let silence = Duration::from_millis(self.settings.link_timeout_ms);
        loop {
            let frame = tokio::select! {
                frame = tokio::time::timeout(silence, read_frame(&mut reader)) => frame,
                _ = closed.wait_for(|closed| *closed) => return,
            };
            let frame = match frame {
                Ok(Ok(frame)) => frame,
                Ok(Err(reason)) => return self.close_link(&peer, id, generation, &reason),
                Err(_) => {
                    self.counters.links_timed_out.fetch_add(1, Ordering::Relaxed);
                    return self.close_link(&peer, id, generation, "nothing received within link_timeout_ms");
                }
            };
            self.dispatch(id, frame);
        }
    }

    fn dispatch(self: &Arc<Self>, from: u64, frame: LinkFrame) {
        let Some(handler) = self.handler.get() else { return };
        match frame {
            LinkFrame::Heartbeat => {}
            LinkFrame::Raft { group, message } => handler.raft(from, group, message),
            LinkFrame::RaftPart { group, transfer, total, offset, bytes } => {
                let Some(peer) = self.peer(from) else { return };
                let taken = take_part(&mut peer.incoming.lock(), Part { group, transfer, total, offset, bytes });
                match taken {
                    PartTaken::Partial => {}
                    PartTaken::Whole { group, message } => handler.raft(from, group, message),
                    PartTaken::Refused(reason) => tracing::warn!(node = from, %reason, "cluster link: a Raft message in parts was dropped"),
                }
            }
            LinkFrame::Payload { channel, body } => handler.payload(from, channel, body),
            LinkFrame::Request { id, body } => {
                let handler = handler.clone();
                let links = self.clone();
                self.runtime.spawn(async move {
                    let answer = tokio::task::spawn_blocking(move || handler.request(from, body)).await;
                    if let Ok(answer) = answer {
                        let _ = links.push(from, LinkFrame::Response { id, body: answer }.to_bytes());
                    }
                });
            }
            LinkFrame::Response { id, body } => {
                if let Some(waiter) = self.pending.lock().remove(&id) {
                    let _ = waiter.try_send(body);
                }
            }
            other => tracing::warn!(node = from, ?other, "cluster link: a handshake frame after the handshake; ignored"),
        }
    }

    /// Queues a frame for `to`, or says why not.
    fn push(&self, to: u64, frame: Bytes) -> Result<(), LinkError> {
        let peer = self.peer(to).ok_or(LinkError::NotConnected(to))?;
        if peer.link.lock().is_none() {
            return Err(LinkError::NotConnected(to));
        }
        {
            let mut queue = peer.queue.lock();
            if queue.bytes + frame.len() > self.settings.peer_queue_bytes_max {
                return Err(LinkError::QueueFull(to));
            }
            queue.bytes += frame.len();
            queue.frames.push_back(frame);
        }
        peer.wake.notify_one();
        Ok(())
    }

    /// Queues a payload of another protocol for `to`; false when it cannot be queued (the
    /// protocol sends again).
    pub fn send_payload(&self, to: u64, channel: u8, body: Bytes) -> bool {
        if self.push(to, LinkFrame::Payload { channel, body }.to_bytes()).is_err() {
            self.counters.sends_refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Sends a Raft message of `group` to `to`; dropped when it cannot be queued (Raft resends).
    /// Whether it was queued.
    pub fn send_raft(&self, to: u64, group: u32, message: Bytes) -> bool {
        if message.len() > RAFT_TRANSFER_BYTES_MIN {
            return self.send_raft_in_parts(to, group, message);
        }
        if self.push(to, LinkFrame::Raft { group, message }.to_bytes()).is_err() {
            self.counters.raft_dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Sends a large Raft message (a snapshot) in parts beside the send queue: refused while
    /// another is under way to the same peer (Raft sends it again later).
    fn send_raft_in_parts(&self, to: u64, group: u32, message: Bytes) -> bool {
        let Some(peer) = self.peer(to).filter(|peer| peer.link.lock().is_some()) else {
            self.counters.raft_dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        {
            let mut outgoing = peer.outgoing.lock();
            if outgoing.is_some() {
                self.counters.raft_dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            let transfer = self.next_request.fetch_add(1, Ordering::Relaxed);
            tracing::info!(node = %format!("{to:x}"), group, bytes = message.len(), "cluster link: a Raft message sent in parts");
            *outgoing = Some(OutgoingTransfer::new(transfer, group, message));
        }
        peer.wake.notify_one();
        true
    }

    /// Asks `to` and waits for its answer, blocking the calling thread (never one of the links'
    /// runtime, whose tasks bring the answer).
    pub fn request_blocking(&self, to: u64, body: Bytes, timeout: Duration) -> Result<Bytes, LinkError> {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        let id = {
            let mut pending = self.pending.lock();
            if pending.len() >= PENDING_REQUESTS_MAX {
                return Err(LinkError::TooManyRequests);
            }
            let id = self.next_request.fetch_add(1, Ordering::Relaxed);
            pending.insert(id, sender);
            id
        };
        if let Err(error) = self.push(to, LinkFrame::Request { id, body }.to_bytes()) {
            self.pending.lock().remove(&id);
            self.counters.sends_refused.fetch_add(1, Ordering::Relaxed);
            return Err(error);
        }
        let answer = receiver.recv_timeout(timeout);
        self.pending.lock().remove(&id);
        answer.map_err(|_| LinkError::Timeout(to))
    }
}

/// The reason an acceptor gives a node that dialled itself.
const REFUSE_SELF: &str = "this is the node that dialled";

/// Reads one frame; the error says what was wrong.
async fn read_frame(reader: &mut BufReader<OwnedReadHalf>) -> Result<LinkFrame, String> {
    let mut header = [0; FRAME_HEADER_BYTES];
    reader.read_exact(&mut header).await.map_err(|error| format!("reading: {error}"))?;
    let (length, checksum) = LinkFrame::decode_header(header).map_err(|error| error.to_string())?;
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.map_err(|error| format!("reading: {error}"))?;
    LinkFrame::decode_body(Bytes::from(body), checksum).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(node_id: u64, cluster_name: &str) -> Hello {
        Hello {
            version: LINK_PROTOCOL_VERSION,
            cluster_name: cluster_name.to_string(),
            cluster_id: 0,
            node_name: format!("n{node_id}@test"),
            node_id,
            advertise: format!("127.0.0.1:{node_id}"),
            stream_host: String::new(),
            stream_port: 0,
        }
    }

    /// A peer with a link marked up and no writer draining it: its queue only fills.
    fn links_with_stalled_peer(queue_bytes_max: usize) -> (tokio::runtime::Runtime, Arc<Links>) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let settings = ClusterSettings { peer_queue_bytes_max: queue_bytes_max, ..ClusterSettings::default() };
        let links = Links::new(settings, hello(1, "lepus"), runtime.handle().clone());
        let peer = Arc::new(Peer::new(hello(2, "lepus")));
        let (closed, _) = watch::channel(false);
        *peer.link.lock() = Some(ActiveLink { generation: 1, dialled_by: 1, closed });
        links.peers.lock().insert(2, peer);
        (runtime, links)
    }

    #[test]
    fn a_full_send_queue_drops_raft_messages_and_refuses_requests() {
        let frame_bytes = LinkFrame::Raft { group: 0, message: Bytes::from(vec![0; 100]) }.to_bytes().len();
        let (_runtime, links) = links_with_stalled_peer(frame_bytes * 3);
        for _ in 0..5 {
            links.send_raft(2, 0, Bytes::from(vec![0; 100]));
        }
        assert_eq!(links.counters.raft_dropped.load(Ordering::Relaxed), 2, "three fit, two are dropped");
        assert_eq!(links.peer(2).expect("peer").queue.lock().frames.len(), 3);
        let refused = links.request_blocking(2, Bytes::from_static(b"{}"), Duration::from_millis(10));
        assert_eq!(refused, Err(LinkError::QueueFull(2)), "a request is refused at once, not queued past the bound");
        assert_eq!(links.counters.sends_refused.load(Ordering::Relaxed), 1);
        // No link to a node: Raft messages dropped, requests refused.
        assert!(!links.send_raft(3, 0, Bytes::from_static(b"x")), "a dropped message is reported to the sender");
        assert_eq!(links.counters.raft_dropped.load(Ordering::Relaxed), 3);
        assert_eq!(links.request_blocking(3, Bytes::new(), Duration::from_millis(10)), Err(LinkError::NotConnected(3)));
    }

    #[test]
    fn handshakes_of_another_cluster_name_or_id_or_this_nodes_id_are_refused() {
        let (_runtime, links) = links_with_stalled_peer(1 << 20);
        assert!(links.check_hello(&hello(2, "lepus")).is_ok());
        assert!(links.check_hello(&hello(2, "other")).expect_err("another name").contains("cluster name"));
        assert!(links.check_hello(&hello(1, "lepus")).is_err(), "this node's own id");
        assert!(links.check_hello(&hello(0, "lepus")).is_err(), "id 0");
        links.set_cluster_id(7);
        let other_cluster = Hello { cluster_id: 8, ..hello(2, "lepus") };
        assert!(links.check_hello(&other_cluster).expect_err("another cluster").contains("another cluster"));
        let fresh = Hello { cluster_id: 0, ..hello(2, "lepus") };
        assert!(links.check_hello(&fresh).is_ok(), "a node that has not joined yet may link (to join)");
        let mut old = hello(2, "lepus");
        old.version += 1;
        assert!(links.check_hello(&old).expect_err("another protocol").contains("link protocol"));
    }
}
