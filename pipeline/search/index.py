"""The `index` resource of the neighbours stage: what searches and against which table, decided once per run before
any shard (`index_plan`: the plan records engine, device, index kind and, for an approximate index, its file and
measured recall), and what each process loads for that plan (`load_index`). An approximate index is built once
into the run folder (`tune_index`) and mapped read-only by every shard thread and worker.
"""
from __future__ import annotations

import json
import logging
import re
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from contramine.pipeline.codeversion import code_version
from contramine.pipeline.config.base import section_constants
from contramine.pipeline.engine.resources import Resource, cuda_device
from contramine.pipeline.errors import StageError, json_loads
from contramine.pipeline.storage.atomic import atomic_file, atomic_write_json
from contramine.pipeline.storage.safe_paths import UnsafePath, check_below, open_folder, read_regular, readable
from contramine.pipeline.storage.store import combine, file_hash
from contramine.pipeline.engine.spec import package_versions
from contramine.pipeline.schema import read_vectors
from contramine.pipeline.search import faiss_index as fx
from contramine.pipeline.search.band import band_neighbours, recall_at_pool
from contramine.pipeline.search.torch_exact import TorchExact, score_precision

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
    the base, the settings and the seed are the same (a rerun neither trains k-means nor builds the graph again), and
    only when its recorded plan checks out (`recorded_plan`): a plan is data in a run folder that may come from
    someone else."""
    c, kind = cfg.neighbours, plan["kind"]
    # every setting that can shape the file (execution settings and the device aside: it is built on the CPU), the
    # section's class constants (MAX_EF_SEARCH: model_dump leaves ClassVars out) and the code that builds it
    settings = {**c.model_dump(mode="json", exclude={*c.EXECUTION, *c.RESOLVED}), **section_constants(c)}
    key = combine(plan["base_hash"], kind, json.dumps(settings, sort_keys=True), str(cfg.run.seed), plan["versions"],
                  code_version(__name__))
    folder = _index_dir(store)
    check_below(store.root, folder, final=True)  # a linked _index/ (or neighbours/): one line before any work
    done = folder / f"{kind}-{key}.json"
    recorded = recorded_plan(store, done, key, kind, n, plan["base"])
    if recorded is not None:
        return recorded
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
            with atomic_file(folder / name, root=store.root) as tmp, open(tmp, "wb") as f:
                np.save(f, arr)
    if "file" in out:
        with atomic_file(folder / out["file"], root=store.root) as tmp:
            fx.faiss.write_index(index, str(tmp))
    # the plan is data the next run checks before it trusts it (recorded_plan): the hashes of the files it names
    hashes = {out[f]: _hash(store, folder / out[f]) for f in PLAN_FILES if f in out}
    atomic_write_json(done, {**out, "hashes": hashes}, root=store.root)
    # another base's or other settings' index is no longer this run's: removed once this one is whole (a build killed
    # half-way leaves the last complete index in place); only names this module writes, never a link's target
    mine = {done.name, *hashes}
    with open_folder(store.root, folder) as d:
        for e in d.entries():
            if e.name not in mine:
                d.unlink(e.name, OWN)
    return out


PLAN_FILES = ("file", "vectors", "sids")  # the keys of a plan that name a file in _index/
_NAME = r"(?:(?:flat|ivf|hnsw)-[0-9a-f]{32}\.(?:json|faiss)|(?:sids|vectors)-[0-9a-f]{32}\.npy)"
OWN = re.compile(rf"{_NAME}|\.{_NAME}\.[a-z0-9_]+\.tmp")  # what this module writes in _index/ (and its temp files)


def _hash(store, path: Path) -> str:
    with readable(store.root, path) as p:
        return file_hash(p)


def recorded_plan(store, done: Path, key: str, kind: str, n: int, base: str) -> dict | None:
    """The plan an earlier run recorded at `done` for this key, when it is whole and what this module writes: the
    files it names are exactly this key's names in _index/ (never a path elsewhere for faiss.read_index), plain
    files, of the hashes it records, and its sids are the base table's (never ids no sentence has). Anything else
    is named in one warning and built again; None then, or when there is none. A linked _index/ is UnsafePath."""
    want = {"file": f"{kind}-{key}.faiss", "vectors": f"vectors-{key}.npy", "sids": f"sids-{key}.npy"}
    try:
        with readable(store.root, done) as p:
            out = json_loads(read_regular(p, follow=True, max_size=1 << 20))  # a plan is ~1 KB: fstat first
        if not isinstance(out, dict) or "sids" not in out or not isinstance(out.get("hashes"), dict):
            raise ValueError("is not an index plan this version writes (no file hashes)")
        for f in PLAN_FILES:
            if f in out and out[f] != want[f]:
                raise ValueError(f"names {out[f]!r} as its {f}, not {want[f]!r} in {done.parent}")
            if f in out and out["hashes"].get(out[f]) != _hash(store, done.parent / out[f]):
                raise ValueError(f"records another hash for {out[f]} than the file has")
        with readable(store.root, done.parent / out["sids"]) as p:
            sids = np.load(p, allow_pickle=False)
        if not np.array_equal(sids, _base_sids(store, base, n)):
            raise ValueError(f"has sids that are not the rows of `{base}`")
    except FileNotFoundError:
        return None
    except (ValueError, UnsafePath, OSError) as e:  # json and numpy errors are ValueErrors
        log.warning(f"neighbours: the index plan {done} {e}: building the index again")
        return None
    return {k: v for k, v in out.items() if k != "hashes"}


def _base_sids(store, table: str, n: int) -> np.ndarray:
    parts = [pq.read_table(store.shard_path(table, i, n), columns=["sid"]).column("sid").to_numpy() for i in range(n)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


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
    its vectors, so shard threads and the workers of a machine share one copy in the page cache. A file the plan
    names must be one of _index/'s own names, opened without following a link (UnsafePath otherwise)."""
    if plan.get("engine") == "torch":  # exact, in torch matmuls on this process' device; no FAISS
        base_sids, base = read_vectors(store, plan["base"], n)
        device = cuda_device("cpu" if plan["device"] == "cpu" else "cuda", "the neighbours torch search")
        precision = score_precision(cfg.neighbours.score_precision, device)  # auto: bf16 on a GPU, else float32
        exact = TorchExact(base, device, precision=precision) if len(base_sids) else None
        return base_sids, base, exact, exact
    with ExitStack() as opened:
        def path(f: str) -> str:  # the plan's file, checked to be one of _index/'s own names, opened without a link
            if not isinstance(plan.get(f), str) or not OWN.fullmatch(plan[f]) or plan[f].startswith("."):
                raise UnsafePath(f"the neighbours plan names {plan.get(f)!r} as its {f}: not a file of "
                                 f"{_index_dir(store)}")
            return str(opened.enter_context(readable(store.root, _index_dir(store) / plan[f])))

        if plan["kind"] == "flat" and "vectors" in plan:  # exact past exact_threshold: over the mapped vectors
            base = np.load(path("vectors"), mmap_mode="r")
            brute = fx.BruteForce(base)  # faiss.knn: the kernel IndexFlatIP.search runs, without a copy of the base
            return np.load(path("sids")), base, brute, brute
        if plan["kind"] == "flat" or not plan["rows"]:
            base_sids, base = read_vectors(store, plan["base"], n)
            index, cpu_index = fx.build_index(base, plan["kind"], cfg.neighbours, cfg.run.seed,
                                              gpu=fx.faiss_gpus_for_plan(plan) > 0) if len(base_sids) else (None, None)
            return base_sids, base, index, cpu_index
        # IVF's lists and HNSW's stored vectors are mapped, not read: one copy per machine, in the page cache
        mapped = fx.faiss.IO_FLAG_MMAP if plan["kind"] == "ivf" else fx.faiss.IO_FLAG_MMAP_IFC  # (FAISS takes one)
        index = fx.faiss.read_index(path("file"), mapped)
        if plan["kind"] == "ivf":
            index.nprobe = plan["nprobe"]
            base = np.load(path("vectors"), mmap_mode="r")
        else:
            index.hnsw.efSearch = plan["ef_search"]
            base = fx.stored_vectors(index)  # a view of the mapped graph's vectors: no second copy
        sids = np.load(path("sids"))
    if plan["device"] == "gpu":  # IVF on a GPU (index = "ivf" there): this process' device holds its own copy
        return sids, base, fx.GpuIndex(fx.to_gpu(index, fx.faiss_gpus_for_plan(plan))), index
    return sids, base, index, index


INDEX = Resource("index", index_plan, load_index, reads=("neighbours", "run"))
