"""`runner.kind = "dask-local"`: the local cluster speaks TLS only and lets in no peer without its own certificate.
Another account of the host can reach 127.0.0.1's ports; a Dask client there would run code on the workers as the
miner. The miner's own maps (pipeline/engine/maps.py) and the flows' task runner (flows/mine.py) connect with the
cluster's certificate; test_scaleout.py mines a whole run on such a cluster."""
from __future__ import annotations

import asyncio
import os
import socket
import ssl
from urllib.parse import urlsplit

import pytest
from distributed import Client
from distributed.comm import connect
from distributed.security import Security

from contramine.flows.mine import task_runner
from contramine.pipeline.config import configure
from contramine.pipeline.engine.maps import dask_map, local_cluster


def _connect(address: str, **connection_args) -> None:
    async def attempt():
        comm = await connect(address, timeout=10, **connection_args)
        await comm.close()
    asyncio.run(attempt())


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(1) as c:
        yield c


def test_the_local_cluster_refuses_a_client_without_its_certificate(cluster):
    address = cluster.scheduler_address
    assert address.startswith("tls://127.0.0.1:")
    with pytest.raises(TypeError, match="TLS expects a `ssl_context`"):  # a plain Client(address)
        Client(address, timeout=5)
    # below a Client (one client's IO loop a test, on a loaded machine): the connection itself, as a Client makes it
    with pytest.raises(OSError):  # the same port spoken to in plain TCP
        _connect(address.replace("tls://", "tcp://"))
    with pytest.raises(OSError, match="TLS certificate does not match"):  # a certificate of its own
        _connect(address, **Security.temporary().get_connection_args("client"))
    _connect(address, **cluster.security.get_connection_args("client"))  # the cluster's own: let in
    # a TLS client that trusts any server and shows no certificate: the scheduler says nothing but its refusal
    where = urlsplit(address)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((where.hostname, where.port), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw) as tls:
                got = tls.recv(1024)
        except (ssl.SSLError, ConnectionError):
            got = b""
    assert got == b""


def test_the_miners_own_maps_and_task_runner_hold_the_certificate(cluster, tmp_path):
    pids = dask_map(cluster.scheduler_address, os.getpid)([{}, {}])
    assert len(set(pids)) == 1 and pids[0] != os.getpid()  # ran in the worker process
    cfg = configure("default", "tls", None, ["runner.kind=dask", f"runner.address={cluster.scheduler_address}",
                                             f"run.root={tmp_path}"])
    runner = task_runner(cfg)
    assert runner.client_kwargs["security"] is cluster.security
    with runner:  # what a stage flow enters: a client connected over the cluster's TLS
        assert runner.client.run(os.getpid) == {w: pids[0] for w in cluster.scheduler_info["workers"]}


def test_no_port_of_the_cluster_serves_plain_http(cluster):
    """distributed starts HTTP servers whatever the dashboard setting: the scheduler's on 127.0.0.1:8787 served the
    workers' logs, call stacks and identity to any local account. None of the cluster's processes serves a page."""
    import subprocess
    import urllib.error
    import urllib.request

    pids = {os.getpid(), *dask_map(cluster.scheduler_address, os.getpid)([{}])}
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
    ports = {int(line.split()[3].rsplit(":", 1)[1]) for line in listening
             if any(f"pid={pid}," in line for pid in pids) and "127.0.0.1:" in line}
    tls = {urlsplit(cluster.scheduler_address).port, *(urlsplit(w).port for w in cluster.scheduler_info["workers"])}
    assert ports and 8787 not in ports
    for port in ports - tls:
        for path in ("/health", "/json/identity.json", "/info/main/logs.html", "/metrics"):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5)
                raise AssertionError(f"port {port} served {path}")
            except urllib.error.HTTPError as e:
                assert e.code == 404, (port, path, e.code)
            except (urllib.error.URLError, ConnectionError, OSError):
                pass  # not HTTP, or closed: nothing served
