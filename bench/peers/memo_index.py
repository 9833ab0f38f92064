"""The row memo's lookup index (pipeline/memo/index.py: NamespaceIndex) at 1M rows: bytes a row, building it,
and what a new pack costs, against the index it replaced (measured here, in the same run).

    python -m bench.peers.memo_index [--rows 1000000] [--pack 10000]

Ours: two sorted uint64 arrays (8-byte key prefix; pack << 32 | row), 16 bytes a row; a new pack's rows are sorted
alone and inserted (searchsorted + insert). The peer, the index before: a uint64 prefix and an int64 (pack, row)
pair, 24 bytes a row, concatenated and argsorted in full whenever a pack appears. Random 16-byte keys, packs of
`pack` rows (a shard computation's pack).
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def _peer_add(prefix: np.ndarray, where: np.ndarray, new_prefix: np.ndarray, number: int):
    """The index before: everything concatenated and sorted again."""
    rows = len(new_prefix)
    prefix = np.concatenate([prefix, new_prefix])
    where = np.concatenate([where, np.column_stack([np.full(rows, number, np.int64), np.arange(rows)])])
    order = np.argsort(prefix, kind="stable")
    return prefix[order], where[order]


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def run(rows: int = 1_000_000, pack: int = 10_000) -> list[dict]:
    from bench import smoke
    from contramine.pipeline.memo.index import NamespaceIndex

    rows, pack = smoke.cap(rows, 20_000), smoke.cap(pack, 1_000)
    rng = np.random.default_rng(0)
    prefixes = rng.integers(0, 2**64, rows, dtype=np.uint64, endpoint=False)
    packs = rows // pack

    def loc(number: int) -> np.ndarray:
        return (np.uint64(number) << np.uint64(32)) | np.arange(pack, dtype=np.uint64)

    # a full index, built at once (the first lookup in a warm namespace)
    def ours_build():
        ix = NamespaceIndex("bench")
        ix.merge(prefixes, np.concatenate([loc(k) for k in range(packs)]))
        return ix

    def peer_build():
        return _peer_add(np.zeros(0, np.uint64), np.zeros((0, 2), np.int64), prefixes, 0)

    ours_t, peer_t = _best(ours_build), _best(peer_build)
    ours_ix, (peer_p, peer_w) = ours_build(), peer_build()
    ours_bytes, peer_bytes = ours_ix.nbytes / rows, (peer_p.nbytes + peer_w.nbytes) / rows

    # one more pack appears in a full index (what every shard of a running stage adds)
    extra = rng.integers(0, 2**64, pack, dtype=np.uint64, endpoint=False)

    def ours_add():
        ix = NamespaceIndex("bench")
        ix.prefix, ix.loc = ours_ix.prefix, ours_ix.loc
        ix.merge(extra, loc(packs))

    ours_a, peer_a = _best(ours_add), _best(lambda: _peer_add(peer_p, peer_w, extra, packs))
    print(f"memo index at {rows:,} rows ({packs} packs of {pack:,}): {ours_bytes:.1f} B/row (before: "
          f"{peer_bytes:.1f}); built at once {ours_t * 1e3:.0f} ms (before {peer_t * 1e3:.0f} ms); a pack more "
          f"{ours_a * 1e3:.1f} ms (before {peer_a * 1e3:.1f} ms)")
    return [
        {"name": f"memo_index_bytes_per_row_{rows}", "ours": round(ours_bytes, 2), "peer": round(peer_bytes, 2),
         "unit": "B/row", "ratio": round(ours_bytes / peer_bytes, 3), "goal": 16 / 24, "better": "lower"},
        {"name": f"memo_index_build_{rows}", "ours": round(ours_t, 4), "peer": round(peer_t, 4), "unit": "s",
         "ratio": round(ours_t / peer_t, 3), "goal": 1.25, "better": "lower"},  # an argsort either way
        {"name": f"memo_index_add_pack_{rows}", "ours": round(ours_a, 4), "peer": round(peer_a, 4), "unit": "s",
         "ratio": round(ours_a / peer_a, 3), "goal": 1.0, "better": "lower"},
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--pack", type=int, default=10_000)
    a = p.parse_args(argv)
    for r in run(a.rows, a.pack):
        print(r)


if __name__ == "__main__":
    main()
