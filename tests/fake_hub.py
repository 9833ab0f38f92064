"""A Hugging Face hub on 127.0.0.1 that serves model and dataset folders built by the tests under real repo ids.

    with FakeHub({"bert-base-uncased": tiny_bert_dir, "Helsinki-NLP/opus-mt-en-zh": tiny_marian_dir},
                 datasets={"someone/corpus": corpus_dir}) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf")}   # huggingface_hub now downloads from here

It speaks the part of the hub's HTTP API that `huggingface_hub` (snapshot_download, hf_hub_download, model_info,
dataset_info, HfFileSystem) and a streamed `datasets.load_dataset(id, split=..., streaming=True, revision=<sha>)` use,
with the hub's own headers and error codes (models under /api/models/ and /<repo>/, datasets under /api/datasets/
and /datasets/<repo>/):

    GET  /api/models/<repo>[/revision/<rev>]          repo info: sha, siblings
    GET  /api/models/<repo>/tree/<rev>[/<path>]        the listing: files and folders, ?recursive=true for all below
    POST /api/models/<repo>/paths-info/<rev>           the entries of the paths named in the form (paths=...)
    HEAD /<repo>/resolve/<rev>/<file>                  ETag, X-Repo-Commit, Content-Length
    GET  /<repo>/resolve/<rev>/<file>                  the bytes (Range requests too)
    a repo it does not serve: 404 with X-Error-Code: RepoNotFound; a missing file: 404 with EntryNotFound

A revision is served as the folder is now (the sha follows the content: edit a file, and the repo has a new sha).

Loopback only: the server binds 127.0.0.1 and never connects anywhere. `hub.requests` records what was asked
(method, path), so a test can check what a download fetched.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


class _Repo:
    def __init__(self, repo_id: str, folder: Path):
        self.id, self.folder = repo_id, Path(folder)
        self.files = {p.relative_to(self.folder).as_posix(): p for p in sorted(self.folder.rglob("*")) if p.is_file()}
        digest = hashlib.sha1(repo_id.encode())
        for name, path in self.files.items():
            digest.update(name.encode() + b"\0" + hashlib.sha1(path.read_bytes()).digest())
        self.sha = digest.hexdigest()  # a 40-hex "commit" that changes with the content

    def etag(self, name: str) -> str:
        return _sha1(self.files[name].read_bytes())

    def folders(self) -> set[str]:
        return {n.rsplit("/", i)[0] for n in self.files for i in range(1, n.count("/") + 1)}

    def entry(self, name: str) -> dict:
        if name in self.files:
            return {"type": "file", "oid": self.etag(name), "size": self.files[name].stat().st_size, "path": name}
        return {"type": "directory", "oid": _sha1(name.encode()), "size": 0, "path": name}

    def tree(self, sub: str, recursive: bool) -> list[dict] | None:
        """The entries below `sub` (the root: ""), all of them or its children; None when `sub` is no folder."""
        sub = sub.strip("/")
        if sub and sub not in self.folders():
            return None
        prefix = sub + "/" if sub else ""
        names = [n for n in sorted(set(self.files) | self.folders()) if n.startswith(prefix)]
        return [self.entry(n) for n in names if recursive or "/" not in n[len(prefix):]]


class FakeHub:
    def __init__(self, repos: dict[str, str | Path], port: int = 0, datasets: dict[str, str | Path] | None = None):
        self.repos = {rid: _Repo(rid, folder) for rid, folder in repos.items()}
        self.datasets = {rid: _Repo(rid, folder) for rid, folder in (datasets or {}).items()}
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

            def do_POST(self):
                hub._post(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeHub":
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def fetched(self, repo_id: str) -> set[str]:
        """Files of `repo_id` whose bytes were downloaded (GET on resolve)."""
        prefix = f"/{repo_id}/resolve/"
        return {p[len(prefix):].split("/", 1)[1] for m, p in self.requests if m == "GET" and p.startswith(prefix)}

    # ------------------------------------------------------------------------------------------------ routing
    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        url = urlsplit(h.path)
        path, query = unquote(url.path), parse_qs(url.query)
        self.requests.append((h.command, path))
        for prefix, repos in (("/api/models/", self.repos), ("/api/datasets/", self.datasets)):
            if path.startswith(prefix):
                return self._api(h, path[len(prefix):], head, repos, query)
        if "/resolve/" in path:
            repo_id, rest = path.lstrip("/").split("/resolve/", 1)
            repos = self.repos
            if repo_id.startswith("datasets/"):
                repo_id, repos = repo_id[len("datasets/"):], self.datasets
            rev, _, name = rest.partition("/")
            return self._resolve(h, repo_id, name, head, repos)
        return self._send(h, 404, b"not found", {"X-Error-Code": "RepoNotFound"}, head)

    def _post(self, h: BaseHTTPRequestHandler) -> None:
        """POST /api/{models,datasets}/<repo>/paths-info/<rev> with a form of `paths` (and `expand`)."""
        path = unquote(urlsplit(h.path).path)
        self.requests.append(("POST", path))
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0)).decode()
        form = json.loads(body) if body.lstrip().startswith("{") else parse_qs(body)
        paths = form.get("paths") or []
        paths = [paths] if isinstance(paths, str) else paths
        for prefix, repos in (("/api/models/", self.repos), ("/api/datasets/", self.datasets)):
            if path.startswith(prefix) and "/paths-info/" in path:
                repo = repos.get(path[len(prefix):].split("/paths-info/", 1)[0])
                if repo is None:
                    break
                names = set(repo.files) | repo.folders()
                body = json.dumps([repo.entry(p.strip("/")) for p in paths if p.strip("/") in names]).encode()
                return self._send(h, 200, body, {"Content-Type": "application/json"}, False)
        self._send(h, 404, json.dumps({"error": "Repository not found"}).encode(),
                   {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"}, False)

    def _api(self, h, rest: str, head: bool, repos: dict, query: dict) -> None:
        for marker in ("/tree/", "/revision/"):
            if marker in rest:
                repo_id, tail = rest.split(marker, 1)
                kind = marker.strip("/")
                break
        else:
            repo_id, tail, kind = rest.rstrip("/"), "", "info"
        repo = repos.get(repo_id)
        if repo is None:
            return self._send(h, 404, json.dumps({"error": "Repository not found"}).encode(),
                              {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"}, head)
        if kind == "tree":
            _rev, _, sub = tail.partition("/")
            entries = repo.tree(sub, recursive=query.get("recursive", ["false"])[0].lower() == "true")
            if entries is None:
                return self._send(h, 404, json.dumps({"error": "Entry not found"}).encode(),
                                  {"X-Error-Code": "EntryNotFound", "Content-Type": "application/json"}, head)
            body = json.dumps(entries).encode()
        else:
            body = json.dumps({"id": repo.id, "modelId": repo.id, "sha": repo.sha, "private": False, "gated": False,
                               "disabled": False, "tags": [], "downloads": 0, "likes": 0,
                               "siblings": [{"rfilename": n} for n in repo.files]}).encode()
        self._send(h, 200, body, {"Content-Type": "application/json"}, head)

    def _resolve(self, h, repo_id: str, name: str, head: bool, repos: dict) -> None:
        repo = repos.get(repo_id)
        if repo is None:
            return self._send(h, 404, b"Repository not found", {"X-Error-Code": "RepoNotFound"}, head)
        if name not in repo.files:
            return self._send(h, 404, b"Entry not found", {"X-Error-Code": "EntryNotFound",
                                                            "X-Repo-Commit": repo.sha}, head)
        data = repo.files[name].read_bytes()
        headers = {"ETag": f'"{repo.etag(name)}"', "X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        status, rng = 200, h.headers.get("Range")
        if rng and rng.startswith("bytes=") and not head:
            start, _, end = rng[len("bytes="):].partition("-")
            a = int(start or 0)
            b = int(end) if end else len(data) - 1
            headers["Content-Range"] = f"bytes {a}-{b}/{len(data)}"
            data, status = data[a:b + 1], 206
        self._send(h, status, data, headers, head)

    @staticmethod
    def _send(h, status: int, body: bytes, headers: dict, head: bool) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)


# ------------------------------------------------------------------------------------------------ the paper models
MARIAN_CODES = (">>cmn_Hans<<", ">>cmn_Hant<<", ">>yue_Hant<<")


def build_paper_models(out_dir: str | Path) -> dict[str, Path]:
    """Tiny random stand-ins for every model the paper profiles name, saved under folders named after their ids:
    the SimCSE encoder and BERT start weights (tiny BERT), opus-mt en-zh (multi-target, like the real one) and
    zh-en (tiny Marian), the four wmt19 models (tiny FSMT)."""
    from tests.tiny_bert import build_tiny_bert
    from bench.fixtures.tiny_mt import build_tiny_fsmt, build_tiny_marian

    out = Path(out_dir)
    bert = build_tiny_bert(out / "bert-base-uncased", seed=0, dropout=0.1)
    models = {"bert-base-uncased": bert,
              "princeton-nlp/unsup-simcse-bert-base-uncased": build_tiny_bert(out / "unsup-simcse", seed=5),
              "Helsinki-NLP/opus-mt-en-zh": build_tiny_marian(out / "opus-mt-en-zh", seed=1, target_codes=MARIAN_CODES),
              "Helsinki-NLP/opus-mt-zh-en": build_tiny_marian(out / "opus-mt-zh-en", seed=2)}
    for i, pair in enumerate(("en-de", "de-en", "en-ru", "ru-en")):
        models[f"facebook/wmt19-{pair}"] = build_tiny_fsmt(out / f"wmt19-{pair}", seed=10 + i)
    return models


def main(argv: list[str] | None = None) -> None:
    """python -m tests.fake_hub DIR [--port N]: build the paper models into DIR (once) and serve them."""
    import argparse
    import time

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("dir")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    index = Path(args.dir) / "models.json"
    if index.is_file():
        models = json.loads(index.read_text())
    else:
        models = {k: str(v) for k, v in build_paper_models(args.dir).items()}
        index.write_text(json.dumps(models, indent=1))
    with FakeHub(models, port=args.port) as hub:
        print(f"serving {len(models)} models; in another shell: export HF_ENDPOINT={hub.url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()


# what a user's shell on a connected machine would not have: the suite's offline switches, caches and Prefect server
USER_ENV_DROPS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE",
                  "PREFECT_HOME", "PREFECT_API_URL")


def user_env(endpoint: str, hf_home: Path) -> dict:
    """The environment of a user on a connected machine: theirs, with no offline switch, plus the endpoint."""
    env = {k: v for k, v in os.environ.items() if k not in USER_ENV_DROPS and not k.startswith("PYTEST")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(hf_home))
    return env
