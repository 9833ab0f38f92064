"""Negation of a sentence at its root verb (METHODS §6, OssCSE §4 step 1).

The rule, by the ROOT token of the first sentence spaCy finds:
- a finite auxiliary or modal child left of the root (`is going`, `can go`, `has gone`, `was built`):
  `not` after the FIRST auxiliary (rule "aux");
- a root that is itself a form of `be` (`is` → `is not`, rule "copula") or a modal (rule "modal");
- any other finite root takes do-support with its base form: VBZ `likes` → `does not like`,
  VBP `like` → `do not like`, VBD `went` → `did not go`, VB (imperative) `Go home` → `Do not go home`.

Choices the rule leaves open:
- Contractions stay contracted: `it's raining` → `it's not raining`, `I'll go` → `I'll not go`. Inserting after
  the clitic is the minimal edit and never has to guess whether `'s` is `is` or `has`.
- Main-verb `have` takes do-support (`has a car` → `does not have a car`): modern English negates possession
  that way; `has not a car` reads archaic. Auxiliary `have` (`has gone`, `have got`) follows the aux rule.
- In a question (text ends in `?`) whose subject sits between the auxiliary and the verb, `not` goes after the
  subject (`Is he going?` → `Is he not going?`); `Is not he going?` is archaic.
- Imperatives (VB root, no subject) are negated only when their sentence ends in . ! or ? and nothing but
  modifiers precede the verb (`Please go home.`): in wiki text other subjectless VB roots are titles or names
  (`Wake Up & Ball`). `Let's go` → `Let's not go` (rule "lets"): `Do not let's go` is not English.
- `can go` → `can not go` (the aux rule, literally); `cannot` would be the only edit that merges two words.

Skipped (rule "skip"), with the reason, rather than emitting a broken sentence:
  empty            no tokens
  already-negated  a `neg` child, a not/n't/never right after the root or first aux, or a negative quantifier
                   argument (`There is no dog` would become `There is not no dog`)
  no-verbal-root   the root is a noun, adjective, ... (titles, names, fragments)
  non-finite-root  VBN/VBG/to-infinitive root with no finite auxiliary (`Born in 1950.`)
  no-subject       a VBP root without a subject (a misparse), or a subjectless VB root that is no imperative
  subjunctive-be   `whether he be right` (`whether he do not be right` is not English)
  in-name          a lowercase `do` inside a place name (`Mato Grosso do Sul`)
  glued-root       the root is glued to a neighbour (`likes/hates`, `begin=A1`, `co-founded`): a rewrite would
                   split a word
  capitalised-root a capitalised verb that does not start the sentence: a title or a name (`AbbVie Sours on`)
  no-base-form     the base form is not a known English verb (typos, names tagged as verbs, `cordoned` → `cordone`)

Speed: only tok2vec, tagger and parser run on every token. The attribute ruler and the lemmatizer cost as much as
the parser here (measured: ~0.9 s each per 2,000 wiki sentences vs 1.1 s for the parser), yet only the root's
lemma is needed, so a small `root_lemmatizer` pipe runs spaCy's own rule lemmatizer (same tables, same
exceptions: went → go, has → have) on the roots alone, and keeps a lemma only when it is in the model's own verb
index, so a guessed base form never reaches the output.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Iterable, NamedTuple

from typing import TYPE_CHECKING

import pyarrow as pa

from contramine.pipeline.cores import threads_per_worker
from contramine.pipeline.memo.rows import NoMemo, row_key
from contramine.pipeline.engine.spec import Ctx, Memo, stage
from contramine.pipeline.models.parser import BE_FORMS, DEFAULT_MODEL, DO_SUPPORT, SPACY, check_spacy, load_nlp
from contramine.pipeline.schema import SCHEMAS

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc, Token

log = logging.getLogger(__name__)

FINITE_AUX_TAGS = {"MD", "VBZ", "VBP", "VBD"}
NEG_WORDS = {"not", "n't", "n’t", "never"}
# `There is no dog` / `He has nothing`: negating again would make a double negative, so these count as negated
NEG_QUANTIFIERS = {"no", "none", "nobody", "nothing", "neither", "nowhere", "noone"}
SUBJECT_DEPS = {"nsubj", "nsubjpass", "expl", "csubj", "csubjpass"}
# what an imperative may have in front of its verb: `Please go`, `For details, see ...`
LEFT_MODIFIER_DEPS = {"advmod", "intj", "prep", "advcl", "npadvmod", "discourse", "mark", "cc"}
CLOSERS = set(".,;:!?)]}\"'”’»…")  # may follow a rewritten verb with no space
OPENERS = set("([{\"'“‘«")  # may precede it with no space


class Negation(NamedTuple):
    text: str | None   # the negated sentence, None when skipped
    rule: str          # which rule fired, "skip" when none did
    reason: str | None  # why it was skipped, None when negated


def _rebuild(doc: Doc, replace: dict[int, str]) -> str:
    """The text again from token.text + whitespace, with some tokens' text_with_ws swapped out."""
    return "".join(replace.get(t.i, t.text_with_ws) for t in doc)


def _insert_not_after(doc: Doc, tok: Token) -> str:
    nxt = doc[tok.i + 1] if tok.i + 1 < len(doc) else None
    # a token glued to a following word (`gonna`-like splits) still needs a space after the inserted `not`
    tail = tok.whitespace_ or (" " if nxt is not None and nxt.text[:1].isalnum() else "")
    return _rebuild(doc, {tok.i: tok.text + " not" + tail})


def _insertion_point(doc: Doc, root: Token, anchor: Token) -> Token:
    """Where `not` goes: after the auxiliary/copula, or after the subject in an inverted question."""
    if doc.text.rstrip().endswith("?"):
        lo, hi = anchor.i, (root.i if root.i > anchor.i else len(doc))
        subject = next((c for c in root.children if c.dep_ in SUBJECT_DEPS and lo < c.i < hi), None)
        if subject is not None:
            return subject.right_edge
    return anchor


def _is_negated_after(doc: Doc, tok: Token) -> bool:
    return tok.i + 1 < len(doc) and doc[tok.i + 1].lower_ in NEG_WORDS


def _has_negative_argument(root: Token) -> bool:
    """A root argument that is, or is determined by, a negative quantifier (`no woman`, `nothing`)."""
    return any(c.lower_ in NEG_QUANTIFIERS or any(g.dep_ == "det" and g.lower_ in NEG_QUANTIFIERS for g in c.children)
               for c in root.children)


def _looks_imperative(root: Token) -> bool:
    """A subjectless VB root that ends a punctuated sentence and has only modifiers before it. In wiki text most
    other subjectless VB roots are titles or names (`Wake Up & Ball`, `Die Flutkatastrophe`)."""
    sent = root.sent
    if sent.text.rstrip().rstrip(")]}\"'”’»").rstrip()[-1:] not in (".", "!", "?"):
        return False
    left_modifiers = {t.i for c in root.lefts if c.dep_ in LEFT_MODIFIER_DEPS for t in c.subtree}
    return all(t.is_punct or t.is_space or t.i in left_modifiers for t in sent[: root.i - sent.start])


def _inside_name(tok: Token) -> bool:
    doc = tok.doc
    return 0 < tok.i < len(doc) - 1 and doc[tok.i - 1].is_title and doc[tok.i + 1].is_title


def _skip(reason: str) -> Negation:
    return Negation(None, "skip", reason)


def _do_support(doc: Doc, root: Token) -> Negation:
    """`likes` → `does not like`: rewrite the root token in place, everything else untouched."""
    sent = root.sent
    if root.whitespace_ == "" and root.i + 1 < len(doc) and doc[root.i + 1].text[:1] not in CLOSERS:
        return _skip("glued-root")  # `likes/hates`, `begin=A1`: rewriting the verb would split a word
    clitic = root.text[:1] in ("'", "’")  # `I've a car`: the clitic is meant to be glued to its subject
    before = doc[root.i - 1] if root.i > 0 else None
    if not clitic and before is not None and not (before.whitespace_ or before.is_space or before.text[-1] in OPENERS):
        return _skip("glued-root")  # `co-founded` (the small model roots it at `co`), `U.S.-backed`
    lemma = root.lemma_
    # VBZ always inflects, so an unchanged lemma means the lemmatizer failed; VBD may not inflect (`put`)
    if not lemma or not lemma.isascii() or not lemma.isalpha() or (root.tag_ == "VBZ" and lemma == root.lower_):
        return _skip("no-base-form")
    # VBP/VB are their own base form: keep the text as written (its case), except clitics (`'ve` → `have`)
    base = lemma if root.tag_ in ("VBZ", "VBD") or clitic else root.text
    do_word, not_word = DO_SUPPORT[root.tag_], "not"
    if len(root.text) > 1 and root.text.isupper():  # SHOUTED text stays shouted
        do_word, not_word, base = do_word.upper(), "NOT", base.upper()
    elif root.text[:1].isupper() and all(t.is_punct or t.is_space for t in doc[sent.start:root.i]):
        # sentence-initial: the do-word takes the capital, the verb goes back to lower case
        do_word, base = do_word.capitalize(), base[:1].lower() + base[1:]
    elif root.text[:1].isupper():
        return _skip("capitalised-root")  # a capital verb mid-sentence is a title or a name (`Go Nan-do`)
    lead = " " if clitic and before is not None and not before.whitespace_ else ""
    replace = {root.i: f"{lead}{do_word} {not_word} {base}{root.whitespace_}"}
    rule = "do-support-" + root.tag_.lower()
    return Negation(_rebuild(doc, replace), rule, None)


def negate_root_verb(doc: Doc) -> Negation:
    """Negate `doc` at the root of its first sentence; see the module docstring for the rules and skip reasons."""
    if len(doc) == 0 or all(t.is_space for t in doc):
        return _skip("empty")
    root = next(iter(doc.sents)).root
    auxes = [c for c in root.children if c.dep_ in ("aux", "auxpass") and c.i < root.i]
    if (any(c.dep_ == "neg" for c in root.children) or any(_is_negated_after(doc, t) for t in [root, *auxes[:1]])
            or _has_negative_argument(root)):
        return _skip("already-negated")
    if auxes:
        first = auxes[0]
        if first.tag_ not in FINITE_AUX_TAGS:
            return _skip("non-finite-root")  # `to go`, `having gone`: no finite verb to negate
        return Negation(_insert_not_after(doc, _insertion_point(doc, root, first)), "aux", None)
    if root.tag_ == "MD":
        return Negation(_insert_not_after(doc, _insertion_point(doc, root, root)), "modal", None)
    if root.lower_ in BE_FORMS and root.tag_ in FINITE_AUX_TAGS:
        return Negation(_insert_not_after(doc, _insertion_point(doc, root, root)), "copula", None)
    if root.tag_ in ("VBN", "VBG"):
        return _skip("non-finite-root")
    if root.tag_ not in DO_SUPPORT:
        return _skip("no-verbal-root")
    has_subject = any(c.dep_ in SUBJECT_DEPS for c in root.children)
    if root.tag_ == "VBP" and not has_subject:
        return _skip("no-subject")
    if root.lower_ == "be" and has_subject:
        return _skip("subjunctive-be")  # `whether he be right`: `whether he do not be right` is not English
    if root.lower_ == "do" and _inside_name(root):
        return _skip("in-name")  # `Mato Grosso do Sul`, `Rio Grande do Norte`
    if root.tag_ == "VB" and not has_subject and not _looks_imperative(root):
        return _skip("no-subject")
    if root.tag_ == "VB" and not has_subject and root.lower_ == "let" and root.i + 1 < len(doc) \
            and doc[root.i + 1].lower_ in ("'s", "’s"):
        return Negation(_insert_not_after(doc, doc[root.i + 1]), "lets", None)
    return _do_support(doc, root)


def negate_texts(texts: Iterable[str], nlp: Language | None = None, batch_size: int = 256,
                 n_process: int = 1) -> list[Negation]:
    nlp = nlp or load_nlp()
    texts = ["" if t is None else t for t in texts]
    return [negate_root_verb(doc) for doc in nlp.pipe(texts, batch_size=batch_size, n_process=n_process)]


NEGATIONS = pa.schema([("text", pa.string()), ("rule", pa.string()), ("reason", pa.string())])
# What shapes a text's negation besides the text: the negate settings and the spaCy pipeline's files and version
NEGATE_MEMO = Memo("negate", lambda cfg, plan: {"settings": cfg.section_hash("negate"), "spacy": plan.get("spacy")})


def negate_table(sentences: pa.Table, nlp: "Language | Callable[[], Language] | None" = None, batch_size: int = 256,
                 n_process: int = 1, memo=None) -> pa.Table:
    """sentences(sid, text, ...) → negations(sid, text, rule, reason), same rows, same order. Through the row
    `memo` when one is given (keyed by the text: spaCy parses each text on its own); `nlp` may then be a loader,
    called only when a text is not in it."""
    texts = sentences.column("text").to_pylist()
    load = nlp if callable(nlp) and not hasattr(nlp, "pipe") else (lambda: nlp)

    def compute(missing) -> pa.Table:
        negations = negate_texts([texts[i] for i in missing], load(), batch_size, n_process)
        return pa.table({"text": pa.array([n.text for n in negations], pa.string()),
                         "rule": pa.array([n.rule for n in negations], pa.string()),
                         "reason": pa.array([n.reason for n in negations], pa.string())})

    done = (memo or NoMemo("negate", "negate")).rows([row_key("" if t is None else t) for t in texts], compute,
                                                    NEGATIONS)
    assert done is not None  # with a schema, rows() gives a table (empty or not)
    return pa.table({"sid": sentences.column("sid").cast(pa.int64()), "text": done.column("text"),
                     "rule": done.column("rule"), "reason": done.column("reason")}, schema=SCHEMAS["negations"])


def usable_processes(n_process: int | str, workers: int = 1) -> int:
    """`negate.n_process` ("auto": the cores each of the runner's `workers` jobs at once may use, as torch's
    threads: pipeline/cores.py), or 1 inside a daemonic process (a Dask worker of a cluster that was not started
    with `distributed.worker.daemon: False`, as runner.kind = dask-local starts them): such a process may not start
    spaCy's pool. Said once per process; the table is the same either way."""
    import multiprocessing

    asked = n_process != "auto"
    n_process = int(n_process) if asked else threads_per_worker(workers)
    if n_process > 1 and multiprocessing.current_process().daemon:
        if asked and not _warned_daemon:  # "auto" asked for nothing the worker could not give
            _warned_daemon.append(True)
            log.warning(f"negate: this worker is a daemonic process, which cannot start spaCy's worker pool: "
                        f"negate.n_process = {n_process} runs as 1 here (start Dask workers with "
                        f"distributed.worker.daemon = False to use it)")
        return 1
    return n_process


_warned_daemon: list[bool] = []


@stage(reads=("sentences",), writes=("negations",), settings=("negate",), resources=(SPACY,), checks=(check_spacy,),
       memos=(NEGATE_MEMO,))
def negate(ctx: Ctx) -> dict[str, pa.Table]:
    c = ctx.cfg.negate
    return {"negations": negate_table(ctx.shard("sentences"), lambda: ctx.resource("spacy"), c.batch_size,
                                      usable_processes(c.n_process, ctx.cfg.runner.workers),
                                      ctx.memo("negate"))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Negate one sentence a line from stdin; an empty line = skipped.")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--n-process", type=int, default=1)
    args = parser.parse_args(argv)
    nlp = load_nlp(args.model)
    lines = (line.rstrip("\r\n") for line in sys.stdin)
    for doc in nlp.pipe(lines, batch_size=args.batch_size, n_process=args.n_process):
        sys.stdout.write((negate_root_verb(doc).text or "") + "\n")


if __name__ == "__main__":
    main()
