"""On Dask the card is a worker resource: a local cluster's device worker offers `runner.device_leases` of each
leased device kind and runs every job whose plan puts a model there, one at a time with one lease, while the CPU
workers run the other stages; a cluster of one's own without a worker that offers the resource is one line, not
jobs waiting forever."""
from __future__ import annotations

import pytest

from contramine.flows.mine import mine_flow
from contramine.pipeline.config import configure
from contramine.pipeline.engine.maps import MissingResource
from contramine.pipeline.engine.runner import run_stage
from contramine.pipeline.storage.tables import RunTables

pytestmark = pytest.mark.usefixtures("prefect_harness")

# the stand-in encoder on the CPU, with the CPU leased: embeddings' jobs are device jobs on this machine
LEASED = ["encoder.model=standin:encoder-32", "run.shards=3", "backtranslate.chains=[]",
          "runner.leased_devices=[\"cuda\",\"cpu\"]", "runner.device_leases=1"]


def _corpus(small_corpus, tmp_path, n=60):
    corpus = tmp_path / f"c{n}.txt"
    corpus.write_text("".join(small_corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:n]),
                      encoding="utf-8")
    return corpus


def test_on_dask_local_the_device_worker_runs_the_device_jobs_one_at_a_time(small_corpus, tmp_path):
    corpus = _corpus(small_corpus, tmp_path)
    mine_flow(profile="default", run="res", corpus=str(corpus), only=["sentences", "embeddings", "noise"],
              overrides=LEASED + [f"run.root={tmp_path}", "runner.kind=dask-local", "runner.workers=2"])
    tables = RunTables(tmp_path / "res")
    device = tables.manifest("embeddings")["timeline"]["jobs"]
    cpu = [j for t in ("sentences", "variants") for j in tables.manifest(t)["timeline"]["jobs"]]
    assert len(device) == 3 and cpu
    # Dask's scheduler sent every device job to the one worker that offers the resource, and no CPU job there
    assert all(j["worker"].startswith("dask worker device ") for j in device), device
    assert not any(j["worker"].startswith("dask worker device ") for j in cpu), cpu
    for spans in (sorted(tuple(j["device_held"]) for j in device), sorted((j["began"], j["ended"]) for j in device)):
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:])), spans  # one lease: never two at once


def test_a_cluster_without_a_worker_offering_the_device_is_one_line(small_corpus, tmp_path):
    from distributed import LocalCluster

    corpus = _corpus(small_corpus, tmp_path, 30)
    sets = LEASED + [f"run.root={tmp_path}"]
    run_stage("sentences", configure("default", "ext", str(corpus), sets), log=lambda line: None)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as plain:
        cfg = configure("default", "ext", str(corpus), sets + ["runner.kind=dask",
                                                                 f"runner.address={plain.scheduler_address}"])
        with pytest.raises(MissingResource) as refused:
            run_stage("embeddings", cfg, log=lambda line: None)
    line = str(refused.value)
    assert "\n" not in line and "offers the resource 'cpu'" in line and '--resources "cpu=1"' in line
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None, resources={"cpu": 1}) as card:
        cfg = configure("default", "ext", str(corpus), sets + ["runner.kind=dask",
                                                                 f"runner.address={card.scheduler_address}"])
        manifest = run_stage("embeddings", cfg, log=lambda line: None)
    assert manifest["shards_computed"] == 3
