"""The host bench's search jobs (bench/host/jobs.py runs them): the band search with the torch engine as it runs on
a GPU (`search`), and the host's resolve of an index that only has `search(x, k)` (`resolve`).
"""
from __future__ import annotations

from pathlib import Path

from bench.host.hollow import WIDTH, HollowIndex
from bench.host.measure import best_of, count_ops, from_config

SEARCH_BASE = 128  # the base of the per-block measurement: each block's score GEMM and top-k shrunk to a sliver
SEARCH_PROBE_BLOCKS = 3  # blocks timed in that measurement, each of as many queries as a GPU block takes
GPU_MEMORY = 76e9  # bytes free on an 80 GB card with the 1M x 384 base loaded: what sizes a GPU's blocks


def gpu_block_rows(n_base: int = 1_000_000) -> int:
    """Queries per block that the checkout's torch engine takes on an 80 GB GPU against a 1M base: band()'s memory
    rule where the checkout has it, else search()'s fixed block of scores (the code before issue 46)."""
    from contramine.pipeline.search import torch_exact as te

    if hasattr(te, "BAND_MAX_ELEMS"):
        return max(1, min(te.BAND_MAX_ELEMS, int(GPU_MEMORY * te.BAND_MEMORY_SHARE) // 12) // n_base)
    return max(1, te.BLOCK_ELEMS["cuda"] // n_base)


def job_search(data: Path, sizes: dict, settings: dict) -> dict:
    """The band search with the torch engine (TorchExact) as it runs on a GPU against a 1M base. The host's time per
    query has two parts, each measured on this CPU:
    - per block: the ops a block launches and the Python around them, paid once per block of the rows the checkout
      takes on an 80 GB card (gpu_block_rows): measured as CPU time per block at that real block size (the queries
      of a GPU block; SEARCH_PROBE_BLOCKS of them, fewer where the data has fewer queries: `probe_rows` says), against
      a SEARCH_BASE-row base of WIDTH coordinates, divided by those rows. The base cannot be real: a 1M base's block
      of scores is 2,147 x 1M floats (8 GiB) and ~1.6 TFLOP at 384-d, a GPU's arithmetic. What a block's rows cost
      against the small base (its GEMM, top-k and resolve over 128 candidates) still counts: an upper bound;
    - per query: what the host does for each query whatever the blocks. Where the engine hands the pools' resolve to
      the host (before issue 46: `search` returns the top-k, numpy ranks and rescores them), that is the resolve of
      the real queries (job_resolve's measurement: 384-d topic vectors, the neighbours defaults); where the engine
      resolves on its device (`TorchExact.band`), the host only copies the finished pools back and builds the table
      (band.Pools.put + table over the same queries' pools)."""
    import numpy as np

    from contramine.pipeline.config.mining import NeighboursCfg
    from contramine.pipeline.search import band
    from contramine.pipeline.search.torch_exact import TorchExact

    z = np.load(data / "search.npz")
    x = np.ascontiguousarray(z["base"][:, :WIDTH], dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    c = NeighboursCfg()
    base, sids = x[:SEARCH_BASE], np.arange(len(x), dtype=np.int64)
    rows = gpu_block_rows()
    probe = x[:min(len(x), SEARCH_PROBE_BLOCKS * rows)]
    probe_rows = min(rows, len(probe))  # the real block size, unless the data has fewer queries (smoke sizes)
    index = TorchExact(base, "cpu", block_rows=probe_rows, **settings)

    def blocks():
        band.band_neighbours(probe, sids[:len(probe)], base, sids[:SEARCH_BASE], index, index, c.lo, c.hi,
                             c.pool_size, **from_config(c, band.band_neighbours))

    blocks()  # warm-up
    n_blocks = -(-len(probe) // probe_rows)
    per_block = {k: v / n_blocks for k, v in best_of(blocks, sizes["repeats"]).items()}
    if hasattr(TorchExact, "band"):  # the resolve runs on the device: the host copies pools and builds the table
        real = job_resolve(data, dict(sizes, count=False), {})  # its pools: the real queries' (not timed here)
        table = real.pop("table")
        q = np.asarray(table.column("sid"))
        n_q = len(z["base"])
        counts = np.bincount(q, minlength=n_q)
        cand = np.full((n_q, c.pool_size), -1, np.int64)
        cos = np.zeros((n_q, c.pool_size), np.float64)
        rank = np.asarray(table.column("rank")) - 1
        cand[q, rank], cos[q, rank] = np.asarray(table.column("cand_sid")), np.asarray(table.column("cos"))

        def per_query_host():
            pools = band.Pools(n_q, c.pool_size)
            for a in range(0, n_q, rows):
                pools.put(slice(a, a + rows), cand[a:a + rows].copy(), cos[a:a + rows].copy(), counts[a:a + rows])
            pools.table(np.arange(n_q))

        host = {k: v / n_q for k, v in best_of(per_query_host, sizes["repeats"]).items()}
        where = "the pools copied back and the table built"
    else:  # the host resolves every block: the resolve job's time per query on the real queries
        real = job_resolve(data, dict(sizes, count=False), {})
        real.pop("table")
        host = {"seconds": real["seconds"] / real["units"], "cpu_s": real["cpu_s"] / real["units"]}
        where = "numpy's resolve of every block"
    per_query = {k: per_block[k] / rows + host[k] for k in ("seconds", "cpu_s")}
    n = len(z["base"])  # stated per query: the units the row divides by
    return {"units": n, "seconds": per_query["seconds"] * n, "cpu_s": per_query["cpu_s"] * n,
            "block_rows": rows, "probe_rows": probe_rows, "block_ms": per_block["cpu_s"] * 1e3,
            "host_query_us": host["cpu_s"] * 1e6,
            "host_part": where, "pool_rows": real["pool_rows"], "base": SEARCH_BASE,
            **count_ops(blocks, n_blocks * rows, sizes)}  # ops a block over the queries a GPU block holds


def job_resolve(data: Path, sizes: dict, settings: dict) -> dict:
    """`band_neighbours` over the HollowIndex at the neighbours stage's defaults, every base row a query: the host's
    resolve of an index that only has `search(x, k)` (FAISS on a CPU or a GPU), the GEMM and top-k done beforehand."""
    import inspect

    import numpy as np

    from contramine.pipeline.config.mining import NeighboursCfg
    from contramine.pipeline.search.band import band_neighbours

    z = np.load(data / "search.npz")
    base, index = z["base"], HollowIndex(z["base"], z["D"], z["I"])
    sids = np.arange(len(base), dtype=np.int64)
    c = NeighboursCfg()
    params = inspect.signature(band_neighbours).parameters
    kw = from_config(c, band_neighbours)  # slack, max_block_elems, skip_top, ... as the stage passes them
    unknown = set(settings) - set(params)
    if unknown:
        raise SystemExit(f"host bench: unknown setting(s) {sorted(unknown)} for band_neighbours")
    kw |= settings
    def run(q: int):
        return band_neighbours(base[:q], sids[:q], base, sids, index, index, c.lo, c.hi, c.pool_size, **kw)

    run(max(1, len(base) // 20))  # warm-up
    table = None

    def timed():
        nonlocal table
        table = run(len(base))

    timing = best_of(timed, sizes["repeats"])
    sample = max(1, len(base) // 10)
    return {"units": len(base), **timing, "pool_rows": table.num_rows, "base": len(base),
            "k_table": int(z["D"].shape[1]), **count_ops(lambda: run(sample), sample, sizes), "table": table}
