"""Declares COUNT durable queues from CONNECTIONS pika connections at once (one thread each, one
channel each, each waiting for its declare-ok), and prints the total rate as one JSON line: with a
group commit, declares of several connections share the definitions log's fdatasync.

Usage: declare_concurrently.py PORT CONNECTIONS COUNT
"""

import json
import sys
import threading
import time

import pika


def declare(port, prefix, count, failures):
    try:
        parameters = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"))
        connection = pika.BlockingConnection(parameters)
        channel = connection.channel()
        for number in range(count):
            channel.queue_declare("%s-%06d" % (prefix, number), durable=True)
        connection.close()
    except Exception as error:  # reported below: a failed thread must not pass for a fast one
        failures.append(repr(error))


def main():
    port, connections, count = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    failures = []
    threads = [threading.Thread(target=declare, args=(port, "concurrent-%d" % index, count // connections, failures))
               for index in range(connections)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    if failures:
        raise SystemExit("declares failed: %s" % failures[:3])
    declared = count // connections * connections
    print(json.dumps({"connections": connections, "queues": declared, "elapsed_s": round(elapsed, 2),
                      "declares_per_s": round(declared / elapsed, 1)}))


if __name__ == "__main__":
    main()
