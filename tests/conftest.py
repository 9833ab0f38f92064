"""Test settings: offline hub, Hugging Face caches of its own, quiet Prefect with its own home, one torch thread
per test process."""
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# hints name `contramine ...` commands here, as from the installed script (`make test` exports CONTRAMINE_VIA=make to
# the suite; the tests that check the make form set it themselves)
os.environ.pop("CONTRAMINE_VIA", None)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite's own HF_HOME (hub and datasets caches), never the user's: `datasets` caches a dataset folder by its name
# and card, so the suite's tiny exports left in ~/.cache came back as the user's own `artifacts/<run>/export/<format>`
# rows, and a model the user has cached would change what the offline tests see. One folder per session: made by the
# first process, inherited by pytest-xdist workers and the CLI subprocesses, removed when that process exits. Set
# before anything imports huggingface_hub or datasets, which read these at import; the *_CACHE variables are dropped
# so every cache follows HF_HOME (test_hub points HF_HOME at a hub of its own per test).
if "CONTRAMINE_TEST_HF_HOME" not in os.environ:
    os.environ["CONTRAMINE_TEST_HF_HOME"] = tempfile.mkdtemp(prefix="contramine-test-hf-")
    atexit.register(shutil.rmtree, os.environ["CONTRAMINE_TEST_HF_HOME"], True)
os.environ["HF_HOME"] = os.environ["CONTRAMINE_TEST_HF_HOME"]
os.environ["HF_DATASETS_CACHE"] = os.path.join(os.environ["HF_HOME"], "datasets")
for _var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_MODULES_CACHE", "HF_XET_CACHE", "HF_ASSETS_CACHE"):
    os.environ.pop(_var, None)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Flow and task logs go to the console only, not to the tests' Prefect server too: no test reads logs through the
# API (they read the console, the tables and the artifacts), and shipping each record there took ~40% of a small
# cached mine's wall time (6.6-9.4 s -> 4.3-4.8 s; the first mine 27.6 s -> 16.0 s, measured here). Inherited by
# the CLI subprocesses and the Dask workers the tests start.
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
# The tests' Prefect servers record flow runs, states and artifacts (what tests read), not the event stream: no test
# reads events, task runs or automations through the API, and persisting each task run's events took ~1 s of a small
# cached mine (3.4-3.9 s -> 3.0 s) and a quarter of the server's CPU. The tests' own servers only (the harness, and
# the temporary servers of the CLI subprocesses, which inherit this); a user's server keeps every service.
for _service in ("TASK_RUN_RECORDER", "EVENT_PERSISTER", "TRIGGERS", "EVENT_LOGGER"):
    os.environ.setdefault(f"PREFECT_SERVER_SERVICES_{_service}_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# The tests' Prefect servers are plain http on 127.0.0.1, so no certificate is ever checked; but every Prefect client
# (one per task run) builds an SSL context from certifi's ~150 certificates, 30-37 ms of CPU each: ~25% of a small
# cached mine's CPU in the test process (1.5-2.1 -> 1.1-1.4 CPU-s, measured here). The tests' clients load one
# certificate instead (certifi's first), from a file made by the first process and inherited like HF_HOME. A user's
# client keeps certifi's bundle or their PREFECT_API_SSL_CERT_FILE.
if "PREFECT_API_SSL_CERT_FILE" not in os.environ:
    import certifi

    _bundle = Path(certifi.where()).read_text(encoding="ascii")
    _end = "-----END CERTIFICATE-----\n"
    _ca = Path(tempfile.mkdtemp(prefix="contramine-test-ca-")) / "one-ca.pem"
    _ca.write_text(_bundle[_bundle.index("-----BEGIN CERTIFICATE-----"):_bundle.index(_end) + len(_end)], encoding="ascii")
    atexit.register(shutil.rmtree, _ca.parent, True)
    os.environ["PREFECT_API_SSL_CERT_FILE"] = str(_ca)
# The tests' servers do not enforce CSRF (Prefect's server default), so their clients fetch no CSRF token: one request
# fewer per flow run, ~12% of a server's CPU per flow run (30 flow runs of 4 tasks: 3.6-3.7 s against 4.0-4.4 s,
# measured here). A user's client keeps Prefect's default, which a server that enforces CSRF needs.
os.environ.setdefault("PREFECT_CLIENT_CSRF_SUPPORT_ENABLED", "false")
# The Python processes the tests start (CLI runs, Dask workers, `make` targets) run their flows without Prefect's
# heartbeat thread, as this process does (no_flow_heartbeats): subprocess_site/ on their PYTHONPATH, here for those
# that inherit the environment, child_env.CHILD_PYTHONPATH for those that set their own
from child_env import SITE  # noqa: E402  (tests/ is on sys.path: pytest's rootdir conftest)

if str(SITE) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])])
# One torch / OpenMP thread per test process when pytest-xdist runs several (`make test`: 2 processes on 2 cores):
# two processes of 2 threads each on 2 cores make every torch op wait on thread wake-ups (measured 4-8x slower for
# encoding and generate on this box). Set before torch is imported, and inherited by the CLI subprocesses and the
# Dask workers the tests start.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
# one Prefect home (its SQLite database) per pytest-xdist worker: two servers writing one database lock each other
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
os.environ.setdefault("PREFECT_HOME", str(ROOT / "artifacts" / (".prefect-test" + (f"-{_WORKER}" if _WORKER else ""))))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
# Prefect makes only the last part of its home, and warns at import where the rest is missing (a fresh clone has no
# artifacts/ yet: three warnings at the top of its first `make test`)
Path(os.environ["PREFECT_HOME"]).parent.mkdir(parents=True, exist_ok=True)
# The product's Prefect settings (flows/env.py: more, shorter retries against a server on this machine), set before
# this process imports Prefect (pytest_configure does), as every CLI process sets them before it does
import contramine.flows.env  # noqa: E402,F401

WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"


def _one_ca_file() -> str:
    """A CA file of one certificate (certifi's first), made once per session beside the suite's HF_HOME. Prefect's
    client builds a TLS context from its CA file each time it makes a client (PrefectClient.__init__: a stage flow's
    parent task run, an artifact, ...), even for the tests' plain-HTTP server on 127.0.0.1: parsing certifi's ~150
    certificates took 17 ms a time, ~29% of a small cached mine's own CPU (1.35 -> 0.84 CPU-s; wall 3.0 -> 2.3 s,
    measured here). No test speaks TLS, so which certificates the file trusts changes nothing a test sees."""
    path = os.path.join(os.environ["CONTRAMINE_TEST_HF_HOME"], "one-ca.pem")
    if not os.path.exists(path):
        import re

        import certifi

        bundle = Path(certifi.where()).read_text(encoding="ascii")
        first = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n", bundle, re.S).group(0)
        tmp = f"{path}.{os.getpid()}.tmp"
        Path(tmp).write_text(first, encoding="ascii")
        os.replace(tmp, path)
    return path


os.environ.setdefault("PREFECT_API_SSL_CERT_FILE", _one_ca_file())


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def pytest_configure(config):
    no_flow_heartbeats()


# The longest files first (their tests' seconds in `make test`, 2026-12-06: 134, 131, 125, 92, 91, 58, 58, 55, 43, 37,
# 35, 34, 33 s), then the rest in their usual order. `make test` hands whole files to its two workers in the order
# collected (--no-loadscope-reorder: pytest-xdist's own reorder puts files with many tests first, so the one-test
# file of nearly two minutes, test_hub_makefile, started last and ran alone at the end); longest first leaves the
# short ones to even the two workers out. A list that goes stale costs balance only: every file still runs.
LONGEST_FIRST = ("test_cluster.py", "test_reliability.py", "test_execution_settings.py", "test_hub_makefile.py",
                 "test_bench_modules.py", "test_scaleout.py", "test_gpu_check.py", "test_mine_flow.py",
                 "test_checkpoints.py", "test_house.py", "test_snapshots.py", "test_generators_flow.py",
                 "test_row_memo_mining.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


def no_flow_heartbeats() -> None:
    """Flow runs without Prefect's heartbeat thread, in this process. A heartbeat tells a long-lived server that a
    flow run has not crashed; the harness' server lives for the session only, and every flow run's exit waits for
    the thread's one-second sleep to end (~0.5 s a flow run, 13 stage flows a `mine`: a fifth of a small mine's
    time here). Prefect's setting cannot say "none" from the environment (it takes an int >= 30), so the engine's
    property is replaced in the test processes (not in the CLI subprocesses or Dask workers they start)."""
    import prefect.flow_engine

    prefect.flow_engine.BaseFlowRunEngine.heartbeat_seconds = property(lambda self: None)


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """120 real wiki lines plus a few that must be rejected."""
    lines = WIKI.read_text(encoding="utf-8").splitlines()[:120]
    lines[5] = ""
    lines[9] = "too short"
    lines[17] = lines[16]
    p = tmp_path_factory.mktemp("corpus") / "small.txt"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


# the trainer tests' tiny BERT and SentEval folder (tests/train_helpers.py), built once per test module
@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    from tiny_bert import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("bert") / "model", seed=0, dropout=0.1)


@pytest.fixture(scope="module")
def senteval(tmp_path_factory) -> Path:
    from train_helpers import write_senteval

    return write_senteval(tmp_path_factory.mktemp("senteval"))
