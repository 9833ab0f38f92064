"""A Prefect server on this machine that answers 503 (its SQLite database locked by another connection's commit, which
a graph-scheduled mine meets whenever two stage flows start or end together) is asked again within milliseconds,
not after Prefect's 2 + 4 + 8 s backoff; a remote server keeps Prefect's backoff (flows/env.py)."""
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
    # 0.05 + 0.2 s with Prefect's jitter, against its own 2 + 4 s
    assert seen[2] - seen[0] < 1.0, f"the two retries took {seen[2] - seen[0]:.2f} s"


def test_a_server_that_stays_locked_still_fails_after_prefects_number_of_tries(monkeypatch):
    import prefect.client.base as client_base

    monkeypatch.setattr(client_base.time, "sleep", lambda s: None)  # the waits themselves: not needed here
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

    client, seen = _client("http://127.0.0.1:4200/api", [503])
    with pytest.raises(PrefectHTTPStatusError, match="503"):
        client.get("/hello")

    assert len(seen) == PREFECT_CLIENT_MAX_RETRIES.value() + 1


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
        scale = [first * (2 if first == 2.0 else 4) ** k for k in range(3)]
        assert all(0.69 * w <= got <= 1.31 * w for got, w in zip(waits, scale)), (url, waits)
