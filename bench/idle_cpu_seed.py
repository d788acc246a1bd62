"""Seeds the idle-CPU benchmark (bench/idle-cpu.sh): over one connection, pipelined as
declare_pipelined.py does, declares the durable queue `dead` and COUNT durable queues
idle-ttl-NNNNNN with x-message-ttl TTL_MS and a dead-letter exchange ("" routing to `dead`), then
publishes MESSAGES persistent messages to each with confirms.

Usage: idle_cpu_seed.py URL COUNT [--messages 10] [--ttl-ms 3600000] [--window 1000] [--queue-type quorum]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import declare_pipelined  # noqa: E402  (the path above)
from declare_pipelined import rawamqp  # noqa: E402


def declare_frame(name, arguments):
    # passive, durable, exclusive, auto-delete, no-wait
    args = rawamqp.short(0) + rawamqp.shortstr(name) + rawamqp.bits(False, True, False, False, False) + rawamqp.table(arguments)
    return rawamqp.method_frame(1, rawamqp.QUEUE_DECLARE, args)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("count", type=int)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--ttl-ms", type=int, default=3_600_000)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--queue-type", default="classic")
    args = parser.parse_args()
    names = ["idle-ttl-%06d" % number for number in range(args.count)]
    arguments = {"x-message-ttl": args.ttl_ms, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    if args.queue_type != "classic":
        arguments["x-queue-type"] = args.queue_type
    client = declare_pipelined.connect(args.url)
    requests = [declare_frame("dead", {})] + [declare_frame(name, arguments) for name in names]
    declare_pipelined.pipelined(client, requests, rawamqp.QUEUE_DECLARE_OK, args.window, lambda _: None, "declare")
    declare_pipelined.publish(client, names, args.messages, 16, args.window)
    client.close()


if __name__ == "__main__":
    main()
