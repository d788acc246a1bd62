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
start = time.monotonic()
process = subprocess.Popen(command)
_, status, usage = os.wait4(process.pid, 0)
wall_s = time.monotonic() - start
with open(out_path, "w") as out:
    json.dump({"command": command, "wall_s": wall_s, "user_s": usage.ru_utime, "system_s": usage.ru_stime,
               "cpu_s": usage.ru_utime + usage.ru_stime}, out, indent=1)
sys.exit(os.waitstatus_to_exitcode(status))
