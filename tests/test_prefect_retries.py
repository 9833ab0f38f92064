"""A Prefect server on this machine that answers 503 (its SQLite database locked by another connection's commit, which
a graph-scheduled mine meets whenever two stage flows start or end together) is asked again within milliseconds,
not after Prefect's 2 + 4 + 8 s backoff, and as often as it takes within Prefect's own 62 s; a remote server keeps
Prefect's backoff (flows/env.py)."""
import os
import subprocess
import sys
import time

import httpx
import pytest

import contramine.flows.mine  # noqa: F401  (installs the retries)
from contramine.flows.env import server_on_this_machine


def _client(url: str, answers: list[int]):
    from prefect.client.base import PrefectHttpxSyncClient

    seen: list[float] = []

    def handler(request):
        seen.append(time.perf_counter())
        return httpx.Response(answers[min(len(seen), len(answers)) - 1], json={})

    return PrefectHttpxSyncClient(transport=httpx.MockTransport(handler), base_url=url,
                                  enable_csrf_support=False), seen


def test_a_locked_local_server_is_asked_again_in_milliseconds():
    client, seen = _client("http://127.0.0.1:4200/api", [503, 503, 200])
    response = client.get("/hello")
    assert response.status_code == 200 and len(seen) == 3
    # 0.05 + 0.1 s with Prefect's jitter, against its own 2 + 4 s
    assert seen[2] - seen[0] < 1.0, f"the two retries took {seen[2] - seen[0]:.2f} s"


def test_a_server_that_stays_locked_fails_after_its_tries_within_prefects_patience(monkeypatch):
    """Every try of the process' PREFECT_CLIENT_MAX_RETRIES (10 here: flows/env.py's default for a server on this
    machine) is made, the waits between them add up to Prefect's own 62 s (each +-30%), and the answer of the last
    try is handed back at once (Prefect waits another 2**(tries + 1) s first)."""
    import prefect.client.base as client_base

    waits: list[float] = []
    monkeypatch.setattr(client_base.time, "sleep", waits.append)  # the waits themselves: recorded, not slept
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

    client, seen = _client("http://127.0.0.1:4200/api", [503])
    with pytest.raises(PrefectHTTPStatusError, match="503"):
        client.get("/hello")

    assert PREFECT_CLIENT_MAX_RETRIES.value() == 10 and len(seen) == 11
    assert waits[-1] == 0 and waits[0] < 0.1, waits
    assert 0.7 * 62 <= sum(waits) <= 1.3 * 62, waits


@pytest.mark.parametrize("url, tries", [(None, "10"), ("http://127.0.0.1:4200/api", "10"),
                                        ("http://10.0.0.7:4200/api", "None")])
def test_more_tries_by_default_only_against_this_machines_server(url, tries):
    """Set before Prefect is imported (it reads its settings then); a user's own number is kept, and a process that
    inherits the default (a CLI child, a Dask worker) tells it from a user's by its mark."""
    mark = "CONTRAMINE_DEFAULT_PREFECT_RETRIES"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_CLIENT_MAX_RETRIES", mark)}
    probe = ("import os, contramine.flows.env as e; "
             "print(os.environ.get('PREFECT_CLIENT_MAX_RETRIES'), e.OUR_RETRIES)")
    for given, want in (({}, f"{tries} {tries == '10'}"), ({"PREFECT_CLIENT_MAX_RETRIES": "3"}, "3 False"),
                        ({"PREFECT_CLIENT_MAX_RETRIES": "10", mark: "10"}, "10 True"),  # inherited
                        ({"PREFECT_CLIENT_MAX_RETRIES": "10"}, "10 False")):  # the user's own 10
        run_env = {**env, **({"PREFECT_API_URL": url} if url else {}), **given}
        out = subprocess.run([sys.executable, "-c", probe], env=run_env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want, (url, given, out.stdout, out.stderr)


@pytest.mark.parametrize("url, local", [(None, True), ("http://127.0.0.1:4200/api", True),
                                        ("http://localhost:4200/api", True), ("http://[::1]:4200/api", True),
                                        ("https://api.prefect.cloud/api/accounts/a/workspaces/w", False),
                                        ("http://10.0.0.7:4200/api", False)])
def test_which_servers_are_on_this_machine(url, local):
    assert server_on_this_machine(url) is local


def test_a_remote_server_keeps_prefects_backoff():
    """While the API in use is another machine's, Prefect's waits (2, 4, 8 ... s, +-30%) are untouched."""
    import prefect.client.base as client_base
    from prefect.settings import PREFECT_API_URL, temporary_settings

    for url, first in (("http://10.0.0.7:4200/api", 2.0), ("http://127.0.0.1:4200/api", 0.05)):
        with temporary_settings({PREFECT_API_URL: url}):
            waits = [client_base.clamped_poisson_interval(2 ** t, 0.3) for t in (1, 2, 3)]
        scale = [first * 2 ** k for k in range(3)]
        assert all(0.69 * w <= got <= 1.31 * w for got, w in zip(waits, scale)), (url, waits)
    # a remote server that the environment did not name (a Prefect profile, prefect.toml): the tries that this
    # process' default of 10 adds past Prefect's 5 are asked at once, so its waits stay Prefect's 62 s
    with temporary_settings({PREFECT_API_URL: "http://10.0.0.7:4200/api"}):
        waits = [client_base.clamped_poisson_interval(2 ** t, 0.3) for t in range(1, 12)]
    assert all(w > 1 for w in waits[:5]) and waits[5:] == [0.0] * 6, waits
