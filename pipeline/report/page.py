"""The mining report's page: `write_report` puts the seven sections (pipeline/report/sections.py) on one Markdown
page with its PNG plots, `headline` is the few lines Prefect shows when a mine ends, `main` the command line.

Run folders are shared, so the page and its PNGs each replace their path (pipeline/storage/atomic.py: a symlink
planted at report/index.md is swapped out, its target untouched), a `report/` folder that is itself a symlink is
refused in one line (pipeline/storage/safe_paths.py) rather than written into, a rerun removes only the plots it
draws (sections.FIGURES), and report/.lock keeps two reports of one run from mixing. Corpus text is escaped on the
page (pipeline/markdown.py): a sentence that holds Markdown or HTML reads as the characters it holds.
"""
from __future__ import annotations

from pathlib import Path

from contramine.pipeline.arguments import ArgumentParser
from contramine.pipeline.errors import printable

from contramine.pipeline.storage.atomic import atomic_write_bytes
from contramine.pipeline.storage.lock import RunBusy, run_lock
from contramine.pipeline.storage.safe_paths import UnsafePath, open_folder
from contramine.pipeline.hints import command
from contramine.pipeline.markdown import cell, table
from contramine.pipeline.report.queries import ABSENT, Run, chosen_cos, overlap_stats
from contramine.pipeline.schema import SCHEMAS

# the command's description: the first line of the package's docstring (pipeline/report/__init__.py)
DESCRIPTION = "The mining report: one Markdown page with PNG plots that audits a finished (or partial) run."


HEADLINE_VIEWS = ("sentences", "candidates", "pairs")  # what chosen_cos and overlap_stats read


def headline(run_dir: Path, seed: int = 0) -> str:
    """A few lines on what the run mined (Prefect's `mine` artifact; the full page is `write_report`): rows per
    table, the chosen pairs' mean cosine and lexical overlap (DebCSE Table 4), seconds per stage."""
    # At the end of every mine: only the tables the cosine and overlap lines read are opened and checked (a view
    # checks each file of its table); the rows per table are what each table's commit lists
    run = Run(Path(run_dir), views=HEADLINE_VIEWS)
    md = [f"# contramine run `{Path(run_dir).name}`", ""]
    md += table(["table", "rows"], [[t, f"{run.committed_rows(t):,}" if run.present[t] else ABSENT]
                                    for t in SCHEMAS]) + [""]
    if run.present["candidates"]:
        overlap = overlap_stats(run, seed)
        for kind, name in (("pos", "positives"), ("neg", "negatives")):
            cos, (ov, n, _) = chosen_cos(run, kind), overlap[kind]
            md.append(f"- chosen {name}: **{len(cos):,}**, mean cosine {cell(float(cos.mean()) if len(cos) else None)}"
                      f", mean lexical overlap {cell(ov)} ({n:,} sampled)")
    seconds: dict = {}
    for m in run.manifests.values():  # one entry per stage (a stage may write several tables)
        seconds.setdefault(m.get("stage"), m.get("wall_seconds_last_run"))
    md += ([""] if md[-1] else []) + ["Seconds per stage (last run): " + ", ".join(f"{t} {cell(s)}" for t, s in seconds.items()
                                                          if s is not None),
           "", f"The full audit page with plots: `{command('report', run=Path(run_dir).name)}`."]
    return "\n".join(md)


def write_report(run_dir: Path, out_dir: Path | None = None, seed: int = 0) -> Path:
    # the sections draw with matplotlib: imported by the page that plots, not by `headline` at the end of every mine
    # (~0.4 CPU-s of each `make mine`)
    from contramine.pipeline.report.sections import (PLOTS, section_cosine, section_examples, section_ipw, section_mer,
                                                     section_overlap, section_summary, section_timings)

    run_dir = Path(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir / "report"
    # report/ below the run, reached without a link (an --out outside the run is the user's own, checked from itself
    # down), locked so that two reports never mix their plots, and written through the folder as opened: every plot
    # and the page land in it whatever happens to its path meanwhile
    with run_lock(out, command("report", run=Path(run_dir).name), root=run_dir, hint="report again when it is done"), \
            open_folder(run_dir, out) as folder:
        for e in folder.entries():  # a plot a rerun no longer draws must not linger next to the new page
            folder.unlink(e.name, PLOTS)  # only the plots this page draws; a link among them goes, not its target
        here = folder.at()
        run = Run(run_dir)
        absent = [t for t in SCHEMAS if not run.present[t]]
        md = [f"# Mining report: `{run_dir.name}`", "",
              f"Run directory `{run_dir}`; sampling seed {seed}. Tables {ABSENT}: "
              f"{', '.join(absent) if absent else 'none'}.", ""]
        md += section_summary(run, here) + section_cosine(run, here, seed) + section_overlap(run, seed)
        md += section_mer(run, here, seed) + section_ipw(run, here) + section_examples(run, seed)
        md += section_timings(run, here)
        atomic_write_bytes(here / "index.md", ("\n".join(md) + "\n").encode())
    return out / "index.md"


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(prog="python -m contramine.pipeline.report", description=DESCRIPTION)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="output folder (default RUN_DIR/report)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random-pair and example samples")
    a = ap.parse_args(argv)
    if not a.run_dir.is_dir():
        ap.error(f"run directory {a.run_dir} does not exist")
    try:
        print(write_report(a.run_dir, a.out, a.seed))
    except (UnsafePath, RunBusy) as e:  # a link in the run folder, a report being written: one line, as `make report`
        ap.exit(2, f"error: {printable(str(e))}\n")

