"""The paper profiles run through the Makefile exactly as a user types them — `make mine PROFILE=debcse-paper`,
`PROFILE=osscse-paper`, `make train PROFILE=debcse-paper`, `make eval MODEL=<its checkpoint>` — on a machine WITH
hub access (the suite's hub on 127.0.0.1, tiny random models under the real ids), with an empty HF_HOME and no
variable set but HF_ENDPOINT (and the suite's Prefect server, as a user who runs one); every model is downloaded
once, and only the files loading needs.

Its own file (not test_hub.py's): the suite's workers take whole files, and this one test is minutes of one."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import prefect.settings
import pyarrow.compute as pc
import pytest

from fake_hub import FakeHub, build_paper_models, user_env
from contramine.pipeline.storage.tables import RunTables

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with FakeHub(build_paper_models(tmp_path_factory.mktemp("paper-models"))) as h:
        yield h


@pytest.mark.slow
def test_paper_profiles_mine_train_eval_through_the_makefile(hub, prefect_harness, tmp_path):
    corpus = tmp_path / "corpus.txt"
    # 32 lines (was 80: the profile's batch of 64 pairs); `make train` below takes batches of 16 instead, and every
    # model still downloads once, each chain translates every line and its variants (at 16 lines, no random tiny
    # back-translation was left as a positive candidate)
    corpus.write_text("".join(WIKI.read_text(encoding="utf-8").splitlines(keepends=True)[:32]), encoding="utf-8")
    # a user whose Prefect server is configured (the suite's): the temporary server Prefect starts without one
    # (~5 s a `make mine`) is test_stage_errors' and the clean-clone check's, not this test's promise
    env = {**user_env(hub.url, tmp_path / "hf-home"), "PREFECT_API_URL": prefect.settings.PREFECT_API_URL.value()}
    runs = tmp_path / "runs"

    r = make("mine", "PROFILE=debcse-paper", f"CORPUS={corpus}", f"SET=run.root={runs}", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    deb = RunTables(runs / "debcse-paper")
    n = deb.read("sentences").num_rows
    bt = deb.read("backtranslations")
    # DebCSE's positives chain: the sentence and its 4 noised copies, there and back, with the zh target token set
    assert bt.num_rows == 5 * n and set(bt.column("role").to_pylist()) == {"positives"}
    assert set(bt.column("chain").to_pylist()) == {"opus-mt-en-zh>opus-mt-zh-en"}
    pos = deb.read("candidates").filter(pc.equal(deb.read("candidates").column("kind"), "pos"))
    assert pos.num_rows > 0 and set(pos.column("source").to_pylist()) == {"bt:opus-mt-en-zh>opus-mt-zh-en"}
    assert deb.read("pairs").num_rows == n

    # OssCSE is mined only (no training here): a shorter corpus, its two wmt19 chains (5 beams) cost the most a line
    short = tmp_path / "short.txt"
    short.write_text("".join(corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:8]), encoding="utf-8")
    r = make("mine", "PROFILE=osscse-paper", f"CORPUS={short}", f"SET=run.root={runs}", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    oss = RunTables(runs / "osscse-paper")
    bt = oss.read("backtranslations")
    # OssCSE's two wmt19 chains translate the clean sentence only: no compute on variants it throws away
    assert bt.num_rows == 2 * oss.read("sentences").num_rows > 0 and set(bt.column("variant").to_pylist()) == {0}
    assert set(bt.column("role").to_pylist()) == {"paraphrases"}
    assert oss.manifest("backtranslations")["chains_used"] == ["wmt19-en-de>wmt19-de-en", "wmt19-en-ru>wmt19-ru-en"]

    r = make("train", "PROFILE=debcse-paper",
             f"SET=run.root={runs} train.max_steps=2 train.eval_every=2 train.batch_size=16", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    best = runs / "debcse-paper" / "train" / "debcse" / "best"
    trained = json.loads((best / "results.json").read_text())
    assert json.loads((best / "train_config.json").read_text())["pooler"] == "cls_before_pooler"

    name = f"hubtest-{os.getpid()}"
    try:
        r = make("eval", f"MODEL={best}", f"NAME={name}", env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        evaluated = json.loads((ROOT / "artifacts" / "eval" / name / "results.json").read_text())
    finally:
        shutil.rmtree(ROOT / "artifacts" / "eval" / name, ignore_errors=True)
    # `make eval` on the checkpoint takes its pooler and length: the numbers training reported
    assert evaluated["pooler"] == "cls_before_pooler" and evaluated["sts"] == trained["sts"]

    # every model was downloaded once for the whole flow (4 processes), and only what loading needs
    gets = Counter(p for m, p in hub.requests if m == "GET" and "/resolve/" in p)
    assert gets and max(gets.values()) == 1, [p for p, k in gets.items() if k > 1]
    for repo in ("bert-base-uncased", "princeton-nlp/unsup-simcse-bert-base-uncased", "Helsinki-NLP/opus-mt-en-zh",
                 "facebook/wmt19-ru-en"):
        assert "model.safetensors" in hub.fetched(repo) and "config.json" in hub.fetched(repo)


def make(*args: str, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


# ------------------------------------------------------------------------------------------------ resolution
