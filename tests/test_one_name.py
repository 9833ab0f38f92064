"""One file, one module: every file of the package loads under one name, `contramine.<part>.<...>`, in a checkout
and an editable install alike; the bare part names fail in one line; tools that read code (jedi, as IDEs use it)
resolve the package's names without running it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, cwd: Path, pythonpath: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("part", ["pipeline", "trainer", "flows"])
def test_a_bare_part_name_fails_in_one_line_naming_what_to_import(part):
    """With the repository root on sys.path (python -m in the checkout, PYTHONPATH=.), `import pipeline` would load
    pipeline/ a second time as another module: it is refused, naming the import that works."""
    r = _python(f"import {part}", ROOT, str(ROOT))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (f"ImportError: import contramine.{part}, not {part}: this folder is "
                                                 f"part of the package contramine")


def test_each_file_is_one_module_and_only_the_parts_are_under_contramine(tmp_path):
    """A whole import of the package (the stages, the CLI, the trainer, the losses) with the root on sys.path: no
    file is behind two module objects; bench/, tests/ and configs/ are not importable under `contramine`."""
    probe = """
        import importlib, json, os, sys
        import contramine, contramine.losses, contramine.flows.cli, contramine.trainer.train
        from contramine.pipeline.engine.runner import load_stages
        load_stages()
        files = {}
        for name, m in list(sys.modules.items()):
            f = getattr(m, "__file__", None)
            here = os.path.realpath(f) if f else ""
            if any(here.startswith(os.path.join(ROOT, part, "")) for part in ("contramine", "pipeline", "trainer", "flows")):
                files.setdefault(here, []).append(name)
        refused = []
        for name in ("contramine.bench", "contramine.tests", "contramine.configs", "contramine.docs"):
            try:
                importlib.import_module(name)
            except ImportError:
                refused.append(name)
        print(json.dumps({"twice": {f: n for f, n in files.items() if len(n) > 1}, "refused": refused,
                          "n": len(files)}))
    """
    for where, pythonpath in ((ROOT, str(ROOT)), (tmp_path, None)):
        r = _python(f"ROOT = {str(ROOT)!r}\n" + textwrap.dedent(probe), where, pythonpath)
        assert r.returncode == 0, r.stderr[-3000:]
        import json

        got = json.loads(r.stdout.splitlines()[-1])
        assert got["twice"] == {} and got["n"] > 100, got
        assert got["refused"] == ["contramine.bench", "contramine.tests", "contramine.configs", "contramine.docs"]


JEDI = """
import jedi, json, sys
src = ("from contramine.pipeline.storage.tables import RunTables\\n"
       "from contramine.losses import DebCSELoss\\n"
       "RunTables\\n"
       "DebCSELoss\\n")
folder = sys.argv[1]
script = jedi.Script(src, path=folder + "/probe.py", project=jedi.Project(folder))
print(json.dumps([[d.full_name for d in script.goto(line, 2, follow_imports=True)] for line in (3, 4)]))
"""


def test_jedi_resolves_the_package_names_in_the_checkout_and_in_the_editable_install(tmp_path):
    """As an IDE would: in the checkout (its folder the project) and from a folder outside it, through the
    environment's editable install (`make install` is `pip install -e`). Static analysis, no import hook runs."""
    for folder in (ROOT, tmp_path):
        r = subprocess.run([sys.executable, "-c", JEDI, str(folder)], cwd=folder, capture_output=True, text=True,
                           timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        assert r.returncode == 0, r.stderr[-3000:]
        import json

        assert json.loads(r.stdout) == [["contramine.pipeline.storage.tables.RunTables"],
                                        ["contramine.trainer.st_losses.debcse.DebCSELoss"]], (folder, r.stdout)
