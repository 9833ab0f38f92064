"""A command as the user runs it, for the hints messages print ("run `make sql RUN=mine1`").

Under make the Makefile exports CONTRAMINE_VIA=make, and a hint names the make target; anywhere else (the installed
`contramine` script, `python -m contramine.flows.cli`) it names the command line:

    command("sql", run="mine1")                     make sql RUN=mine1
                                                    contramine sql --run mine1
    command("stage", stage="embeddings", run="r")   make stage STAGE=embeddings RUN=r
                                                    contramine stage embeddings --run r
    command("export", run="r", format="dclr")       make export RUN=r FORMAT=dclr
                                                    contramine export --run r --format dclr
    command("stage", stage="pairs", run="r", force=True)   make stage STAGE=pairs RUN=r FORCE=1
                                                    contramine stage pairs --run r --force
"""
from __future__ import annotations

import os
import shlex

VIA = "CONTRAMINE_VIA"  # "make" under the Makefile


def via_make() -> bool:
    return os.environ.get(VIA) == "make"


def command(verb: str, **options) -> str:
    """`verb` with its options (None or False: left out; True: a flag, `FORCE=1` / `--force`) as the user would type
    it."""
    flags = [k for k, v in options.items() if v is True]
    options = {k: str(v) for k, v in options.items() if v is not None and not isinstance(v, bool)}
    if via_make():
        return " ".join(["make", verb, *(f"{k.upper()}={shlex.quote(v)}" for k, v in options.items()),
                         *(f"{k.upper()}=1" for k in flags)])
    words = ["contramine", verb]
    if verb == "stage" and "stage" in options:
        words.append(shlex.quote(options.pop("stage")))
    return " ".join(words + [f"--{k.replace('_', '-')} {shlex.quote(v)}" for k, v in options.items()]
                    + [f"--{k.replace('_', '-')}" for k in flags])


def corpus_option() -> str:
    """How the user names the corpus: CORPUS=... under make, --corpus elsewhere."""
    return "CORPUS=..." if via_make() else "--corpus"


def no_such_run(run_dir) -> str:
    """The one line for a run folder that is not there (a typo'd run name), whichever command looked for it."""
    return f"{run_dir}: no such run (`{command('mine', run=os.path.basename(os.fspath(run_dir)))}` first)"
