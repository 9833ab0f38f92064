"""Test settings: offline hub, quiet Prefect with its own home, one torch thread per test process."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# one Prefect home (its SQLite database) per pytest-xdist worker: two servers writing one database lock each other
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
os.environ.setdefault("PREFECT_HOME", str(ROOT / "artifacts" / (".prefect-test" + (f"-{_WORKER}" if _WORKER else ""))))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


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
