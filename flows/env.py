"""Prefect settings for this project, applied before Prefect is imported (a user's own settings win).

Ephemeral mode keeps its SQLite database under artifacts/ (the checkout's, or ./artifacts where an installed
package runs), so a user's own Prefect home is untouched; the first start on a fresh home takes 20–27 s here, beyond
Prefect's 20 s default (STACK.md), hence the longer timeout. A user who configures PREFECT_API_URL gets their server
instead.
"""
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from contramine.pipeline.config.base import ARTIFACTS

DEFAULTS = {
    "PREFECT_HOME": str(ARTIFACTS / ".prefect"),
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LOG_PRINTS": "true",
    "TOKENIZERS_PARALLELISM": "false",
}
for key, value in DEFAULTS.items():
    os.environ.setdefault(key, value)
# Prefect creates only the last path component of its home: on a fresh clone artifacts/ does not exist yet, and
# its warning would break the one-line error contract of the CLI.
try:
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
except OSError:
    pass


# Prefect's client answers a 503 from its server by waiting 2, 4, 8, 16, 32 s (exponential backoff, then jitter):
# 6 tries over 62 s, then one more wait of 64 s before it hands the last answer back. Prefect's own SQLite server (the
# ephemeral one `make mine` starts, or one on this machine) sends a 503 whenever a write meets another connection's
# commit between its read and its write (SQLITE_BUSY_SNAPSHOT in WAL mode), which a graph-scheduled mine does at
# nearly every moment two stage flows start or end together: a small cached mine spent 4-6 s of its 8 s waiting out
# such retries, though the lock clears within milliseconds. Against a server on this machine the client asks again
# after 0.05 s, doubling, and its last try waits out the rest of Prefect's own 62 s (LOCAL_PATIENCE_S); with
# LOCAL_RETRIES tries (10, unless the user sets PREFECT_CLIENT_MAX_RETRIES), a write that keeps meeting commits on a
# busy machine gets many short chances and a server that is really down still fails after 62 s. (The earlier 0.05,
# 0.2, 0.8, 3.2, 12.8 s, 17 s in all, lost a stage flow's start in the suite on a slower box of this kind: six tries,
# six 503s.) A remote server (Postgres, Prefect Cloud) keeps Prefect's backoff and its number of tries; a
# Retry-After header from any server is honoured as Prefect honours it. On every server the wait after the last try
# is skipped: its answer is final.
LOCAL_RETRY_FIRST_S = 0.05
LOCAL_PATIENCE_S = 62.0
LOCAL_RETRIES = 10


def server_on_this_machine(api_url: str | None) -> bool:
    """Prefect's API is served here: its ephemeral server (no API URL), or a URL on a loopback address."""
    if not api_url:
        return True
    from urllib.parse import urlsplit

    host = (urlsplit(api_url).hostname or "").lower()
    return host == "localhost" or host.startswith("127.") or host == "::1"


# Read by Prefect at its import, so set before it, from the environment's API URL. One that a Prefect profile or
# prefect.toml names is only known once Prefect is loaded: if it is remote, the tries past Prefect's own 5 that this
# default adds are asked at once (local_interval), so such a server keeps Prefect's backoff and its 62 s.
# The count is marked as this default (RETRIES_MARK, beside it), so the processes that inherit it (CLI children, Dask
# workers) tell it from a user's own.
PREFECT_DEFAULT_RETRIES = 5
RETRIES_MARK = "CONTRAMINE_DEFAULT_PREFECT_RETRIES"
if "PREFECT_CLIENT_MAX_RETRIES" not in os.environ and server_on_this_machine(os.environ.get("PREFECT_API_URL")):
    os.environ["PREFECT_CLIENT_MAX_RETRIES"] = os.environ[RETRIES_MARK] = str(LOCAL_RETRIES)
OUR_RETRIES = os.environ.get(RETRIES_MARK) is not None and \
    os.environ.get(RETRIES_MARK) == os.environ.get("PREFECT_CLIENT_MAX_RETRIES")


def prompt_local_retries() -> None:
    """Prefect's client backoff (prefect.client.base: jitter around 2**try seconds) made short while the API in use
    is on this machine (see above). Called by flows/mine.py once Prefect is imported (the `sql` and `report`
    commands import no Prefect); the server is looked up at each retry, so a run against a remote server keeps
    Prefect's backoff."""
    import math

    import prefect.client.base as client_base
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES

    if getattr(client_base.clamped_poisson_interval, "local_retries", False):
        return
    jitter = client_base.clamped_poisson_interval

    def local_interval(average: float, clamping_factor: float = 0.3) -> float:
        if average > 0:
            tries, last = max(1, round(math.log2(average))), PREFECT_CLIENT_MAX_RETRIES.value()  # Prefect: 2**try
            if tries > last:  # after the last try: Prefect would wait this long, then hand its answer back
                return 0.0
            if server_on_this_machine(PREFECT_API_URL.value()):
                average = LOCAL_RETRY_FIRST_S * 2 ** (tries - 1)
                if tries == last:  # the rest of Prefect's own patience
                    average = max(average, LOCAL_PATIENCE_S - LOCAL_RETRY_FIRST_S * (2 ** (tries - 1) - 1))
            elif OUR_RETRIES and tries > PREFECT_DEFAULT_RETRIES:  # a remote server named outside the environment
                return 0.0
        return jitter(average, clamping_factor)

    local_interval.local_retries = True  # type: ignore[attr-defined]
    client_base.clamped_poisson_interval = local_interval


# Prefect's flow runs emit a heartbeat every PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds (180 by default) from a thread
# that sleeps in whole seconds; a flow run's exit joins that thread, so every flow run ends up to 1 s after its work
# (5 trivial flow runs: 5.5 s with heartbeats, 0.5 s without, measured here). Heartbeats let a server's automations
# declare a flow run whose process died a zombie. Prefect's temporary server (no PREFECT_API_URL: what `make mine`
# starts) lives and dies with this process, so nothing can ever read them: there the CLI's flow runs send none, and
# a mine's stage flows stop waiting ~1 s each. A configured server (PREFECT_API_URL, a deployment's worker) keeps
# them, and so does a user who sets PREFECT_FLOWS_HEARTBEAT_FREQUENCY.
HEARTBEAT_VARIABLES = ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY")  # a user's own


@contextmanager
def heartbeats_where_read() -> Iterator[None]:
    """Inside: flow runs send heartbeats only where a server outlives this process (see above)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    if PREFECT_API_URL.value() or any(os.environ.get(k) for k in HEARTBEAT_VARIABLES):
        yield
        return
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
