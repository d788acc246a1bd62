"""The history of a run, and the checker that reads it after each scenario.

Every client appends events to one JSON-lines file (kept under the test's temp directory):
  {"event": "publish", "publisher": P, "sequence": N}          sent (body names P and N)
  {"event": "confirm", "publisher": P, "sequence": N, "ack": true|false}
  {"event": "deliver", "consumer": C, "publisher": P, "sequence": N, "redelivered": bool}
  {"event": "ack", "consumer": C, "publisher": P, "sequence": N}  basic.ack sent
  {"event": "ack_confirmed", "publisher": P, "sequence": N}      the ack is known settled (e.g. tx.commit-ok)

check() returns the violations, each a sentence:
  - a confirmed (acked) message never delivered;
  - a delivered message never published;
  - with one consumer: a publisher's messages delivered first out of order (redeliveries aside);
  - a message delivered again after its ack was confirmed settled.
"""

import json
import threading
import time

import pika


class History:
    """Appends events from several threads to one file."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.file = open(path, "a", encoding="utf-8")

    def record(self, **event):
        line = json.dumps(event, sort_keys=True)
        with self.lock:
            self.file.write(line + "\n")
            self.file.flush()

    def close(self):
        with self.lock:
            self.file.close()


def read(path):
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def check(events, single_consumer=True):
    published = set()
    confirmed = set()
    delivered_first = {}
    deliveries = []
    ack_confirmed = set()
    violations = []
    for event in events:
        key = (event.get("publisher"), event.get("sequence"))
        kind = event["event"]
        if kind == "publish":
            published.add(key)
        elif kind == "confirm" and event.get("ack"):
            confirmed.add(key)
        elif kind == "deliver":
            if key not in published:
                violations.append(f"delivered {key}, which was never published")
            if key in ack_confirmed:
                violations.append(f"delivered {key} again after its ack was confirmed")
            if key not in delivered_first:
                delivered_first[key] = len(deliveries)
            deliveries.append(key)
        elif kind == "ack_confirmed":
            ack_confirmed.add(key)
    for key in sorted(confirmed - set(delivered_first), key=str):
        violations.append(f"confirmed {key} was never delivered")
    if single_consumer:
        last = {}
        for key in sorted(delivered_first, key=lambda key: delivered_first[key]):
            publisher, sequence = key
            if publisher in last and sequence < last[publisher]:
                violations.append(f"publisher {publisher}: {sequence} first delivered after {last[publisher]}")
            last[publisher] = max(sequence, last.get(publisher, sequence))
    return violations


def publish_until(node, publisher, queue, history, stop, reconnect=True):
    """Publishes `publisher:N` with confirms through `node` until `stop`, recording each publish
    and its confirm in `history`; after a failure it connects again, or with `reconnect` false
    ends (its node died: what was not confirmed may be lost)."""
    sequence = 0
    while not stop.is_set():
        try:
            connection = pika.BlockingConnection(pika.URLParameters(node.url()))
            channel = connection.channel()
            channel.confirm_delivery()
            while not stop.is_set():
                sequence += 1
                history.record(event="publish", publisher=publisher, sequence=sequence)
                try:
                    channel.basic_publish("", queue, f"{publisher}:{sequence}".encode(), pika.BasicProperties(delivery_mode=2))
                    history.record(event="confirm", publisher=publisher, sequence=sequence, ack=True)
                except pika.exceptions.NackError:
                    history.record(event="confirm", publisher=publisher, sequence=sequence, ack=False)
            connection.close()
        except (pika.exceptions.AMQPError, OSError):
            if not reconnect:
                return
            time.sleep(0.2)
