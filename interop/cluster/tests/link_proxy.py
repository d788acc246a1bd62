"""An in-tree TCP proxy between the nodes of a test cluster, which can partition, cut and delay
the links of chosen node pairs (`tc netem` is not in this kernel).

Each node gets one proxy port in front of its cluster port; every node's seeds and advertised
address are the proxy ports, so every link between two nodes runs through the proxy of the node
that was dialled. The proxy learns who dialled from the link's first frame, the dialler's Hello
(`length u32 | crc32c u32 | kind u8 = 1 | version u32 | cluster name | cluster id u64 | node
name | ...`, strings as `length u32 | bytes`, little-endian: crates/server/src/cluster/frame.rs),
so it knows the pair (dialler, dialled) of every connection.

Faults, per unordered node pair:
  partition  bytes are held, not forwarded, both ways (as a network that drops packets: TCP
             stalls, the nodes' links time out, their new dials get no handshake answer); healing
             releases what was held, as TCP retransmits after a partition ends.
  cut        connections are closed at once and new ones closed as soon as they name the pair
             (as a network that answers with resets).
  delay_ms   every chunk waits this long before it is forwarded (both ways, all pairs).
  slow       as delay_ms, for one pair only: a chunk is at most READ_BYTES, so the pair's links
             carry at most READ_BYTES per delay each way (a slow network to one node).
"""

import asyncio
import struct
import threading

READ_BYTES = 65536
HELLO_KIND = 1
HEADER_BYTES = 8
HELLO_BYTES_MAX = 4096


def hello_node_name(body):
    """The node name in a Hello frame's body, or None when the body is not a Hello."""
    try:
        if body[0] != HELLO_KIND:
            return None
        offset = 1 + 4
        (length,) = struct.unpack_from("<I", body, offset)
        offset += 4 + length + 8
        (length,) = struct.unpack_from("<I", body, offset)
        return body[offset + 4: offset + 4 + length].decode()
    except (IndexError, struct.error, UnicodeDecodeError):
        return None


class _Pipe:
    """One proxied connection: the dialler's side and the dialled node's side."""

    def __init__(self, pair, writers):
        self.pair = pair
        self.writers = writers

    def close(self):
        for writer in self.writers:
            writer.close()


class LinkProxy:
    """Proxies for every node of a cluster, on one event loop in a thread of their own."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="link-proxy", daemon=True)
        self.thread.start()
        self.lock = threading.Lock()
        self.partitioned = set()
        self.cut_pairs = set()
        self.delay_ms = 0
        self.slow_pairs = {}
        self.pipes = set()
        self.servers = []
        self.forwarded_bytes = 0
        self.held_connections = 0

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=10)

    def add(self, node_name, listen_port, target_port):
        """Listens on `listen_port` (loopback) in front of `node_name`'s cluster port."""

        async def start():
            server = await asyncio.start_server(
                lambda reader, writer: self._accept(reader, writer, node_name, target_port), "127.0.0.1", listen_port)
            self.servers.append(server)

        self._call(start())

    def _state(self, pair):
        with self.lock:
            return pair in self.cut_pairs, pair in self.partitioned, max(self.delay_ms, self.slow_pairs.get(pair, 0))

    async def _accept(self, reader, writer, target_name, target_port):
        try:
            header = await reader.readexactly(HEADER_BYTES)
            (length,) = struct.unpack_from("<I", header, 0)
            body = await reader.readexactly(min(length, HELLO_BYTES_MAX)) if 0 < length <= HELLO_BYTES_MAX else b""
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        dialler = hello_node_name(body) if body else None
        pair = frozenset((dialler, target_name)) if dialler else None
        cut, _, _ = self._state(pair)
        if cut:
            writer.close()
            return
        try:
            target_reader, target_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        pipe = _Pipe(pair, (writer, target_writer))
        with self.lock:
            self.pipes.add(pipe)
        first = header + body
        await asyncio.gather(
            self._pump(reader, target_writer, pipe, first),
            self._pump(target_reader, writer, pipe, b""),
            return_exceptions=True,
        )
        with self.lock:
            self.pipes.discard(pipe)
        pipe.close()

    async def _pump(self, reader, writer, pipe, first):
        pending = first
        try:
            while True:
                if not pending:
                    pending = await reader.read(READ_BYTES)
                    if not pending:
                        break
                cut, partitioned, delay_ms = self._state(pipe.pair)
                if cut:
                    break
                if partitioned:
                    # Held: nothing passes until the partition heals (or the node gives up).
                    with self.lock:
                        self.held_connections += 1
                    while self._state(pipe.pair)[1] and not self._state(pipe.pair)[0]:
                        await asyncio.sleep(0.05)
                    continue
                if delay_ms:
                    await asyncio.sleep(delay_ms / 1000)
                writer.write(pending)
                await writer.drain()
                with self.lock:
                    self.forwarded_bytes += len(pending)
                pending = b""
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            pipe.close()

    def partition(self, *groups):
        """Splits the nodes named in `groups` (lists of names): no pair across two groups talks."""
        pairs = set()
        for index, group in enumerate(groups):
            for other in groups[index + 1:]:
                pairs.update(frozenset((a, b)) for a in group for b in other)
        with self.lock:
            self.partitioned = pairs

    def cut(self, a, b):
        """Closes the links between `a` and `b`, and every new one, until healed."""
        pair = frozenset((a, b))
        with self.lock:
            self.cut_pairs.add(pair)
            doomed = [pipe for pipe in self.pipes if pipe.pair == pair]
        for pipe in doomed:
            self.loop.call_soon_threadsafe(pipe.close)

    def set_delay(self, delay_ms):
        with self.lock:
            self.delay_ms = delay_ms

    def slow(self, a, b, delay_ms):
        """Delays every chunk between `a` and `b` by `delay_ms`, until healed."""
        with self.lock:
            self.slow_pairs[frozenset((a, b))] = delay_ms

    def heal(self):
        with self.lock:
            self.partitioned = set()
            self.cut_pairs = set()
            self.delay_ms = 0
            self.slow_pairs = {}

    def close(self):
        async def stop():
            for server in self.servers:
                server.close()
            with self.lock:
                pipes = list(self.pipes)
            for pipe in pipes:
                pipe.close()
            # Every connection's task ends before the loop stops (no task destroyed pending).
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self._call(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
