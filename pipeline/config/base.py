"""The base of every config section, the config's one error type, and where the project's folders are."""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from contramine.pipeline.errors import ExpectedError

ROOT = Path(__file__).resolve().parent.parent.parent
# A checkout (the repository: its configs/ beside pyproject.toml) keeps runs in its own artifacts/ and reads the
# shared data beside it; an installed package (`pip install`: ROOT is site-packages) reads the profiles packaged
# with it (pyproject.toml maps configs/ to pipeline/profiles) and keeps runs in ./artifacts of the folder it runs in.
CHECKOUT = (ROOT / "pyproject.toml").is_file() and (ROOT / "configs").is_dir()
CONFIG_DIR = ROOT / "configs" if CHECKOUT else Path(__file__).resolve().parent.parent / "profiles"
ARTIFACTS = ROOT / "artifacts" if CHECKOUT else Path.cwd() / "artifacts"
SHARED_DATA = (ROOT.parent / "shared" / "data").resolve()  # a checkout's data (the default corpus, SentEval)


class ConfigError(ExpectedError, ValueError):
    """A bad profile, key or value; the message is one line that names it."""


class Section(BaseModel):
    """A config section. Two class-level sets say which of its settings stay out of cache keys:

    - EXECUTION: how fast, not what (batch sizes, threads): a result never depends on them;
    - RESOLVED: settings whose resolved value a resource's plan records instead (`encoder.device = "auto"` becomes
      the device kind in the encoder's plan): the plan is in the key, the setting would only add a needless one.
    """
    # no NaN or infinity in any setting (a section may allow them in a field of its own): `ipw.absolute_margin=nan`
    # silently dropped no negative, `backtranslate.max_new_tokens_factor=inf` crashed on its first row, `train.lr=inf`
    # trained NaNs
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


def result_settings(section: Section) -> dict:
    """A section's settings less its execution and resolved settings: what enters a cache key."""
    dump = section.model_dump(mode="json")
    for name in (*getattr(type(section), "EXECUTION", ()), *getattr(type(section), "RESOLVED", ())):
        dump.pop(name, None)
    return dump


def section_constants(section: Section) -> dict:
    """The section's class-level constants (upper-case int / float / str ClassVars, e.g. NeighboursCfg.MAX_EF_SEARCH):
    they shape results as settings do, and model_dump leaves them out."""
    return {k: v for cls in reversed(type(section).__mro__) for k, v in vars(cls).items()
            if k.isupper() and isinstance(v, (int, float, str)) and not isinstance(v, bool)}
