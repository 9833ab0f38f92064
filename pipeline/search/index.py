"""The `index` resource of the neighbours stage: what searches and against which table, decided once per run before
any shard (`index_plan`: the plan records engine, device, index kind and, for an approximate index, its file and
measured recall), and what each process loads for that plan (`load_index`). An approximate index is built once
into the run folder (`tune_index`) and mapped read-only by every shard thread and worker.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from pipeline.config.base import section_constants
from pipeline.engine.resources import Resource
from pipeline.engine.spec import package_versions
from pipeline.schema import read_vectors
from pipeline.search import faiss_index as fx
from pipeline.search.band import band_neighbours, recall_at_pool

log = logging.getLogger(__name__)


def index_facts(cfg, store, n: int, plan: dict | None = None) -> dict:
    """For the manifest: the index the run searched, its parameters and its measured recall (the plan)."""
    p = (plan or {}).get("index", {})
    return {"index": p.get("kind"), "exact": p.get("kind") == "flat", "engine": p.get("engine"),
            **{k: p[k] for k in ("nlist", "nprobe", "hnsw_m", "ef_search", "recall", "recall_sample",
                                 "recall_by_nprobe", "recall_by_ef_search", "fallback") if k in p}}


def base_table(cfg) -> str:
    """What the queries are searched against: the `data.candidates` corpus' vectors, else the anchors' own."""
    return "pool_embeddings" if cfg.data.candidates is not None else "embeddings"


def index_plan(cfg, store, n: int, plan: dict | None = None) -> dict:
    """The run's search index, decided before any shard: its kind (index = auto: flat or IVF by the base's size,
    flat on a GPU), where it searches, FAISS' version; for an approximate index also the file it is built into once
    per run (every shard thread and worker maps it read-only) and its recall, measured first (`tune_index`)."""
    c, table = cfg.neighbours, base_table(cfg)
    rows = sum(store.cached_rows(table, i, n) for i in range(n))
    engine, gpu = fx.search_engine(c)
    kind = "flat" if engine == "torch" else fx.choose_index(rows, c, 1 if gpu else 0)
    plan = {"base": table, "base_hash": store.table_hash(table, n), "rows": rows, "kind": kind, "engine": engine,
            "device": "gpu" if gpu and kind != "hnsw" else "cpu",
            "versions": package_versions(*(("torch",) if engine == "torch" else ("faiss-cpu", "faiss-gpu")))}
    if kind != "flat" and rows:
        plan.update(tune_index(cfg, store, n, plan))
    return plan


KNOB = {"ivf": "nprobe", "hnsw": "ef_search"}  # the setting each approximate index is tuned by (measure_recall)


def _index_dir(store) -> Path:
    return store.dir("neighbours") / "_index"


def tune_index(cfg, store, n: int, plan: dict) -> dict:
    """Build the approximate index once, into the run folder (IVF with the base vectors as .npy; HNSW's graph holds
    them), mapped read-only by whoever searches, and measure its recall of the exact pool on a seeded sample of
    queries before any shard is searched. nprobe / ef_search = "auto": raised until the sample's recall reaches
    min_recall (`measure_recall`); a fixed value below min_recall stops the run here, in one line. Reused while
    the base, the settings and the seed are the same (a rerun neither trains k-means nor builds the graph again)."""
    from pipeline.engine.atomic import atomic_file, atomic_write_json
    from pipeline.engine.store import combine
    from pipeline.errors import StageError

    from pipeline.engine.codeversion import code_version

    c, kind = cfg.neighbours, plan["kind"]
    # every setting that can shape the file (execution settings and the device aside: it is built on the CPU), the
    # section's class constants (MAX_EF_SEARCH: model_dump leaves ClassVars out) and the code that builds it
    settings = {**c.model_dump(mode="json", exclude={*c.EXECUTION, *c.RESOLVED}), **section_constants(c)}
    key = combine(plan["base_hash"], kind, json.dumps(settings, sort_keys=True), str(cfg.run.seed), plan["versions"],
                  code_version(__name__))
    folder = _index_dir(store)
    done = folder / f"{kind}-{key}.json"
    if done.is_file():
        out = json.loads(done.read_text())
        if all((folder / out[f]).is_file() for f in ("file", "vectors", "sids") if f in out):
            return out
    folder.mkdir(parents=True, exist_ok=True)
    base_sids, base = read_vectors(store, plan["base"], n)
    index, _ = fx.build_index(base, kind, c, cfg.run.seed, gpu=False)
    if kind == "hnsw":  # the graph holds the vectors: search against its copy, and let the table's go
        base = fx.stored_vectors(index)
    q_sids, q = read_vectors(store, "embeddings", n) if plan["base"] != "embeddings" else (base_sids, base)
    out = measure_recall(index, kind, base, base_sids, q, q_sids, c, cfg.run.seed)
    knob = KNOB[kind]
    if out["recall"] < c.min_recall and c.index == "auto" and getattr(c, knob) == "auto":
        # auto's approximate index cannot reach min_recall on these vectors: search exactly instead (slower, never
        # wrong), from the vectors mapped read-only like an index, and say so
        log.warning(f"neighbours: {kind} finds {out['recall']:.3f} of the exact pool at {knob} {out[knob]} (its "
                    f"largest; < min_recall {c.min_recall}): index = auto searches exactly (flat) instead")
        out = {"kind": "flat", "recall": 1.0, "fallback": {"kind": kind, **out}}
    elif out["recall"] < c.min_recall:
        how = f"set neighbours.{knob} = 'auto' (or raise it)" if getattr(c, knob) != "auto" else \
            f"{knob} 'auto' stopped at its largest value"
        raise StageError(f"neighbours: the {kind} index ({knob} {out[knob]}) finds {out['recall']:.3f} of the exact "
                         f"pool on {out['recall_sample']} sampled queries (< neighbours.min_recall {c.min_recall}): "
                         f"{how}, or neighbours.index = 'flat' (exact; fast on a GPU)")
    out["sids"] = f"sids-{key}.npy"
    if out.get("kind", kind) != "hnsw":  # HNSW's graph holds the vectors; IVF's lists hold them in list order,
        out["vectors"] = f"vectors-{key}.npy"  # so the band search (and exact search) reads them by row from here
    if "fallback" not in out:
        out["file"] = f"{kind}-{key}.faiss"
    for name, arr in ((out.get("vectors"), base), (out["sids"], base_sids)):
        if name:
            with atomic_file(folder / name) as tmp, open(tmp, "wb") as f:
                np.save(f, arr)
    if "file" in out:
        with atomic_file(folder / out["file"]) as tmp:
            fx.faiss.write_index(index, str(tmp))
    atomic_write_json(done, out)
    # another base's or other settings' index is no longer this run's: removed once this one is whole (a build killed
    # half-way leaves the last complete index in place)
    mine = {done.name, *(out[f] for f in ("file", "vectors", "sids") if f in out)}
    for old in folder.iterdir():
        if old.name not in mine:
            old.unlink(missing_ok=True)
    return out


def measure_recall(index, kind: str, base, base_sids, q, q_sids, c, seed: int) -> dict:
    """The approximate index's recall of the exact pool on a seeded sample of the queries (exact: `BruteForce` in
    float32 blocks, settled in float64 by the band search). IVF with nprobe = "auto": nprobe doubled from 8 until the
    recall reaches c.min_recall (at nlist IVF is exhaustive); HNSW with ef_search = "auto": efSearch doubled from
    `ef_search_start` up to MAX_EF_SEARCH. The value chosen is left set on `index`."""
    pick = np.sort(np.random.default_rng(seed).choice(len(q_sids), min(len(q_sids), c.recall_sample), replace=False))
    search = lambda ix: band_neighbours(q[pick], q_sids[pick], base, base_sids, ix, ix, c.lo, c.hi,  # noqa: E731
                                        c.pool_size, c.slack, c.max_block_elems, skip_top=c.skip_top)
    exact = search(fx.BruteForce(base))
    out: dict = {"recall_sample": int(len(pick))}
    knob = KNOB[kind]
    setting = getattr(c, knob)  # "auto" or the value asked for
    if kind == "ivf":
        nlist, what = index.nlist, f"IVF, nlist {index.nlist}"
        values = sorted({min(nlist, 8 << i) for i in range(int(np.log2(max(nlist, 8) / 8)) + 2)})
        out["nlist"] = nlist
    else:
        what = f"HNSW, M {c.hnsw_m}"
        start = fx.ef_search_start(c)
        values = [start << i for i in range(int(np.log2(max(c.MAX_EF_SEARCH, start) // start)) + 1)]
        out["hnsw_m"] = c.hnsw_m
    if setting != "auto":
        values = [min(setting, nlist) if kind == "ivf" else setting]
    history: dict[str, float] = {}
    for value in values:
        if kind == "ivf":
            index.nprobe = value
        else:
            index.hnsw.efSearch = value
        history[str(value)] = round(recall_at_pool(search(index), exact), 4)
        if history[str(value)] >= c.min_recall:
            break
    log.info(f"neighbours: {what}: {knob} {value} finds {history[str(value)]:.3f} of the exact pool on {len(pick)} "
             f"sampled queries (min_recall {c.min_recall}; tried {history})")
    return {**out, knob: value, "recall": history[str(value)], f"recall_by_{knob}": history}


def load_index(cfg, store, n: int, plan: dict):
    """(base sids, base vectors, search index, CPU index) for the run's plan, once per process: a flat index is
    built from the table (exact; cheap); an approximate one is mapped read-only from the file the plan built, with
    its vectors, so shard threads and the workers of a machine share one copy in the page cache."""
    if plan.get("engine") == "torch":  # exact, in torch matmuls on this process' device; no FAISS
        from pipeline.engine.resources import cuda_device
        from pipeline.search.torch_exact import TorchExact

        base_sids, base = read_vectors(store, plan["base"], n)
        device = cuda_device("cpu" if plan["device"] == "cpu" else "cuda", "the neighbours torch search")
        precision = cfg.neighbours.score_precision if device.startswith("cuda") else "float32"
        exact = TorchExact(base, device, precision=precision) if len(base_sids) else None
        return base_sids, base, exact, exact
    folder = _index_dir(store)
    if plan["kind"] == "flat" and "vectors" in plan:  # exact past exact_threshold: over the mapped vectors
        base = np.load(folder / plan["vectors"], mmap_mode="r")
        exact = fx.BruteForce(base)  # faiss.knn: the kernel IndexFlatIP.search runs, without a copy of the base
        return np.load(folder / plan["sids"]), base, exact, exact
    if plan["kind"] == "flat" or not plan["rows"]:
        base_sids, base = read_vectors(store, plan["base"], n)
        index, cpu_index = fx.build_index(base, plan["kind"], cfg.neighbours, cfg.run.seed,
                                          gpu=fx.faiss_gpus_for_plan(plan) > 0) if len(base_sids) else (None, None)
        return base_sids, base, index, cpu_index
    # IVF's lists and HNSW's stored vectors are mapped, not read: one copy per machine, in the page cache
    mapped = fx.faiss.IO_FLAG_MMAP if plan["kind"] == "ivf" else fx.faiss.IO_FLAG_MMAP_IFC  # (FAISS takes one or other)
    index = fx.faiss.read_index(str(folder / plan["file"]), mapped)
    if plan["kind"] == "ivf":
        index.nprobe = plan["nprobe"]
        base = np.load(folder / plan["vectors"], mmap_mode="r")
    else:
        index.hnsw.efSearch = plan["ef_search"]
        base = fx.stored_vectors(index)  # a view of the mapped graph's vectors: no second copy
    sids = np.load(folder / plan["sids"])
    if plan["device"] == "gpu":  # IVF on a GPU (index = "ivf" there): this process' device holds its own copy
        return sids, base, fx.GpuIndex(fx.to_gpu(index, fx.faiss_gpus_for_plan(plan))), index
    return sids, base, index, index


INDEX = Resource("index", index_plan, load_index, reads=("neighbours", "run"))
