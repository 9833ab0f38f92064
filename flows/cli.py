"""contramine's command line (what the Makefile calls, and the installed `contramine` script).

    python -m contramine.flows.cli mine   [--profile P] [--run R] [--corpus C] [--set k=v ...] [--force [STAGE ...]]
    python -m contramine.flows.cli stage  NAME [same options]
    python -m contramine.flows.cli sql    [--run R] [--query "SELECT ..."]
    python -m contramine.flows.cli report [--run R]
    python -m contramine.flows.cli export [--run R] [--format triplet ...]
    python -m contramine.flows.cli cache  [--prune] [--older-than DAYS] [--unreferenced] [--verify] [--dry-run]
    python -m contramine.flows.cli verify [--run R] [--memo]      every shard checked against its manifest's hash
    python -m contramine.flows.cli train | eval | compare | bench | scale | doctor  [their own options: --help]

`contramine` (the installed script) is the same command line. A hint it prints names the command the user ran:
`make sql RUN=r` under make (the Makefile exports CONTRAMINE_VIA=make), `contramine sql --run r` otherwise
(pipeline/hints.py).

Settings, the corpus and the models are checked before Prefect starts or anything is written; a problem is one
line on stderr naming the key, file or model, and exit code 2. A stage that fails on its input once the run has
started (a `StageError`, pipeline/errors.py: e.g. a precomputed-embeddings file without a vector for some text)
ends the same way: one `error:` line, exit 2, no traceback (flows/logging.yml keeps Prefect's copy of it off the
terminal), and no half-written shard (pipeline/storage/atomic.py). A command imports what it uses: `sql` and
`report` load neither torch nor Prefect.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import sys
import time
from pathlib import Path

from . import env  # Prefect settings before Prefect
from contramine.pipeline.arguments import ArgumentParser, days, whole_number
from contramine.pipeline.config import Config, ConfigError, configure, secrets_to_environment, split_overrides
from contramine.pipeline.errors import ExpectedError, printable, unwritable
from contramine.pipeline.hints import command, no_such_run

from .help import COMMANDS, DELEGATED, DESCRIPTION, EXAMPLES
from .upkeep import InputMissing, cmd_cache, cmd_verify
from contramine.pipeline.engine.discovery import module_names

# Prefect logs a failed task or flow run with its traceback; for the errors this CLI reports in one line, the
# console handler of flows/logging.yml drops that record (contramine.pipeline.errors.ExpectedErrors; the API still gets it).
# Only in the command's own process (`python -m contramine.flows.cli`; an in-process caller keeps its logging), set before
# Prefect is imported (it reads its logging config then), and inherited by Dask worker processes. A logging config
# of the user's own (the setting, or logging.yml in PREFECT_HOME) wins.
LOGGING_YML = Path(__file__).with_name("logging.yml")
_USERS_LOGGING = (os.environ.get("PREFECT_LOGGING_CONFIG_PATH") or os.environ.get("PREFECT_LOGGING_SETTINGS_PATH")
                  or (Path(os.environ["PREFECT_HOME"]).expanduser() / "logging.yml").is_file())
if __name__ == "__main__" and LOGGING_YML.is_file() and not _USERS_LOGGING:
    os.environ["PREFECT_LOGGING_CONFIG_PATH"] = str(LOGGING_YML)


def preflight(cfg: Config, stages: list[str]) -> tuple[list[str], dict]:
    """Fail fast on what would fail later: the training sections, then each check the stages to run declare
    (`@stage(checks=...)`: the corpus, every model resolved — downloaded where needed — once per run), each distinct
    check once. Returns their plain-words notes and the resources they resolved (the flow takes that plan as it is).
    Names no stage: what a stage needs checked is declared with it."""
    from contramine.pipeline.engine.runner import load_stages
    from contramine.trainer.objectives import check_settings

    check_settings(cfg.train)  # the profile's [train.<objective>] sections: a typo is caught before any work
    notes, plan, done = [], {}, set()
    for name in stages:
        for check in load_stages()[name].checks:
            if check not in done:
                done.add(check)
                found = check(cfg)
                if found:
                    notes += found[0]
                    plan.update(found[1])
    return notes, plan


def check_inputs(cfg: Config, stage: str) -> None:
    from contramine.pipeline.engine.runner import load_stages
    from contramine.pipeline.engine.discovery import writer as writer_of
    from contramine.pipeline.storage.store import Store

    store = Store(cfg.run.dir)
    for table in load_stages()[stage].inputs:
        if not store.exists(table):
            writer = writer_of(table)
            raise InputMissing(f"stage {stage} reads table `{table}`, which run {cfg.run.name!r} does not have yet: "
                               f"run `{command('stage', stage=writer, run=cfg.run.name)}` (or "
                               f"`{command('mine', run=cfg.run.name)}`) first")
        man = store.manifest(table)
        if man and man.get("shards") != cfg.run.shards:
            raise InputMissing(f"table `{table}` of run {cfg.run.name!r} has {man.get('shards')} shards but run.shards "
                               f"is {cfg.run.shards}: rerun from its stage, or set run.shards={man.get('shards')}")
        damaged = [i for i in range(cfg.run.shards) if not store.intact(table, i, cfg.run.shards)]
        if damaged:  # the first damaged shard by name, and the stage run that rewrites it (verify.damaged_line)
            from contramine.pipeline.storage.verify import damaged_line

            raise InputMissing(damaged_line(store.dir(table), store.shard_path(table, damaged[0], cfg.run.shards).name,
                                            f"is missing or changed since written (shards {damaged} of it)"))


def reuse_source(value: str, cfg: Config) -> Path:
    """The folder `--reuse-from` names: another run of this run's root, by its name (or that folder's absolute path).
    Checked before anything is linked: `../x` or a path elsewhere would bring in tables from outside the runs."""
    from contramine.pipeline.config.names import check_name, inside

    root, name = Path(cfg.run.root), value
    if Path(value).is_absolute() and os.path.dirname(os.path.abspath(value)) == os.path.abspath(root):
        name = os.path.basename(os.path.abspath(value))  # /…/artifacts/<run>: that run
    check_name("--reuse-from", name, "the run to start from", f"run.root ({root}/)")
    if name == cfg.run.name:
        raise ConfigError(f"--reuse-from {value!r} is this run (run.name {cfg.run.name!r}): name the run to start from")
    return inside(root, name, setting="--reuse-from")


def cmd_mine(args, cfg: Config) -> None:
    from contramine.pipeline.engine.discovery import check_stages

    from .mine import mine_flow, stages_to_mine

    stages = stages_to_mine(cfg)
    check_stages("--force", args.force or [], stages)  # before any work: a misspelt stage would recompute nothing
    if args.reuse_from:
        from contramine.pipeline.storage.tables import reuse_tables

        source = reuse_source(args.reuse_from, cfg)
        brought = reuse_tables(source, cfg.run.dir)
        print(f"run {cfg.run.name!r} starts from {len(brought)} table(s) of {source}/ "
              f"({', '.join(brought) or 'none new'}): a shard is reused only where its key matches this run's settings",
              file=sys.stderr)
    notes, plan = preflight(cfg, stages)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    t0 = time.perf_counter()
    with env.heartbeats_where_read():  # none to Prefect's temporary server: each flow run's exit waited ~1 s
        rows = mine_flow(profile=args.profile, run=args.run, corpus=args.corpus, overrides=args.set,
                         force=stages if args.force == [] else (args.force or []), plan=plan, only=stages)
    print(f"\nmined run {cfg.run.name!r} in {time.perf_counter() - t0:.0f}s → {cfg.run.dir}")
    for stage, counts in rows.items():
        print(f"  {stage:<14} " + ", ".join(f"{t}={n}" for t, n in counts.items()))
    print(f"look at it: {command('sql', run=cfg.run.name)}   |   report: {command('report', run=cfg.run.name)}")


def cmd_stage(args, cfg: Config) -> None:
    from contramine.pipeline.engine.runner import load_stages, memo_line

    from .mine import run_stage_flow

    if args.name not in load_stages():
        raise ConfigError(f"unknown stage {args.name!r}; stages: {', '.join(load_stages())}")
    notes, plan = preflight(cfg, [args.name])
    if not load_stages()[args.name].one_job:
        check_inputs(cfg, args.name)  # before the notes: a missing input is the one line the user gets
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    with env.heartbeats_where_read():
        manifest = run_stage_flow(args.name, cfg, profile=args.profile, run=args.run, corpus=args.corpus,
                                  overrides=args.set, force=args.force is not None, plan=plan)
    print(f"{args.name}: {manifest['shards_computed']} shards computed, {manifest['shards_cached']} reused, "
          f"rows {manifest['rows']}{memo_line(manifest)}")


class QueryFailed(ExpectedError, RuntimeError):
    """`make sql Q=...` whose query DuckDB refuses: its message in one line (or the refusal of the table it names)."""


def cmd_sql(args, cfg: Config) -> None:
    from .sql import open_run, repl, run_query

    if args.query is not None and not args.query.strip():  # `-q ""` asks for a query, not the shell
        raise QueryFailed("sql: the query is empty: give --query one SQL statement, or leave --query out for the "
                          "shell")
    try:
        con, refused = open_run(cfg.run.dir)
    except FileNotFoundError as e:
        raise InputMissing(str(e)) from None
    if args.query is not None:
        if (why := run_query(con, args.query, refused, args.max_rows)) is not None:
            raise QueryFailed(why)
        for line in refused.values():  # the query did not need them: each said once, after its answer
            print(f"warning: {line}", file=sys.stderr)
    else:
        for line in refused.values():
            print(f"warning: {line}", file=sys.stderr)
        repl(con, cfg.run.dir, refused)


def cmd_report(args, cfg: Config) -> None:
    from contramine.pipeline.report import write_report

    must_exist(cfg)  # a typo'd run name gets one line, not an empty run folder with a report in it
    print(write_report(cfg.run.dir))


def must_exist(cfg: Config) -> None:
    if not cfg.run.dir.is_dir():
        raise InputMissing(no_such_run(cfg.run.dir))


def cmd_export(args, cfg: Config) -> None:
    from contramine.pipeline.export import export_run

    must_exist(cfg)  # a typo'd run name: this line, not "table pairs not found" under a folder that is not there
    for fmt in args.format:
        print(f"{fmt}: wrote {export_run(cfg.run.dir, fmt)} (load it with datasets.load_dataset(<that folder>))")


def run_delegated(name: str, rest: list[str]) -> int:
    import importlib

    module, _ = DELEGATED[name]
    try:
        entry = importlib.import_module(module).main
    except ModuleNotFoundError as e:
        if e.name != module.split(".")[0]:
            raise  # a missing dependency of the command itself: its own traceback
        say_last(f"error: `contramine {name}` needs {e.name}/ (it comes with a checkout of the repository)")
        return 2
    try:
        return entry(rest) or 0
    except ExpectedError as e:
        say_last("error: " + " ".join(str(e).splitlines()))
        return 2
    except OSError as e:
        if unwritable(e) is None:
            raise
        say_last(f"error: {name}: {unwritable(e)}")
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # allow_abbrev=False on every parser: argparse took `--for debcse` as `--force debcse`, an abbreviation
    p = ArgumentParser(prog="contramine", description=DESCRIPTION, epilog=EXAMPLES, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name, (what, example) in COMMANDS.items():
        s = sub.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".", epilog="example:\n  "
                           + example, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
        if name == "stage":
            s.add_argument("name", help=f"one of: {', '.join(module_names())}")
        s.add_argument("--profile", default="default", help="a profile's name (default, simcse-paper, debcse-paper, "
                       "...: packaged with the install) or a path to a .toml")
        s.add_argument("--run", default=None, help="run name: tables go to artifacts/<run>/")
        s.add_argument("--corpus", default=None, help="a text file (one sentence a line), Parquet or JSON Lines (the "
                       "field data.text_field, default `text`), any of them .gz or .zst, a folder or glob of such "
                       "files, or hf:<dataset id> (data.hf_split, data.hf_config, data.hf_revision)")
        # extend: a second --set adds to the first (with store, it silently dropped the first one's keys)
        s.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE", help="config overrides")
        if name == "mine":
            s.add_argument("--force", nargs="*", default=None, metavar="STAGE",
                           help="recompute these stages (all when none named) even where shards are intact")
            # extend: `--for debcse osscse` and `--for debcse --for osscse` both mine what either needs (with
            # store, a second --for silently replaced the first)
            s.add_argument("--for", dest="for_objective", nargs="+", action="extend", default=None,
                           metavar="OBJECTIVE", help="only the stages whose tables these objectives train on and "
                           "export (the setting mine.for); default: all")
            s.add_argument("--reuse-from", default=None, metavar="RUN",
                           help="first bring in that run's finished tables (hard links) that this run has not got: "
                                "each shard is still reused only where its key matches (e.g. the same corpus mined "
                                "with another encoder recomputes what the encoder decides, nothing else)")
        elif name == "stage":
            s.add_argument("--force", nargs="*", default=None, help="recompute even where shards are intact")
        if name == "export":
            from contramine.pipeline.export import FORMATS

            s.add_argument("--format", nargs="+", default=["triplet"], choices=list(FORMATS),
                           help="the sentence-transformers dataset format(s) to write")
        if name == "cache":
            s.add_argument("--prune", action="store_true", help="remove temp files of killed writes (an hour old), and shards "
                           "that commits replaced over runner.keep_replaced_s ago")
            s.add_argument("--older-than", type=days, default=None, metavar="DAYS",
                           help="remove packs not used for this many days")
            s.add_argument("--unreferenced", action="store_true",
                           help="remove namespaces that no finished table under run.root names in its manifest")
            s.add_argument("--verify", action="store_true",
                           help="read every pack whole and check it as a lookup does (checksums, schema, writer "
                                "record, values hash); move a pack that fails to <memo>/.quarantine/ (exit 2)")
            s.add_argument("--dry-run", action="store_true", help="say what would go, remove or move nothing")
        if name == "verify":
            s.add_argument("--memo", action="store_true", help="also verify every pack of the row memo (as `cache "
                           "--verify`: a pack that fails moves to <memo>/.quarantine/)")
            s.add_argument("--dry-run", action="store_true", help="with --memo: move no pack")
        if name == "sql":
            s.add_argument("--query", "-q", default=None, help="one SQL statement (default: an interactive shell)")
            s.add_argument("--max-rows", type=whole_number(1), default=40, help="rows printed at most (>= 1)")
    for name, (module, what) in DELEGATED.items():
        sub.add_parser(name, help=f"{what}; options: contramine {name} --help", add_help=False, allow_abbrev=False)
    if argv and argv[0] in DELEGATED:
        return run_delegated(argv[0], argv[1:])
    args = p.parse_args(argv)
    # make passes SET="a=1 b=2" as one word: split before each `key=`, not inside a value ('x=[["a", "b"]]')
    args.set = [kv for item in args.set for kv in split_overrides(item)]
    if getattr(args, "for_objective", None):  # its setting, as a TOML list
        args.set += ["mine.for=[" + ", ".join(json.dumps(name) for name in args.for_objective) + "]"]
    # a secret (runner.memo_key) travels in the environment: the overrides become Prefect's flow-run parameters
    given = len(args.set)
    args.set = secrets_to_environment(args.set)
    if len(args.set) < given:  # it works, but the command line is no place for a secret
        print("warning: a secret setting (runner.memo_key) on the command line can be read by every local account "
              "(ps, /proc/<pid>/cmdline) and `make` prints its commands: set $CONTRAMINE_MEMO_KEY, or put it in a "
              "profile only you can read", file=sys.stderr)
    try:
        cfg = configure(args.profile, args.run, args.corpus, args.set)
        {"mine": cmd_mine, "stage": cmd_stage, "sql": cmd_sql, "report": cmd_report,
         "export": cmd_export, "cache": cmd_cache, "verify": cmd_verify}[args.cmd](args, cfg)
    except ExpectedError as e:
        # raised before Prefect started, or inside a shard task: Prefect's flow call re-raises the task's own
        # exception. One line, whatever the message holds, and the last one.
        say_last("error: " + " ".join(str(e).splitlines()))
        return 2
    except OSError as e:  # a write the file system refused (a read-only run folder): one line, else the traceback
        if unwritable(e) is None:
            raise
        say_last(f"error: {args.cmd}: {unwritable(e, cfg.run.dir if 'cfg' in locals() else None)}")
        return 2
    except RuntimeError as e:  # Prefect's client, where the server PREFECT_API_URL names does not answer
        if not str(e).startswith("Failed to reach API at"):
            raise
        say_last(f"error: {args.cmd}: {e} (PREFECT_API_URL): start that Prefect server, or unset PREFECT_API_URL "
                 f"and each command starts a temporary one")
        return 2
    finally:
        # Arrow readers a failed command's frames still hold in reference cycles are freed now, while Arrow is whole:
        # freed in the interpreter's last collection, a reader's thread can outlive Arrow's pools and abort the exit
        # ("terminate called without an active exception", apache/arrow#34314; seen once in ~50 suite runs)
        gc.collect()
    return 0


_LAST_WORDS: list[str] = []


def say_last(line: str) -> None:
    """Print `line` on stderr as the last line the user sees. Without PREFECT_API_URL, Prefect runs a temporary
    server and, when the process exits, drains its log queue to it and stops it, logging "Stopping temporary server"
    as it does: a line that would come after ours. So in the command's own process (`python -m contramine.flows.cli`, where
    this module is __main__) `line` waits for the exit hook below, registered before Prefect was imported: exit
    hooks run last-registered first, so it runs after Prefect's. Otherwise (a configured server, the user's or the
    tests' harness, logs nothing at exit; an in-process call returns first) it is printed now. Control characters
    (a corpus file named with terminal escapes) are shown as Python writes them in a string, never sent raw."""
    line = printable(line)
    if __name__ == "__main__" and "prefect.server.api.server" in sys.modules:
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            _LAST_WORDS.append(line)
            return
    print(line, file=sys.stderr, flush=True)


@atexit.register
def _say_last_words() -> None:
    while _LAST_WORDS:
        print(_LAST_WORDS.pop(0), file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
