"""The base of every config section and the config's one error type (pipeline.config re-exports both)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A bad profile, key or value; the message is one line that names it."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)
