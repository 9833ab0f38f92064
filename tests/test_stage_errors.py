"""One error type for stages (pipeline/errors.py): a stage that fails on its input once the run has started ends
`make mine` with one `error:` line naming the file, row, key or model, exit code 2, no traceback and nothing
half-written; generation settings that contradict each other are refused when the config is read."""
from __future__ import annotations

import logging
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from mining_helpers import ROOT, SMALL, _cli_env, _cli_error
from contramine.pipeline.config import ConfigError, load_config
from contramine.pipeline.errors import ExpectedErrors, StageError, is_expected
from contramine.pipeline.models.hub import ModelUnavailable
from contramine.pipeline.models.encode.precomputed import PrecomputedEncoder, PrecomputedError
from contramine.pipeline.models.standin import StandInEncoder

WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"
STANDIN = "standin:encoder-32"


def _record(exc: BaseException | None) -> logging.LogRecord:
    info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "Task run failed", None, info)


def test_stage_errors_are_one_type_and_only_they_leave_the_terminal_quiet(tmp_path):
    assert issubclass(PrecomputedError, StageError) and issubclass(PrecomputedError, ValueError)
    with pytest.raises(StageError, match=r"nope.parquet: no such file"):
        PrecomputedEncoder(tmp_path / "nope.parquet")
    keep = ExpectedErrors()
    for exc in (StageError("x"), PrecomputedError("x"), ConfigError("x"), ModelUnavailable("x")):
        assert is_expected(exc) and not keep.filter(_record(exc)), exc
    for exc in (ValueError("a bug"), RuntimeError("a bug"), None):  # a real bug keeps its traceback
        assert not is_expected(exc) and keep.filter(_record(exc)), exc


def test_logging_config_is_prefects_own_plus_the_filter():
    """flows/logging.yml replaces Prefect's default wholesale (PREFECT_LOGGING_CONFIG_PATH): it must stay that
    default, with only the console handler's filter added."""
    from prefect.logging.configuration import DEFAULT_LOGGING_SETTINGS_PATH

    ours = yaml.safe_load((ROOT / "flows" / "logging.yml").read_text())
    assert ours.pop("filters") == {"expected_errors": {"()": "contramine.pipeline.errors.ExpectedErrors"}}
    assert ours["handlers"]["console"].pop("filters") == ["expected_errors"]
    assert ours == yaml.safe_load(DEFAULT_LOGGING_SETTINGS_PATH.read_text())


@pytest.mark.usefixtures("prefect_harness")
def test_contradicting_generation_settings_stop_before_any_work(capsys, tmp_path):
    sets = [f"encoder.model={STANDIN}", "backtranslate.do_sample=true", "backtranslate.num_beams=4"]
    line = _cli_error(capsys, tmp_path / "runs", ["mine", "--corpus", str(tmp_path / "c.txt")], sets)
    assert "backtranslate: do_sample = true with num_beams = 4" in line, line
    with pytest.raises(ConfigError, match="backtranslate: num_return_sequences = 3 > num_beams = 2 without") as e:
        load_config("default", ["backtranslate.chains=[]", "backtranslate.num_beams=2",
                                "backtranslate.num_return_sequences=3"])
    assert "\n" not in str(e.value)


def test_a_stage_failing_inside_prefect_is_one_line_and_leaves_nothing_half_written(tmp_path):
    """The real `python -m contramine.flows.cli mine` as a user runs it (no PREFECT_API_URL: Prefect's temporary server, which
    logs its own stop at exit): the `embeddings` shards fail inside their Prefect tasks (the file of vectors lacks
    most sentences). The user sees exactly one `error:` line, the last one, and no traceback; exit code 2."""
    lines = [t for t in WIKI.read_text(encoding="utf-8").splitlines()[:30] if t.strip()]
    corpus, vectors, root = tmp_path / "c.txt", tmp_path / "five.parquet", tmp_path / "runs"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    vecs = StandInEncoder(STANDIN).encode(lines[:5])
    pq.write_table(pa.table({"text": lines[:5], "emb": pa.array(list(vecs), pa.list_(pa.float32()))}), vectors)
    env = {k: v for k, v in _cli_env(PREFECT_HOME=str(tmp_path / "prefect")).items() if k != "PREFECT_API_URL"}
    r = subprocess.run([sys.executable, "-m", "contramine.flows.cli", "mine", "--run", "bad", "--corpus", str(corpus), "--set",
                        *SMALL, f"run.root={root}", f"encoder.model={STANDIN}", f"embeddings.from={vectors}"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr[-4000:]
    assert err[-1].startswith(f"error: embeddings.from {vectors}: no vector for "), r.stderr[-4000:]
    assert sum(line.startswith("error:") for line in err) == 1 and "Traceback" not in r.stderr, r.stderr[-4000:]
    assert any("Stopping temporary server" in line for line in err[:-1]), r.stderr[-4000:]  # Prefect's exit log: before
    run = root / "bad"
    assert (run / "sentences" / "_manifest.json").is_file()  # the stages before it finished
    files = [p for p in run.rglob("*") if p.is_file()]
    assert not [p for p in files if (p.name.startswith(".") and p.name not in (".lock", ".verified.json")) or ".tmp" in p.name], files  # no temps
    assert not [p for p in files if p.parent.name == "embeddings"], files  # no partial shard, no manifest
    for part in (p for p in files if p.suffix == ".parquet"):  # every shard written is whole: it has its sidecar
        assert part.with_suffix(".json").is_file(), part
