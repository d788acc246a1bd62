"""Declares, publishes to, checks or deletes many durable queues over one connection and one
channel with up to WINDOW requests in flight (pipelined: the next requests go out before the
earlier replies are back), as an asynchronous client would. Prints JSON lines.

Usage:
  declare_pipelined.py declare URL COUNT [--window W] [--prefix P] [--first N]
      durable queue.declare of PREFIX(N) .. PREFIX(COUNT-1) (N = 0 by default, numbers of six
      digits, as declare_queues.py names them); one line per 10,000 queues
      (queues so far, seconds since the start, rate over the last window).
  declare_pipelined.py publish URL COUNT --messages M [--size BYTES] [--window W] [--prefix P]
      M persistent messages to each queue (round robin) with publisher confirms.
  declare_pipelined.py passive URL COUNT [--since EPOCH_S] [--expect-messages M] [--prefix P]
      connects (retrying while the broker starts), then declares every queue passively; prints
      the seconds from --since until the handshake succeeded and until every queue answered, and
      the total of their message counts (and fails if one does not hold M).
  declare_pipelined.py delete URL COUNT [--window W] [--prefix P]

pika and the other usual clients wait for each declare-ok before the next declare (pika queues the
next synchronous method behind the reply), so pipelining needs a client of its own: this one speaks
AMQP 0-9-1 over a plain socket with interop/python/rawamqp.py's encoders. A channel or connection
close from the broker ends it with the reply code and text.
"""

import argparse
import json
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop", "python"))
import rawamqp  # noqa: E402  (the path above)

CHECKPOINT = 10_000
QUEUE_DELETE = (50, 40)
QUEUE_DELETE_OK = (50, 41)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
CLOSES = (rawamqp.CHANNEL_CLOSE, rawamqp.CONNECTION_CLOSE)
PERSISTENT_FLAGS = 0x1000  # delivery-mode present


def declare_frame(name, passive=False):
    # passive, durable, exclusive, auto-delete, no-wait
    args = rawamqp.short(0) + rawamqp.shortstr(name) + rawamqp.bits(passive, True, False, False, False) + rawamqp.table({})
    return rawamqp.method_frame(1, rawamqp.QUEUE_DECLARE, args)


def delete_frame(name):
    return rawamqp.method_frame(1, QUEUE_DELETE, rawamqp.short(0) + rawamqp.shortstr(name) + rawamqp.bits(False, False, False))


def publish_frames(name, body):
    return (rawamqp.method_frame(1, rawamqp.BASIC_PUBLISH, rawamqp.short(0) + rawamqp.shortstr("") + rawamqp.shortstr(name)
                                 + rawamqp.bits(False, False))
            + rawamqp.content_header_frame(1, 60, len(body), PERSISTENT_FLAGS, rawamqp.octet(2))
            + rawamqp.body_frame(1, body))


class Replies:
    """Reads method frames from the socket without copying the unread rest for every frame."""

    def __init__(self, sock):
        self.sock = sock
        self.data = bytearray()
        self.offset = 0

    def next_method(self):
        while True:
            if len(self.data) - self.offset >= 7:
                frame_type, _channel, size = struct.unpack_from(">BHI", self.data, self.offset)
                end = self.offset + 7 + size
                if len(self.data) > end:
                    payload = bytes(self.data[self.offset + 7:end])
                    self.offset = end + 1
                    if frame_type != rawamqp.FRAME_METHOD:
                        continue
                    method = struct.unpack(">HH", payload[:4])
                    if method in CLOSES:
                        code, length = struct.unpack(">HB", payload[4:7])
                        raise SystemExit(json.dumps({"closed": code, "text": payload[7:7 + length].decode("utf-8", "replace")}))
                    return method, payload
            del self.data[:self.offset]
            self.offset = 0
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise rawamqp.ConnectionClosedByPeer("EOF")
            self.data += chunk


def connect(url):
    client = rawamqp.RawClient(url, timeout=600)
    client.handshake()
    client.open_channel(1)
    client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def pipelined(client, requests, expected, window, on_reply, label):
    """Sends `requests` (bytes each, one reply each) with at most `window` unanswered."""
    replies = Replies(client.sock)
    started = last_time = time.monotonic()
    sent = answered = last_count = 0
    total = len(requests)
    while answered < total:
        burst = min(total, answered + window) - sent
        if burst > 0:
            client.send(b"".join(requests[sent:sent + burst]))
            sent += burst
        method, payload = replies.next_method()
        if method != expected:
            raise AssertionError("expected %r, got %r" % (expected, method))
        on_reply(payload)
        answered += 1
        if answered % CHECKPOINT == 0 or answered == total:
            now = time.monotonic()
            print(json.dumps({"action": label, "window": window, "done": answered, "elapsed_s": round(now - started, 3),
                              "window_per_s": round((answered - last_count) / max(now - last_time, 1e-9), 1)}), flush=True)
            last_time, last_count = now, answered
    return time.monotonic() - started


def publish(client, names, messages, size, window):
    client.send(rawamqp.method_frame(1, CONFIRM_SELECT, rawamqp.bits(False)))
    replies = Replies(client.sock)
    assert replies.next_method()[0] == CONFIRM_SELECT_OK
    body = b"m" * size
    total = len(names) * messages
    started = time.monotonic()
    sent = confirmed = 0
    while confirmed < total:
        burst = min(total, confirmed + window) - sent
        if burst > 0:
            client.send(b"".join(publish_frames(names[number % len(names)], body) for number in range(sent, sent + burst)))
            sent += burst
        method, payload = replies.next_method()
        if method == BASIC_NACK:
            raise SystemExit(json.dumps({"nacked": struct.unpack(">Q", payload[4:12])[0]}))
        assert method == BASIC_ACK, method
        tag, multiple = struct.unpack(">QB", payload[4:13])
        confirmed = tag if multiple & 1 else max(confirmed, tag)
    elapsed = time.monotonic() - started
    print(json.dumps({"action": "publish", "messages": total, "elapsed_s": round(elapsed, 3), "per_s": round(total / elapsed, 1)}),
          flush=True)


def passive(url, names, since, expect_messages, wait_s):
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client = connect(url)
            break
        except (OSError, rawamqp.ConnectionClosedByPeer, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    handshake_s = time.time() - since
    counts = []
    pipelined(client, [declare_frame(name, passive=True) for name in names], rawamqp.QUEUE_DECLARE_OK, 1000,
              lambda payload: counts.append(struct.unpack(">I", payload[5 + payload[4]:9 + payload[4]])[0]), "passive")
    line = {"action": "passive", "queues": len(names), "handshake_s": round(handshake_s, 3), "all_back_s": round(time.time() - since, 3),
            "messages": sum(counts)}
    wrong = [names[index] for index, count in enumerate(counts) if expect_messages is not None and count != expect_messages]
    if wrong:
        line["wrong_counts"] = len(wrong)
        line["example"] = wrong[0]
    print(json.dumps(line), flush=True)
    return not wrong


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["declare", "publish", "passive", "delete"])
    parser.add_argument("url")
    parser.add_argument("count", type=int)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--prefix", default="declare-")
    parser.add_argument("--first", type=int, default=0, help="number of the first queue")
    parser.add_argument("--messages", type=int, default=1)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--since", type=float, default=None)
    parser.add_argument("--expect-messages", type=int, default=None)
    parser.add_argument("--wait-s", type=float, default=3600)
    args = parser.parse_args()
    names = ["%s%06d" % (args.prefix, number) for number in range(args.first, args.count)]
    if args.action == "passive":
        ok = passive(args.url, names, args.since if args.since is not None else time.time(), args.expect_messages, args.wait_s)
        sys.exit(0 if ok else 1)
    client = connect(args.url)
    if args.action == "declare":
        pipelined(client, [declare_frame(name) for name in names], rawamqp.QUEUE_DECLARE_OK, args.window, lambda _: None, "declare")
    elif args.action == "delete":
        pipelined(client, [delete_frame(name) for name in names], QUEUE_DELETE_OK, args.window, lambda _: None, "delete")
    else:
        publish(client, names, args.messages, args.size, args.window)
    client.close()


if __name__ == "__main__":
    main()
