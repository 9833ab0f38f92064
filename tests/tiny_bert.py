"""A tiny random BERT for tests: no download, builds in well under a second.

    path = build_tiny_bert(tmp_path / "bert")                  # save_pretrained model + tokenizer
    enc = tiny_encoder(pooler="cls_before_pooler", dropout=0.0)  # an in-memory contramine.pipeline.models.encode.encoder.Encoder

The vocabulary is a small WordPiece vocab: the special tokens, every printable ASCII character (so any English
sentence tokenises without [UNK], falling back to single characters), the `##`-continuation of every letter and
digit, and a few hundred common words and prompt-template words so test sentences stay short.
Import it as `from tiny_bert import ...` inside tests (pytest puts tests/ on sys.path) or `from tests.tiny_bert import ...`.
"""
from __future__ import annotations

import atexit
import shutil
import string
import tempfile
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

from contramine.pipeline.models.encode.encoder import Encoder

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = """
the a an of to in and is are was were be been being it its this that these those he she they we you i his her their
our your my not no do does did has have had will would can could should may might must with for on at by from as or
but if then than so very more most some any all each every many much one two three four five six seven eight nine ten
man woman men women child children people person dog dogs cat cats bird horse car cars bus train plane boat house
city world country school music song book books food water street road park table guitar piano ball game team
play plays playing played eat eats eating ate run runs running ran walk walks walking walked ride rides riding
sit sits sitting sat stand stands standing look looks looking like likes liked love loves loved go goes going went
make makes made take takes took say says said see sees saw know knows knew think thinks thought come comes came
sentence means mean meaning word words year years time day days new old big small good bad great little long short
red blue green black white young first last other same different american english french german history war government
company university film album series season river north south east west member members team known called used
while during after before over under about into through between against without around down up out off again
""".split()


def write_vocab(path: Path) -> Path:
    """Write a WordPiece vocab.txt and return its path."""
    chars = [c for c in string.printable if not c.isspace()]
    cont = ["##" + c for c in string.ascii_lowercase + string.digits]
    seen, vocab = set(), []
    for tok in SPECIAL + chars + cont + WORDS:
        tok = tok.lower() if tok not in SPECIAL else tok
        if tok not in seen:
            seen.add(tok)
            vocab.append(tok)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(vocab) + "\n")
    return path


def tiny_config(vocab_size: int, dropout: float = 0.1) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128, type_vocab_size=2,
                      hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)


def _tokenizer(vocab_file: Path) -> BertTokenizerFast:
    # from_pretrained on the folder reads vocab.txt (the constructor's keyword changed across transformers versions)
    return BertTokenizerFast.from_pretrained(str(Path(vocab_file).parent), do_lower_case=True)


def build_tiny_bert(out_dir, seed: int = 0, dropout: float = 0.1) -> Path:
    """A random BertModel (with its pooling layer) and its tokenizer, saved with save_pretrained into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_file = write_vocab(out / "vocab.txt")
    tok = _tokenizer(vocab_file)
    torch.manual_seed(seed)
    model = BertModel(tiny_config(len(tok), dropout), add_pooling_layer=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


_VOCAB_DIR: Path | None = None


def tiny_encoder(pooler: str = "cls", seed: int = 0, dropout: float = 0.0, max_length: int = 32,
                 prompt: str = 'This sentence : "{s}" means [MASK] .') -> Encoder:
    """An in-memory Encoder over a fresh random tiny BERT (weights depend only on `seed`)."""
    global _VOCAB_DIR
    if _VOCAB_DIR is None:
        _VOCAB_DIR = Path(tempfile.mkdtemp(prefix="tiny_bert_vocab_"))
        atexit.register(shutil.rmtree, _VOCAB_DIR, True)  # one per process, gone with it (it was left in /tmp)
        write_vocab(_VOCAB_DIR / "vocab.txt")
    tok = _tokenizer(_VOCAB_DIR / "vocab.txt")
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = BertModel(tiny_config(len(tok), dropout), add_pooling_layer=True)
    torch.random.set_rng_state(gen_state)  # building a test model leaves the caller's generator alone
    return Encoder(model, tok, pooler=pooler, max_length=max_length, prompt=prompt)
