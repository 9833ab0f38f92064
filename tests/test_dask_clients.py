"""No Dask client contramine makes is the process's default. prefect-dask's runner takes the default client when
there is one, so in a graph-scheduled mine a stage flow starting while another stage's resource check held its
short-lived client took that client, which then closed under it ("No global client found and no address provided":
test_cluster's killed-worker mine, once). prefect-dask's own clients are not the default either."""
import pytest

from contramine.flows.mine import configure, task_runner
from contramine.pipeline.engine.maps import dask_map, require_resource
from mining_helpers import SMALL


def _default_client_seen():
    from distributed.client import _get_global_client

    return [_get_global_client() is not None]


def test_no_client_of_a_stage_is_the_process_default(tmp_path, small_corpus, monkeypatch):
    distributed = pytest.importorskip("distributed")
    from distributed.client import _get_global_client

    import contramine.pipeline.engine.maps as maps

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
                                  resources={"cuda": 1}) as cluster:
        sets = SMALL + [f"run.root={tmp_path}", "runner.kind=dask", f"runner.address={cluster.scheduler_address}"]
        cfg = configure("default", "d", str(small_corpus), sets)
        # while a map's client is open, a job on the (in-process) worker sees no default client
        assert dask_map(cluster.scheduler_address, _default_client_seen)([{}, {}]) == [[False], [False]]
        # the resource check's client, while open: watched from inside its own scheduler call
        seen = []
        real = distributed.Client.scheduler_info

        def watched(self, *a, **k):
            seen.append(_get_global_client() is not None)
            return real(self, *a, **k)

        monkeypatch.setattr(distributed.Client, "scheduler_info", watched)
        monkeypatch.setattr(maps, "leased_device", lambda plan, leased: "cuda")
        require_resource("embeddings", cfg, {})
        assert seen == [False]
        with task_runner(cfg) as runner:
            assert runner.client.scheduler is not None and _get_global_client() is None
