"""Loading a config: TOML profiles (with `inherit`), `SET="key=value ..."` overrides, the shard count that follows the
corpus. The typed sections are in mining.py, backtranslation.py and training.py, `Config` in root.py."""
from __future__ import annotations

import json
import os
import re
import tomllib
import types
import typing
from pathlib import Path, PurePath

from pydantic import BaseModel, SecretStr, ValidationError

from contramine.pipeline.config.base import CONFIG_DIR, ConfigError
from contramine.pipeline.config.root import Config


def split_overrides(text: str) -> list[str]:
    """`SET="a.b=1 c.d=[1, 2] e={x=1, y="p q"}"` -> one `key=value` each: split on blanks followed by `key=`, but
    never inside brackets, braces or quotes (inline TOML tables have `key=` of their own)."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch.isspace() and depth == 0 and re.match(r"\s+[A-Za-z_][\w.]*=", text[i:]):
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [s.strip() for s in out if s.strip()]


def _toml(raw: str):
    return tomllib.loads(f"v = {raw}")["v"]


def _quote_bare_words(raw: str) -> str:
    """`[[/models/en-xx, org/model]]` -> `[["/models/en-xx", "org/model"]]`: paths and hub ids typed in a list
    without TOML's quotes (numbers and booleans stay what they are)."""
    def quote(m: re.Match) -> str:
        word = m.group(2)
        try:
            _toml(word)
            return m.group(0)
        except tomllib.TOMLDecodeError:
            return m.group(1) + json.dumps(word)
    return re.sub(r"""(^|[\[,]\s*)([^\s\[\]{},"'=]+)(?=\s*[\],])""", quote, raw)


def _parse_value(raw: str):
    """`key=value` values are TOML when they parse as TOML (numbers, booleans, lists; unquoted words in a list are
    strings), else plain strings."""
    try:
        return _toml(raw)
    except tomllib.TOMLDecodeError:
        pass
    if raw.lstrip().startswith("["):
        try:
            return _toml(_quote_bare_words(raw))
        except tomllib.TOMLDecodeError:
            pass
    return raw


def _declared(dotted: str):
    """The declared type of config key `dotted`, or None where it is no field of a section (a key inside a dict
    setting such as train.osscse.*, or an unknown key: validation names that one)."""
    model: type[BaseModel] | None  # the section the next part names a field of (None: past the sections)
    model, annotation = Config, None
    for part in dotted.split("."):
        field = model.model_fields.get(part) if model else None
        if field is None:
            return None
        annotation = field.annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return annotation


def _takes_text(annotation) -> bool:
    """A str or path setting (optional or not): `run.name=2024` or `=2024-01-01` means that text, not a number or
    a date (TOML's reading, which the setting would refuse)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds = [a for a in (typing.get_args(annotation) if union else (annotation,)) if a is not type(None)]
    return bool(kinds) and all(isinstance(a, type) and issubclass(a, (str, PurePath)) for a in kinds)


def _override_value(key: str, raw: str):
    value = _parse_value(raw)
    if not isinstance(value, (str, list, dict)) and _takes_text(_declared(key)):
        return raw  # the text as written: "2024.10" stays "2024.10", not the float 2024.1
    return value


def _set_dotted(tree: dict, dotted: str, value) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config override {dotted!r}: {p!r} is not a section")
    node[leaf] = value


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_profile(name: str, _seen: tuple = ()) -> dict:
    path = Path(name) if name.endswith(".toml") else CONFIG_DIR / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.toml")))
        raise ConfigError(f"profile {name!r} not found ({path}); known profiles: {known}")
    if path in _seen:
        raise ConfigError(f"profile {path} inherits itself")
    try:
        tree = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from None
    parent = tree.pop("inherit", None)
    return _merge(read_profile(parent, _seen + (path,)), tree) if parent else tree


def secret_settings(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, str]:
    """{dotted key: the environment variable it travels in} of every secret setting (a SecretStr field, its variable
    named by the field's `env`), e.g. {"runner.memo_key": "CONTRAMINE_MEMO_KEY"}."""
    found = {}
    for name, field in model.model_fields.items():
        if SecretStr in (typing.get_args(field.annotation) or (field.annotation,)):
            found[prefix + name] = field.json_schema_extra["env"]
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found.update(secret_settings(field.annotation, f"{prefix}{name}."))
    return found


def secrets_to_environment(overrides: list[str]) -> list[str]:
    """`overrides` without the secret settings among them, each moved into its environment variable, where config
    loading reads it (in this process, and in every process it starts: Dask workers, Prefect's subprocesses). A flow's
    overrides are its parameters, which Prefect keeps in its database and sends to its API server; the environment
    goes nowhere. The value is the text as typed (a TOML-quoted string unquoted), never read as a number."""
    secrets, kept = secret_settings(), []
    for item in overrides:
        key, _, raw = item.partition("=")
        if key.strip() not in secrets:
            kept.append(item)
            continue
        raw = raw.strip()
        quoted = raw[:1] in ("'", '"') and isinstance(_parse_value(raw), str)
        os.environ[secrets[key.strip()]] = _parse_value(raw) if quoted else raw
    return kept


def _setting_it(key: str) -> str:
    """A regular expression of an override that sets `key`: by its key (`runner.memo_key=...`) or inside its
    section's table (`runner={memo_key=...}`)."""
    section, _, leaf = key.rpartition(".")
    ways = [re.escape(key) + r"\s*="] + ([re.escape(section) + r"\s*=.*\b" + re.escape(leaf) + r"\b"] if section else [])
    return r"^\s*(" + "|".join(ways) + ")"


def secret_pattern() -> str:
    """A regular expression (JSON Schema's and Python's alike) of an override that sets any secret setting: what a
    flow's `overrides` parameter refuses (flows/mine.py)."""
    return "|".join(_setting_it(k) for k in secret_settings())


def secrets_given(overrides: list[str] | None) -> list[str]:
    """The secret settings (their keys, never their values) that `overrides` sets."""
    return [k for k in secret_settings()
            if any(isinstance(item, str) and re.match(_setting_it(k), item) for item in overrides or [])]


def refuse_secrets(overrides: list[str] | None, where: str) -> None:
    """One line, naming the key and never its value, when `overrides` (`where`: a flow run's parameters, a
    deployment's) sets a secret setting: Prefect keeps parameters in its database and shows them in its UI."""
    keys = secrets_given(overrides)
    if keys:
        variables = ", ".join(f"${secret_settings()[k]}" for k in keys)
        raise ConfigError(f"{', '.join(keys)} given in {where}, which Prefect keeps in its database: refused; set "
                          f"{variables} in the environment of the Prefect worker (or process) that runs the flow, "
                          f"and leave it out of the parameters")


def configure(profile: str = "default", run: str | None = None, corpus: str | None = None,
              overrides: list[str] | None = None) -> Config:
    """The config of a CLI call or flow run: a profile, the run name and corpus as given, per-key overrides."""
    sets = list(overrides or [])
    if run is not None:  # "" too: `--run ""` is a name (refused in one line), not the profile's run
        sets.append(f"run.name={run}")
    if corpus is not None:
        sets.append(f"data.corpus={corpus}")
    cfg = load_config(profile, sets)
    needed = shards_for(cfg.data.corpus, cfg.run.max_shard_rows, cfg.data)
    if needed > cfg.run.shards:  # the shard count follows the corpus size only; tables do not depend on it, and
        # it must not depend on runner.workers either: it is part of every key (a rerun with 3 workers instead of 2
        # would recompute every stage). Workers idle in a last round cost less than that.
        cfg = load_config(profile, [*sets, f"run.shards={needed}"])
    profile_secrets_to_environment(cfg)
    return cfg


def profile_secrets_to_environment(cfg: Config) -> None:
    """A secret a profile file gives (`[runner] memo_key = ...`), into its environment variable where that is unset:
    the jobs get the config without its secrets (they are never serialised), and read them from the environment, as
    they do a `--set` one. A profile's key was silently dropped: every pack was written without its keyed hash."""
    for key, var in secret_settings().items():
        section, _, leaf = key.rpartition(".")
        value = getattr(getattr(cfg, section), leaf) if section else getattr(cfg, leaf)
        if value is None:
            continue
        if os.environ.get(var) and os.environ[var] != value.get_secret_value():  # the jobs would take the other
            raise ConfigError(f"{key}: the profile gives one and ${var} another (the jobs would take ${var}): "
                              f"give it once")
        os.environ[var] = value.get_secret_value()


def shards_for(corpus, max_shard_rows: int, data=None) -> int:
    """ceil(records / max_shard_rows) of a corpus (pipeline/corpus/: lines of text and JSON Lines, rows of Parquet,
    over all its parts), read as the [data] settings `data` say (default ones without); 0 when off, when the corpus
    is unset or unreadable (the sentences stage says why), and for a hub dataset, whose size is not known before it
    is streamed (run.shards decides)."""
    if not max_shard_rows or corpus is None:
        return 0
    from contramine.pipeline.corpus import Corpus, corpus_of  # corpus loads pyarrow: settings (and the losses) do not

    try:
        lines = sum(n for _, n in (corpus_of(data, corpus) if data else Corpus(str(corpus))).sources())
    except Exception:  # not readable: the sentences stage's check says so, naming the file
        return 0
    return -(-lines // max_shard_rows)


def load_config(profile: str = "default", overrides: list[str] | tuple[str, ...] = ()) -> Config:
    tree = read_profile(profile)
    tree.setdefault("profile", Path(profile).stem)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"config override {item!r}: expected key=value, e.g. neighbours.pool_size=32")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), _override_value(key.strip(), raw.strip()))
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        named = msg.startswith(f"{key} ")  # a message that names its key already (run.name '..': ...)
        raise ConfigError(f"config error: {msg if named else f'{key}: {msg}'} (profile {profile!r})") from None
