"""Declares (or deletes) durable queues one after another on one pika channel, and prints one JSON
line per CHECKPOINT queues: how many so far, the seconds since the start, and the rate over the
last CHECKPOINT (so a cost that grows with the number of queues shows as a falling rate).

Usage: declare_queues.py PORT declare|delete COUNT [TIME_LIMIT_S]
Stops early (and says so in its last line) once TIME_LIMIT_S have passed.
"""

import json
import sys
import time

import pika

CHECKPOINT = 10_000


def main():
    port, action, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    time_limit_s = float(sys.argv[4]) if len(sys.argv) > 4 else float("inf")
    parameters = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
                                           blocked_connection_timeout=600, socket_timeout=600)
    connection = pika.BlockingConnection(parameters)
    channel = connection.channel()
    started = last_time = time.monotonic()
    last_count = 0
    done = 0
    for number in range(count):
        name = "declare-%06d" % number
        if action == "declare":
            channel.queue_declare(name, durable=True)
        else:
            channel.queue_delete(name)
        done = number + 1
        now = time.monotonic()
        if done % CHECKPOINT == 0 or done == count or now - started > time_limit_s:
            # Smaller windows for a slow run, so the falling rate shows before it stops.
            print(json.dumps({"action": action, "queues": done, "elapsed_s": round(now - started, 2),
                              "window_per_s": round((done - last_count) / max(now - last_time, 1e-9), 1)}), flush=True)
            last_time, last_count = now, done
            if now - started > time_limit_s:
                print(json.dumps({"action": action, "stopped_at": done, "reason": "time limit %.0f s" % time_limit_s}), flush=True)
                break
        elif time_limit_s != float("inf") and done % 1000 == 0:
            print(json.dumps({"action": action, "queues": done, "elapsed_s": round(now - started, 2),
                              "window_per_s": round((done - last_count) / max(now - last_time, 1e-9), 1)}), flush=True)
            last_time, last_count = now, done
    connection.close()


if __name__ == "__main__":
    main()
