"""Random-weight models of the papers' shapes, built in seconds, offline: what `bench/marian_bench.py` and
`bench/gpu_check.py` time (speed depends on the shape, not on the weights' values).

    path, tokens = build_marian(folder, OPUS_MT)     # MarianMTModel of opus-mt's shape + a tokenizer; tokens by id
    path = build_bert(folder, BERT_BASE, texts)      # BertModel of bert-base's shape + a WordPiece tokenizer

Imports torch, transformers and tokenizers only (no project module, no sentencepiece, no network): the GPU machine
runs this too.

- opus-mt shape (Helsinki-NLP/opus-mt-en-de's config.json): 6 encoder + 6 decoder layers, d_model 512, 8 heads,
  FFN 2048, swish, sinusoidal positions, scaled and shared embeddings, vocabulary 58,101 (opus-mt pairs have 58k-65k).
  The tokenizer is a word-level one over placeholder tokens with opus-mt's layout (`</s>` = 0, `<unk>` = 1, `<pad>`
  last, pad = decoder start): enough for CTranslate2's converter (it reads the vocabulary, eos and unk from a
  tokenizer); inputs are fed as token ids (HF) or those ids' token strings (CTranslate2), never as text.
- bert-base shape (bert-base-uncased's config.json): 12 layers, hidden 768, 12 heads, FFN 3072, vocabulary 30,522,
  512 positions. Its WordPiece vocabulary is trained on the given texts (up to 30,522 entries), so sentences split
  into about as many tokens as with a real English WordPiece vocabulary.
"""
from __future__ import annotations

from pathlib import Path

OPUS_MT = dict(vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
               decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048)
TOY_MARIAN = dict(vocab_size=2000, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128)
BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072)
TOY_BERT = dict(vocab_size=4000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WIKI = Path(__file__).resolve().parents[2] / "shared" / "data" / "wiki1m_head.txt"
# The first 8,192 distinct lines of that file (Wikipedia text, CC BY-SA), carried in the repository: the lent GPU
# machine gets the working tree only, not ../shared, and the check's rows want real sentences' lengths there too.
SAMPLE = Path(__file__).resolve().parent / "data" / "wiki1m_sample.txt.gz"
SAMPLE_LINES = 8192
FALLBACK_WORDS = """the a of to in and is was for on as with by he it at from his an were are which this also be has
had or first one their its new after but who not they have her she two been other when there all during into school
time may years more most only over city such can team later where between many year would world made under used
called three known village born united state season film album river south north national war university
""".split()


def sentences(n: int, skip: int = 0, seed: int = 0) -> list[str]:
    """n distinct non-empty lines of ../shared/data/wiki1m_head.txt from line `skip` on; where the file is absent
    (a machine without the shared data, the GPU machine), of the carried sample (SAMPLE) if it has enough lines;
    else seeded sentences of 8-30 common English words."""
    import gzip

    for path, opener in ((WIKI, open), (SAMPLE, gzip.open)):
        if path.is_file():
            with opener(path, "rt", encoding="utf-8") as f:
                lines = list(dict.fromkeys(s for s in (line.strip() for line in f) if s))[skip:]
            if len(lines) >= n:
                return lines[:n]
    import random

    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        out[" ".join(rng.choice(FALLBACK_WORDS) for _ in range(rng.randint(8, 30))).capitalize() + "."] = None
    return list(out)


def build_marian(folder: str | Path, shape: dict = OPUS_MT, seed: int = 0) -> tuple[Path, list[str]]:
    """A random MarianMTModel of `shape` saved with a tokenizer CTranslate2 converts with; returns (folder, the
    vocabulary's tokens by id). Generation settings as opus-mt's (greedy here): bad_words_ids = [[pad]]."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, PreTrainedTokenizerFast

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    v = shape["vocab_size"]
    tokens = ["</s>", "<unk>", *(f"▁w{i}" for i in range(v - 3)), "<pad>"]
    eos, pad = 0, v - 1
    word_level = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=word_level, eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(out)
    config = MarianConfig(**shape, decoder_vocab_size=v, pad_token_id=pad, eos_token_id=eos,
                          decoder_start_token_id=pad, forced_eos_token_id=eos, max_position_embeddings=512,
                          activation_function="swish", scale_embedding=True, share_encoder_decoder_embeddings=True,
                          dropout=0.1, attention_dropout=0.0, activation_dropout=0.0)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    torch.random.set_rng_state(state)
    with torch.no_grad():
        model.model.shared.weight[pad] = 0.0  # as in opus-mt: the decoder starts from <pad>'s zero embedding
    model.generation_config = GenerationConfig(decoder_start_token_id=pad, eos_token_id=eos, pad_token_id=pad,
                                               bad_words_ids=[[pad]], num_beams=1, do_sample=False)
    model.eval().save_pretrained(out)
    return out, tokens


def source_ids(n: int, length: int, vocab_size: int, seed: int = 0):
    """n rows of `length` token ids: length - 1 random ordinary tokens (ids 2 .. vocab - 2), then `</s>` (0), as a
    Marian tokenizer ends every input."""
    import torch

    g = torch.Generator().manual_seed(seed)
    body = torch.randint(2, vocab_size - 1, (n, length - 1), generator=g)
    return torch.cat([body, torch.zeros((n, 1), dtype=torch.long)], dim=1)


def build_bert(folder: str | Path, shape: dict = BERT_BASE, texts: list[str] | None = None, seed: int = 0,
               dropout: float = 0.1) -> Path:
    """A random BertModel (with its pooling layer) of `shape` and a WordPiece tokenizer trained on `texts`
    (default: 12,000 wiki1m lines), saved with save_pretrained."""
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(texts or sentences(SAMPLE_LINES), vocab_size=shape["vocab_size"], min_frequency=1,
                           special_tokens=SPECIAL, show_progress=False)
    wp.save_model(str(out))  # vocab.txt
    tok = BertTokenizerFast.from_pretrained(str(out), do_lower_case=True)
    config = BertConfig(**{**shape, "vocab_size": max(shape["vocab_size"], len(tok))}, max_position_embeddings=512,
                        type_vocab_size=2, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = BertModel(config, add_pooling_layer=True)
    torch.random.set_rng_state(state)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
