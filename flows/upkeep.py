"""The upkeep commands of the CLI: `contramine verify` (every shard of a run against its manifest; --memo the row
memo's packs too) and `contramine cache` (the row memo: its size per stage and namespace, verifying, pruning)."""
from __future__ import annotations

import time

from contramine.pipeline.config import Config
from contramine.pipeline.errors import ExpectedError
from contramine.pipeline.hints import no_such_run


class InputMissing(ExpectedError, RuntimeError):
    """A stage run alone before the stages it reads from."""


class RunDamaged(ExpectedError, RuntimeError):
    """`contramine verify` found a damaged shard or memo pack (each named above): exit 2."""


def cmd_verify(args, cfg: Config) -> None:
    """Every shard of the run against its manifest's hash (pipeline/storage/verify.py); --memo: `cache --verify` too."""
    from contramine.pipeline.engine.upkeep import verify_run

    if not cfg.run.dir.is_dir():
        raise InputMissing(no_such_run(cfg.run.dir))
    tables, checked, bad = verify_run(cfg.run.dir)
    for line in bad:
        print(f"damaged: {line}")
    print(f"run {cfg.run.name!r}: {checked} shard(s) of {tables} table(s) checked, "
          + (f"{len(bad)} damaged" if bad else "none damaged"))
    if args.memo:
        args.verify = True
        try:
            cmd_cache(args, cfg)
        except ExpectedError as e:
            bad.append(str(e))
    if bad:
        raise RunDamaged(f"verify: {len(bad)} damaged (named above); a stage run with --force rewrites a table")


def cmd_cache(args, cfg: Config) -> None:
    """The row memo (pipeline/memo/rows.py, pipeline/memo/cache.py): its size per stage and namespace, and pruning."""
    from contramine.pipeline.memo.cache import MemoUnverified, namespaces, prune, referenced_namespaces, verify
    from contramine.pipeline.memo.run import memo_root

    root, runs = memo_root(cfg), cfg.run.root
    if args.verify:
        checked, bad = verify(root, dry_run=args.dry_run, key=cfg.runner.memo_key_bytes())
        for path, why in bad:
            print(f"bad {path}: {why}")
        print(f"{checked} packs verified, " + (f"{len(bad)} failed" if bad else "none failed"))
        if bad:
            left = sum(1 for _, why in bad if "vouches for it" in why or "not a pack file" in why)  # named, left
            what = ([f"{len(bad) - left} {'would be moved' if args.dry_run else 'moved'} to "
                     f"{root / '.quarantine'}/"] if len(bad) > left else []) + \
                   ([f"{left} left in place (another account's or others may write it, without the key; or not a "
                     f"pack file)"] if left else [])
            raise MemoUnverified(f"memo: {len(bad)} of {checked} packs failed verification ({'; '.join(what)}; "
                                 f"none is served); their files' owners are named above")
        return
    if args.prune or args.older_than is not None or args.unreferenced:
        gone = prune(root, runs, args.older_than, args.unreferenced, args.dry_run)
        if args.prune:  # and the shards commits replaced, past runner.keep_replaced_s (pipeline/storage/grace.py)
            from contramine.pipeline.engine.upkeep import prune_replaced

            gone += prune_replaced(runs, cfg.runner.keep_replaced_s, args.dry_run)
        for path, why in gone:
            print(f"{'would remove' if args.dry_run else 'removed'} {path}: {why}")
        print(f"{len(gone)} {'would go' if args.dry_run else 'removed'}")
        return
    found, refs = namespaces(root), referenced_namespaces(runs)
    print(f"row memo: {root}" + ("" if found else " (empty)"))
    per_stage: dict = {}
    for ns in found:
        used = "yes" if f"{ns.stage}/{ns.path.name}" in refs else "no"
        print(f"  {ns.stage:<16} {ns.path.name:<28} {ns.rows:>10,} rows {ns.packs:>5} packs "
              f"{ns.bytes / 2**20:>9.1f} MiB  last used {time.strftime('%Y-%m-%d %H:%M', time.localtime(ns.last_used))}"
              f"  a run under {runs.name}/ uses it: {used}")
        total = per_stage.setdefault(ns.stage, [0, 0])
        total[0], total[1] = total[0] + ns.rows, total[1] + ns.bytes
    for stage, (rows, size) in per_stage.items():
        print(f"{stage}: {rows:,} rows, {size / 2**20:.1f} MiB")
