#!/usr/bin/env python3
"""Runs a command and records its wall time and CPU time (user + system, all threads).

usage: measure.py OUT.json COMMAND [ARGS...]
The command's output passes through; its exit code is ours.
"""
import json
import os
import subprocess
import sys
import time

out_path, command = sys.argv[1], sys.argv[2:]
def load_average():
    # The machine may be shared: record how busy it was, so a result can be judged.
    try:
        with open("/proc/loadavg") as handle:
            return float(handle.read().split()[0])
    except OSError:
        return None


load_before = load_average()
start = time.monotonic()
process = subprocess.Popen(command)
_, status, usage = os.wait4(process.pid, 0)
wall_s = time.monotonic() - start
with open(out_path, "w") as out:
    json.dump({"command": command, "wall_s": wall_s, "user_s": usage.ru_utime, "system_s": usage.ru_stime,
               "cpu_s": usage.ru_utime + usage.ru_stime,
               "load_average_1m_before": load_before, "load_average_1m_after": load_average()}, out, indent=1)
sys.exit(os.waitstatus_to_exitcode(status))
