"""Shared by the mining reliability tests: the small settings, one-call mining and reading back every table."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pyarrow as pa

from contramine.flows.cli import main as cli_main
from contramine.flows.mine import configure, mine_flow
from contramine.pipeline.engine.runner import load_stages
from contramine.pipeline.storage.store import Store
from contramine.pipeline.storage.tables import RunTables
from contramine.pipeline.schema import table_vectors
from contramine.pipeline.search.band import exact_band_neighbours
from child_env import CHILD_PYTHONPATH

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=2",
         "backtranslate.chains=[]"]
STAGES = load_stages()
ORDER = list(STAGES)
TABLES = [t for s in STAGES.values() for t in s.writes]


def _mine(corpus: Path, root: Path, name: str, *extra: str):
    sets = SMALL + [f"run.root={root}", *extra]
    mine_flow(profile="default", run=name, corpus=str(corpus), overrides=sets)
    return configure("default", name, str(corpus), sets)


def _tables(run_dir: Path) -> dict[str, pa.Table]:
    tables = RunTables(run_dir)
    return {t: tables.read(t) for t in TABLES}


def _cli_env(**extra) -> dict:
    import prefect.settings

    env = {**os.environ, "PREFECT_API_URL": prefect.settings.PREFECT_API_URL.value(), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": CHILD_PYTHONPATH}
    env.update(extra)
    return env


def _manifest(run_dir: Path, table: str) -> dict:
    return Store(run_dir).manifest(table)


def _brute_force(t, lo, hi, pool):
    sids, x = table_vectors(t["embeddings"])
    return exact_band_neighbours(x, sids, x, sids, lo, hi, pool)


def _cli_error(capsys, root: Path, argv: list[str], sets: list[str] = ()) -> str:
    capsys.readouterr()
    code = cli_main([*argv, "--set", *SMALL, f"run.root={root}", *sets])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert not root.exists() or not any(root.iterdir()), f"{argv}: wrote under the run root"
    return lines[0]


def table_hashes(run_dir: Path, columns: dict[str, list[str]] | None = None) -> dict[str, list]:
    """{table: [rows, sha256 of its Arrow IPC stream (16 hex)]} for every finished table, read from the Parquet
    parts the manifest names: a content fingerprint independent of the Parquet writer's version."""
    import pyarrow.parquet as pq

    out = {}
    for d in sorted(p for p in Path(run_dir).iterdir() if (p / "_manifest.json").is_file()):
        files = RunTables(run_dir).files(d.name)
        t = pa.concat_tables([pq.read_table(f) for f in files]).combine_chunks()
        if d.name in (columns or {}):  # the columns the pinned hash covers (a contract adds, never renames)
            t = t.select(columns[d.name])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        out[d.name] = [t.num_rows, hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]]
    return out
