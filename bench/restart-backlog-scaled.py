#!/usr/bin/env python3
"""Makes a data directory shaped like a backlog COPIES times larger than a real one, without the
disk space: every sealed segment of the real queue is hard-linked COPIES times under new names
(positions shifted past the previous copy) and the queue's index gets a summary for each link
(the real summaries, shifted, checksums recomputed). A start of such a directory does exactly
what a start of the large backlog does (read the index, check each segment file's length, read
the newest segment and the journal), so it measures the start's cost at that size where the disk
cannot hold the real thing; the messages cannot be drained (the linked records keep their old
positions), so use it for the start only.

Usage: bench/restart-backlog-scaled.py SOURCE_DATA_DIR TARGET_DATA_DIR COPIES
(SOURCE_DATA_DIR is `data` under a directory `bench/restart-backlog.sh` kept with KEEP=1; run
that script with DATA_DIR=the parent of TARGET_DATA_DIR to measure.)
"""
import os
import shutil
import struct
import sys

INDEX_SEED = 0x1D3EC0DE
_TABLE = []
for n in range(256):
    crc = n
    for _ in range(8):
        crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    _TABLE.append(crc)


def crc32c_append(crc, data):
    """As the crc32c crate's crc32c_append: continues the CRC32C `crc` over `data`."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def decode_index(data):
    entries, at = [], 0
    while at + 8 <= len(data):
        length, crc = struct.unpack(">II", data[at:at + 8])
        payload = data[at + 8:at + 8 + length]
        if length == 0 or len(payload) < length or crc32c_append(INDEX_SEED, payload) != crc:
            break
        first, seed, valid, header_term, end_term, position_end = struct.unpack(">QIQQQQ", payload[:44])
        rest, sets = payload[44:], []
        for _ in range(3):
            (count,) = struct.unpack(">I", rest[:4])
            sets.append([struct.unpack(">QQ", rest[4 + 16 * i:20 + 16 * i]) for i in range(count)])
            rest = rest[4 + 16 * count:]
        entries.append([first, seed, valid, header_term, end_term, position_end, sets])
        at += 8 + length
    return entries


def encode(entry, shift):
    first, seed, valid, header_term, end_term, position_end, sets = entry
    payload = struct.pack(">QIQQQQ", first + shift, seed, valid, header_term, end_term, position_end + shift)
    for ranges in sets:
        payload += struct.pack(">I", len(ranges))
        for start, end in ranges:
            payload += struct.pack(">QQ", start + shift, end + shift)
    return struct.pack(">II", len(payload), crc32c_append(INDEX_SEED, payload)) + payload


def main():
    source, target, copies = sys.argv[1], sys.argv[2], int(sys.argv[3])
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.seg", "*.spare", "segments.idx"))
    queues = os.path.join(source, "queues")
    (queue,) = os.listdir(queues)
    entries = decode_index(open(os.path.join(queues, queue, "segments.idx"), "rb").read())
    by_first = {}
    for entry in entries:
        by_first[entry[0]] = entry  # a later entry for the same segment wins
    names = sorted(name for name in os.listdir(os.path.join(queues, queue)) if name.endswith(".seg"))
    firsts = [int(name[:-4]) for name in names]
    assert all(first in by_first for first in firsts), "a segment without a summary: start the broker on the source once"
    span = max(by_first[first][5] for first in firsts)
    index = bytearray()
    for copy in range(copies):
        shift = copy * span
        for first in firsts:
            os.link(os.path.join(queues, queue, "%020d.seg" % first), os.path.join(target, "queues", queue, "%020d.seg" % (first + shift)))
            index += encode(by_first[first], shift)
    with open(os.path.join(target, "queues", queue, "segments.idx"), "wb") as f:
        f.write(index)
    print("%d segments, %.1f GiB apparent, index %d bytes" % (copies * len(firsts), copies * sum(
        os.path.getsize(os.path.join(queues, queue, name)) for name in names) / 2**30, len(index)))


if __name__ == "__main__":
    main()
