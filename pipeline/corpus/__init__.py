"""A corpus, read and filtered: what the stages, the config and the tests use.

    corpus_of(data, spec)       the corpus data.corpus / data.candidates names, read as the [data] settings say
    Corpus                      a corpus spec and how it is read: check(), identity(), records(), sources()
    split_sentences(...)        the corpus filtered into (sentences, rejected)
    check_corpus, count_lines, shard_bounds, as_corpus, CorpusError, LongLine, Refused, KEEP, LONG

Inside: filter.py (the filter), corpus.py (Corpus), parts.py (which files a spec names, what stays inside it),
streams.py (opening, decompressing within bounds, the line rules), forms.py (the reader protocol and registry), and
one reader a form: text.py, jsonl.py, parquet.py, hub.py.
"""
from contramine.pipeline.corpus import hub, jsonl, parquet, text  # noqa: F401  (the readers: importing one registers its form)
from contramine.pipeline.corpus.corpus import MAX_EXPANSION, Corpus
from contramine.pipeline.corpus.filter import KEEP, as_corpus, check_corpus, corpus_of, count_lines, shard_bounds, split_sentences
from contramine.pipeline.corpus.records import CorpusError, LongLine, Refused
from contramine.pipeline.corpus.streams import LONG

__all__ = ["Corpus", "CorpusError", "KEEP", "LONG", "LongLine", "MAX_EXPANSION", "Refused", "as_corpus",
           "check_corpus", "corpus_of", "count_lines", "shard_bounds", "split_sentences"]
