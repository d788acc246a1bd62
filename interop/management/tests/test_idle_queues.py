"""Idle durable queues cost the broker no CPU: once their logs are written, the syncer sleeps until
a log has work (read from the broker's own counters and from /proc)."""

import os
import time

import pytest

QUEUES = 500
IDLE_S = 3.0
SETTLE_TIMEOUT_S = 30.0  # under the suite's 60 s per-test timeout
# The syncer flushes a dirty log within 200 ms (IDLE_FLUSH_INTERVAL_MS): counters unchanged for
# longer than that mean the declarations' writes are done.
SETTLED_AFTER_S = 0.5


def syncer_counters(broker):
    metrics = broker.metrics()
    return (
        metrics[("lepus_storage_syncer_wakeups_total", frozenset())],
        metrics[("lepus_storage_group_commits_total", frozenset())],
    )


def cpu_seconds(pid):
    """utime + stime of the process (fields 14 and 15 of /proc/PID/stat, after the command name)."""
    with open("/proc/%d/stat" % pid) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.lepus_only("reads Lepus's own syncer counters and its process's CPU time")
def test_idle_durable_queues_never_wake_the_syncer(fresh_lepus):
    conn = fresh_lepus.connect()
    try:
        channel = conn.channel()
        for index in range(QUEUES):
            channel.queue_declare("idle-%d" % index, durable=True)
    finally:
        conn.close()
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    settled = syncer_counters(fresh_lepus)
    while True:
        time.sleep(SETTLED_AFTER_S)
        current = syncer_counters(fresh_lepus)
        if current == settled:
            break
        assert time.monotonic() < deadline, "the syncer never went idle with %d idle queues: (wake-ups, group commits) went %s -> %s" % (
            QUEUES, settled, current)
        settled = current
    cpu_before = cpu_seconds(fresh_lepus.process.pid)
    time.sleep(IDLE_S)
    cpu = cpu_seconds(fresh_lepus.process.pid) - cpu_before
    assert syncer_counters(fresh_lepus) == settled, "the syncer woke up with nothing to do"
    # Measured: no tick at all over 60 s with 10,000 idle queues (bench/results/idle-queues.md).
    # 5% of one core leaves room for the metrics scrapes and a loaded CI machine, and is still far
    # below a poll loop (a 1 ms one cost the old syncer several percent of a core per 10,000 logs).
    assert cpu < 0.05 * IDLE_S, "the broker used %.2f s of CPU in %.0f s with %d idle queues" % (cpu, IDLE_S, QUEUES)
