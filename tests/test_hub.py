"""The user's real machine: a machine WITH hub access, simulated by a Hugging Face hub on 127.0.0.1 (fake_hub.py)
serving tiny random models under the real ids the paper profiles name.

- The paper profiles through the Makefile, end to end: tests/test_hub_makefile.py (its own file, so that the
  suite's workers run it beside this one).
- Resolution: a cache holding only config.json is not a model; a missing repo, a hub that is down and an offline
  machine each give one line, fast.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from fake_hub import FakeHub, build_paper_models, user_env
from contramine.pipeline.models import hub as models
from contramine.pipeline.models.hub import ModelUnavailable, missing_files, resolve_model
from tiny_bert import build_tiny_bert

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"


@pytest.fixture(scope="module")
def paper_models(tmp_path_factory) -> dict[str, Path]:
    return build_paper_models(tmp_path_factory.mktemp("paper-models"))


@pytest.fixture(scope="module")
def hub(paper_models):
    with FakeHub(paper_models) as h:
        yield h


@pytest.fixture
def online(monkeypatch, tmp_path):
    """This process as a connected machine: HF_ENDPOINT at a hub of its own, an empty cache."""
    def connect(repos: dict, **env):
        import huggingface_hub.constants

        hub = FakeHub(repos).start()
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        # huggingface_hub reads HF_HUB_OFFLINE once, at import; conftest set it for the offline tests
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        models.clear_cache()
        started.append(hub)
        return hub
    started: list[FakeHub] = []
    yield connect
    for hub in started:
        hub.stop()
    models.clear_cache()


@pytest.fixture(scope="module")
def busy_repo(tmp_path_factory) -> Path:
    """A tiny BERT repo that also carries what a loader never needs: .bin copy, TF, ONNX, a README."""
    d = build_tiny_bert(tmp_path_factory.mktemp("repo") / "bert")
    (d / "pytorch_model.bin").write_bytes(b"not needed: safetensors is there")
    (d / "tf_model.h5").write_bytes(b"tf")
    (d / "onnx").mkdir()
    (d / "onnx" / "model.onnx").write_bytes(b"onnx")
    (d / "README.md").write_text("# card")
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    return d


def test_download_fetches_what_loading_needs_once(online, busy_repo):
    hub = online({"org/bert": busy_repo})
    path = resolve_model("org/bert", "encoder")
    assert hub.fetched("org/bert") == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                        "vocab.txt", "1_Pooling/config.json"}
    assert missing_files(Path(path)) == [] and "snapshots" in path
    models.clear_cache()  # a new process: the complete cached copy is used without asking the hub
    before = len(hub.requests)
    assert resolve_model("org/bert", "encoder") == path and len(hub.requests) == before


def test_cache_with_only_config_json_is_not_a_model(online, busy_repo, monkeypatch, tmp_path):
    from huggingface_hub import hf_hub_download

    hub = online({"bert-base-uncased": busy_repo})
    # what AutoConfig.from_pretrained(<hub id>) or an interrupted download leaves behind
    hf_hub_download("bert-base-uncased", "config.json", endpoint=hub.url, cache_dir=str(tmp_path / "hf-home" / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models.clear_cache()
    with pytest.raises(ModelUnavailable) as e:
        resolve_model("bert-base-uncased", "encoder")
    line = str(e.value)
    assert "\n" not in line and "'bert-base-uncased'" in line and "incomplete copy" in line and "weights" in line
    monkeypatch.delenv("HF_HUB_OFFLINE")
    models.clear_cache()
    path = Path(resolve_model("bert-base-uncased", "encoder"))  # reachable: the rest is downloaded
    assert missing_files(path) == [] and "model.safetensors" in hub.fetched("bert-base-uncased")
    from contramine.pipeline.models.encode.encoder import Encoder
    enc = Encoder.load("bert-base-uncased", pooler="mean", max_length=16)
    assert enc.tokenizer.vocab_size == len((busy_repo / "vocab.txt").read_text().split())


def test_missing_repo_is_one_line_naming_it(online, busy_repo):
    hub = online({"org/bert": busy_repo})
    t0 = time.perf_counter()
    with pytest.raises(ModelUnavailable) as e:
        resolve_model("org/no-such-model", "translation model")
    assert time.perf_counter() - t0 < 10
    assert "\n" not in str(e.value) and "'org/no-such-model'" in str(e.value) and "404" in str(e.value)
    assert hub.url in str(e.value)


def test_hub_down_is_one_line_fast(online, busy_repo, monkeypatch):
    online({"org/bert": busy_repo})
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    models.clear_cache()
    t0 = time.perf_counter()
    with pytest.raises(ModelUnavailable) as e:
        resolve_model("org/bert", "encoder")
    assert time.perf_counter() - t0 < 5
    assert "\n" not in str(e.value) and f"127.0.0.1:{port}" in str(e.value) and "cannot be reached" in str(e.value)


def test_reachability_follows_the_users_settings(online, busy_repo, monkeypatch):
    hub = online({"org/bert": busy_repo})
    assert models.hub_endpoint() == hub.url and models.hub_reachable()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models.clear_cache()
    assert not models.hub_reachable()
    with pytest.raises(ModelUnavailable, match="HF_HUB_OFFLINE is set"):
        resolve_model("org/bert")
    assert not any("/resolve/" in p for _, p in hub.requests)


def test_project_forces_no_offline_mode():
    """Reachability follows the user's settings: neither the Makefile nor the deployments switch the hub off."""
    import yaml

    make_db = subprocess.run(["make", "-pn", "--no-print-directory", "test"], cwd=ROOT, capture_output=True,
                             text=True, env={k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}).stdout
    assert "HF_HUB_OFFLINE" not in make_db
    for dep in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]:
        assert "HF_HUB_OFFLINE" not in dep["work_pool"]["job_variables"].get("env", {}), dep["name"]


# ------------------------------------------------------------------------------------------------ completeness
def _cache_snapshot(hf_home: Path, repo_id: str, files: dict[str, bytes | Path]) -> Path:
    """A snapshot in the HF cache layout (refs/main -> snapshots/<sha>/...), as a download leaves it."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for name, data in files.items():
        (snap / name).write_bytes(data.read_bytes() if isinstance(data, Path) else data)
    return snap


def test_marian_snapshot_with_one_sentencepiece_file_is_incomplete(paper_models, monkeypatch, tmp_path):
    for repo, folder in paper_models.items():  # what save_pretrained wrote (BERT, Marian, FSMT) is complete
        assert missing_files(folder) == [], repo
    marian = paper_models["Helsinki-NLP/opus-mt-zh-en"]
    keep = ("config.json", "model.safetensors", "source.spm")  # an interrupted download: one SentencePiece file
    snap = _cache_snapshot(tmp_path / "hf", "Helsinki-NLP/opus-mt-zh-en", {n: marian / n for n in keep})
    assert missing_files(snap) == ["MarianTokenizer files target.spm and vocab.json"]
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models.clear_cache()
    with pytest.raises(ModelUnavailable) as e:
        resolve_model("Helsinki-NLP/opus-mt-zh-en", "translation model")
    assert "\n" not in str(e.value) and "incomplete copy (missing MarianTokenizer files target.spm and vocab.json)" \
        in str(e.value)
    for name in ("target.spm", "vocab.json"):  # the rest of the download arrives: now it is a model
        (snap / name).write_bytes((marian / name).read_bytes())
    models.clear_cache()
    assert missing_files(snap) == [] and resolve_model("Helsinki-NLP/opus-mt-zh-en") == str(snap)


def test_fast_tokenizer_needs_tokenizer_json_or_its_vocabulary(paper_models, tmp_path):
    bert = paper_models["bert-base-uncased"]
    base = {n: bert / n for n in ("config.json", "model.safetensors", "tokenizer_config.json")}
    only_config = _cache_snapshot(tmp_path / "a", "org/bert", base)  # tokenizer_config.json is no tokenizer
    assert missing_files(only_config) == ["tokenizer.json (or BertTokenizer files vocab.txt)"]
    fast = {**base, "tokenizer.json": bert / "tokenizer.json"}
    assert missing_files(_cache_snapshot(tmp_path / "b", "org/bert", fast)) == []
    assert missing_files(_cache_snapshot(tmp_path / "c", "org/bert", {**base, "vocab.txt": bert / "vocab.txt"})) == []
    # a model type transformers does not know and no tokenizer class named: any tokenizer file, as before
    odd = {"config.json": b'{"model_type": "no-such-type"}', "model.safetensors": b"w"}
    assert missing_files(_cache_snapshot(tmp_path / "d", "org/odd", odd)) == ["tokenizer files"]
    assert missing_files(_cache_snapshot(tmp_path / "e", "org/odd", {**odd, "tokenizer.json": b"{}"})) == []


def test_download_missing_a_tokenizer_file_is_refused(online, paper_models, tmp_path):
    marian = paper_models["Helsinki-NLP/opus-mt-zh-en"]
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("config.json", "model.safetensors", "source.spm", "target.spm", "tokenizer_config.json"):
        (repo / name).write_bytes((marian / name).read_bytes())  # the hub repo itself lacks vocab.json
    hub = online({"org/marian": repo})
    with pytest.raises(ModelUnavailable) as e:
        resolve_model("org/marian", "translation model")
    assert "\n" not in str(e.value) and f"the download from {hub.url} is incomplete" in str(e.value)
    assert "MarianTokenizer files vocab.json" in str(e.value)


# ------------------------------------------------------------------------------------------------ a hub dataset corpus
HUB_CORPUS = """
import json, sys
from contramine.pipeline.corpus import CorpusError, split_sentences
from contramine.pipeline.corpus import Corpus
out = {}
for name, corpus in [("hub", Corpus("hf:someone/corpus")), ("text", Corpus(sys.argv[1])),
                     ("pinned", Corpus("hf://datasets/someone/corpus", revision=sys.argv[2]))]:
    corpus.check()
    kept, rejected = split_sentences(corpus, 3, 20, 200)
    out[name] = {"identity": corpus.identity(), "kept": kept.to_pylist(), "rejected": rejected.to_pylist()}
for name, corpus in [("no_column", Corpus("hf:someone/corpus", field="body")), ("no_repo", Corpus("hf:someone/nope")),
                     ("no_split", Corpus("hf:someone/corpus", split="test"))]:
    try:
        corpus.check()
        out[name] = "no error"
    except CorpusError as e:
        out[name] = str(e)
print(json.dumps(out))
"""


def test_a_hub_dataset_corpus_streams_and_gives_the_text_files_tables(tmp_path):
    """`--corpus hf:<id>`: `datasets` streams the split from the hub (the suite's, on 127.0.0.1) at the commit its
    revision resolves to; the tables equal the same lines as a text file's, every row accounted for with its row
    number; the resolved commit is in the corpus' identity (the `sentences` key: a new commit reruns it, and the row
    memo keeps the rest), the same whether named by branch or by sha; a bad column, id or split is one line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = WIKI.read_text(encoding="utf-8").splitlines()[:20] + ["", "too short", None]
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    pq.write_table(pa.table({"id": list(range(len(lines))), "text": lines}), repo / "data" / "train-00000.parquet")
    (repo / "README.md").write_text("---\nlicense: cc-by-sa-4.0\n---\n# a corpus\n")
    text = tmp_path / "c.txt"
    text.write_text("\n".join(t or "" for t in lines) + "\n", encoding="utf-8")
    env = {**user_env("", tmp_path / "hf-home"), "PYTHONPATH": str(ROOT)}
    with FakeHub({}, datasets={"someone/corpus": repo}) as hub:
        sha = hub.datasets["someone/corpus"].sha
        r = subprocess.run([os.sys.executable, "-c", HUB_CORPUS, str(text), sha], env={**env, "HF_ENDPOINT": hub.url},
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert not [p for m, p in hub.requests if not p.startswith(("/api/datasets/someone/", "/datasets/someone/",
                                                                    "/api/agent"))]
    assert got["hub"]["kept"] == got["text"]["kept"] and len(got["hub"]["kept"]) >= 8
    account = lambda rows: [{k: v for k, v in r.items() if k != "source"} for r in rows]  # noqa: E731
    assert account(got["hub"]["rejected"]) == account(got["text"]["rejected"])
    assert [(r["source"], r["source_line"], r["reason"]) for r in got["hub"]["rejected"]][-3:] == [
        ("hf:someone/corpus:train", 21, "empty"), ("hf:someone/corpus:train", 22, "too_short"),
        ("hf:someone/corpus:train", 23, "empty")]
    assert f"hf:someone/corpus@{sha}" in got["hub"]["identity"] and got["pinned"]["identity"] == got["hub"]["identity"]
    assert "no column `body`" in got["no_column"] and "columns: id, text" in got["no_column"]
    assert got["no_repo"].startswith("corpus hf:someone/nope: cannot resolve dataset revision main")
    assert "cannot stream split 'test'" in got["no_split"]
    assert all("\n" not in got[k] for k in ("no_column", "no_repo", "no_split"))
