"""Content keys of the trainer's reusable outputs: a key names data by its bytes, never by a path, a name or a size.

    fingerprint(run_dir, tables)     the mined tables: (table, content hash) as Store.table_hash computes it, every
                                     shard checked against the hash its writer recorded (TableDamaged if it differs)
    eval_data_hash(senteval, probe)  the files trainer/evaluate.py reads (dev_only: the dev selection's files)
    eval_code_version()              trainer/evaluate.py and every trainer/pipeline module it imports, transitively

They make up trainer/train.py's resume key (last/), trainer/compare.py's run key (run.json) and the key of compare's
start.json: what ran is what is keyed, so a shard rewritten in place with the same name and size, a start model
saved again into the same folder or an edited STS file is noticed, and an output computed from other bytes is never
reused.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from contramine.pipeline.codeversion import imported_modules
from contramine.pipeline.storage.store import combine, file_hash
from contramine.pipeline.storage.tables import RunTables, TableMissing, writer_of
from contramine.pipeline.hints import command, no_such_run
from contramine.trainer.sts import SICK_FILES, STS_TASKS, STSB_FILES

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("trainer", "pipeline")
# Settings modules: the values that matter to a key are in it already (pooler, max length, precision). Followed, the
# config would tie the evaluation to every module it imports (the translation engines' settings...).
NOT_FOLLOWED = frozenset({"contramine.pipeline.config"})


class TableDamaged(TableMissing):
    """A mined shard's bytes no longer hash to what its writer recorded (edited, truncated, rewritten outside the
    pipeline). A subclass of TableMissing: the remedy is the same (its stage writes it again), and the CLIs that
    report a missing table report this one too."""


# ------------------------------------------------------------------------------------------------ mined tables
def _recorded_hash(part: Path) -> str | None:
    """The hash in the part's sidecar (Store.write_shard); None where there is no sidecar (a table written outside
    the pipeline, as the tests' tables are), "" where the sidecar is unreadable (so it can match nothing)."""
    side = part.with_suffix(".json")
    if not side.is_file():
        return None
    try:
        return str(json.loads(side.read_text()).get("hash") or "")
    except (json.JSONDecodeError, OSError, AttributeError):
        return ""


def shard_hash(part: Path, table: str) -> str:
    """The part's content hash. Always read from the bytes (the sidecar says what the writer wrote, not what is
    there now); a part whose bytes differ from its recorded hash is refused: training on it would train on data
    no stage produced, under a key that claims otherwise."""
    actual = file_hash(part)
    recorded = _recorded_hash(part)
    if recorded is not None and recorded != actual:
        side, run = part.with_suffix(".json").name, part.parent.parent.name
        raise TableDamaged(f"mined table {table!r}: {part} does not match the hash its sidecar {side} records "
                           f"(changed after its stage wrote it): run "
                           f"`{command('stage', stage=writer_of(table), run=run)}` "
                           f"to write it again (a damaged shard is recomputed, never reused)")
    return actual


def table_hash(run_dir: Path | str, table: str) -> str:
    """Content hash of a mined table: Store.table_hash's (the combined shard hashes, in shard order), verified."""
    return combine(*(shard_hash(p, table) for p in checked_files(run_dir, table)))


def checked_files(run_dir: Path | str, table: str) -> list[Path]:
    """RunTables.files, its TableMissing naming the stage that writes the table (named_missing)."""
    try:
        return RunTables(run_dir).files(table)
    except TableMissing:
        raise named_missing(run_dir, table) from None


def checked_dataset(run_dir: Path | str, table: str):
    """RunTables.dataset, its TableMissing naming the stage that writes the table (named_missing)."""
    try:
        return RunTables(run_dir).dataset(table)
    except TableMissing:
        raise named_missing(run_dir, table) from None


def named_missing(run_dir: Path | str, table: str) -> TableMissing:
    """The line for a table the run has not got, naming the stage that writes it (`contramine stage pairs --run
    r`): the stages declare that, so they are loaded here, on this error's path only (the trainer needs none)."""
    from contramine.pipeline.engine.discovery import load_stages

    if not Path(run_dir).is_dir():  # no run at all (a typo'd name): that, not the first table it lacks
        return TableMissing(no_such_run(Path(run_dir)))
    load_stages()
    return RunTables(run_dir).missing(table)


def fingerprint(run_dir: Path | str, tables: tuple[str, ...] | list[str]) -> list[list[str]]:
    """[table, content hash] of every table read: the data part of the trainer's resume key and compare's run key."""
    return [[t, table_hash(run_dir, t)] for t in tables]


# ------------------------------------------------------------------------------------------------ evaluation data
def eval_files(senteval_dir: Path | str, dev_only: bool = False, sick: bool = True) -> list[Path]:
    """The files trainer/evaluate.py reads: evaluate_all's (every scored STS12–16 subset, STS-B test and dev, SICK
    test and trial) or, `dev_only`, evaluate_dev's (STS-B dev, and SICK trial when `sick`)."""
    root = Path(senteval_dir)
    files = [root / "STS" / "STSBenchmark" / STSB_FILES["dev"]]
    if sick or not dev_only:
        files.append(root / "SICK" / SICK_FILES["trial"])
    if dev_only:
        return files
    for task in STS_TASKS:
        task_dir = root / "STS" / f"{task}-en-test"
        # the subsets load_sts_task reads: an input file with a gold file beside it (sts.sts_subsets)
        for inp in sorted(task_dir.glob("STS.input.*.txt")):
            gold = task_dir / inp.name.replace("STS.input.", "STS.gs.", 1)
            if gold.is_file():
                files += [inp, gold]
    return files + [root / "STS" / "STSBenchmark" / STSB_FILES["test"], root / "SICK" / SICK_FILES["test"]]


def eval_data_hash(senteval_dir: Path | str, probe: Path | str | None = None, dev_only: bool = False,
                   sick: bool = True) -> str:
    """Names (relative to the SentEval folder: a copied folder keeps its key) and bytes of the evaluation files, and
    of the probe when one is read. An absent file counts as absent: the evaluator reports it where it reads it."""
    root = Path(senteval_dir)
    h = hashlib.blake2b(digest_size=16)
    for f in eval_files(root, dev_only, sick):
        h.update(f"{f.relative_to(root).as_posix()}\0{file_hash(f) if f.is_file() else '-'}\0".encode())
    if probe is not None and Path(probe).is_file():
        h.update(f"probe\0{file_hash(Path(probe))}\0".encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ evaluation code
def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] not in PACKAGES or module in NOT_FOLLOWED:
        return None  # third-party code: its version is the environment's, not ours to hash (and NOT_FOLLOWED)
    base = ROOT.joinpath(*parts)
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def module_closure(roots: tuple[str, ...]) -> list[str]:
    """`roots` and every trainer/pipeline module they import, transitively (function-level imports too)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        path = _module_file(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        todo += sorted(imported_modules(path.read_text(), module + (".__init__" if path.name == "__init__.py" else ""))
                       - seen)
    return sorted(seen)


@functools.cache
def eval_code_version() -> str:
    """Hash of the evaluation code (trainer/evaluate.py's closure: the STS loaders, the encoder, its pooling...),
    as pipeline/codeversion.py hashes a stage's: derived from the imports, never a hand list."""
    h = hashlib.blake2b(b"contramine-eval-1", digest_size=16)
    for module in module_closure(("contramine.trainer.evaluate",)):
        h.update(module.encode() + b"\0" + _module_file(module).read_bytes())  # type: ignore[union-attr]  # has a file
    return h.hexdigest()
