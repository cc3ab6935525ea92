"""The generated encoder's varints (a large number's upper groups from a cache) are Avro's zig-zag
varints, byte for byte, across every group boundary and a millisecond timestamp's range."""

from __future__ import annotations

import io
import random

import fastavro.write

from runlog.schemas._avro_gen import write_long


def _avro(n: int) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, {"type": "long"}, n)
    return buf.getvalue()


def test_varints_match_fastavro_across_group_boundaries_and_timestamps() -> None:
    rng = random.Random(7)
    edges = [s * ((1 << k) + d) for k in range(0, 64) for d in (-1, 0, 1) for s in (1, -1)]
    stamps = [1_765_000_000_000 + rng.randrange(10**9) for _ in range(2000)]
    anywhere = [rng.randrange(-(1 << 63), 1 << 63) for _ in range(2000)]
    for n in [0, 255, 256, 8191, 8192, -(1 << 63), (1 << 63) - 1, *edges, *stamps, *anywhere]:
        if -(1 << 63) <= n < (1 << 63):
            assert write_long(n) == _avro(n), n
            assert write_long(n) == _avro(n), n  # again: from the cache this time
