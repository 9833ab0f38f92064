"""What a user sees first: `contramine --help` and each command's --help say what it does, with an example, and
name no file of the source tree (a user who installed the package has none)."""
from __future__ import annotations

import re

import pytest

from contramine.flows.cli import COMMANDS, DELEGATED, main

# a module run, a source or logging file, a package folder (artifacts/bench/, an output folder, is not one)
SOURCE = re.compile(r"python -m |[\w/]+\.(py|yml)\b|(?<![\w/])(pipeline|flows|trainer|bench|tests)/")


def help_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    return capsys.readouterr().out


def test_the_top_help_says_what_contramine_does_with_examples(capsys):
    out = help_of(["--help"], capsys)
    assert "Mine training data for unsupervised contrastive sentence embeddings" in out
    assert "examples:\n  contramine mine --corpus" in out
    for name in (*COMMANDS, *DELEGATED):
        assert re.search(rf"^    {name} +\S", out, re.M), f"{name} has no line in contramine --help"
    assert not SOURCE.search(out), SOURCE.search(out)


@pytest.mark.parametrize("name", [*COMMANDS, *DELEGATED])
def test_each_command_help_says_what_it_does_with_an_example(name, capsys):
    out = help_of([name, "--help"], capsys)
    assert out.startswith(f"usage: contramine {name} "), out[:80]
    description = out.split("\n\n")[1]
    assert len(description) > 30 and not description.startswith(("positional", "options")), description
    assert re.search(rf"^examples?:\n  contramine {name}\b", out, re.M), f"no example in contramine {name} --help"
    assert not SOURCE.search(out), SOURCE.search(out)


def test_report_help_says_it_writes_a_markdown_page(capsys):
    out = help_of(["report", "--help"], capsys)
    assert "Markdown page (report/index.md, with PNG plots)" in " ".join(out.split()) and "HTML" not in out
