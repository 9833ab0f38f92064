"""Tiny random translation models for tests and offline end-to-end runs: no download, a few seconds to build.

    path = build_tiny_marian(tmp / "marian")   # MarianMTModel + MarianTokenizer (SentencePiece), saved by path
    path = build_tiny_fsmt(tmp / "fsmt")       # FSMTForConditionalGeneration + FSMTTokenizer (BPE + Moses)
    path = build_tiny_m2m100(tmp / "m2m")      # M2M100 + M2M100Tokenizer: language codes, like NLLB
    python -m tests.tiny_mt OUT_DIR            # writes marian-en-xx, marian-xx-en, fsmt-en-de, m2m100; prints paths

They load through the same `AutoTokenizer` / `AutoModelForSeq2SeqLM` code as a real model. The weights are random,
so they "translate" into junk, but deterministic junk that depends on the input (weights are initialised with a
large std so logits are far apart: no near-ties that could flip greedy decoding between batchings), and the eos
logit is biased up so most outputs end on their own after a handful of tokens.
"""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import torch
from transformers import (FSMTConfig, FSMTForConditionalGeneration, FSMTTokenizer, GenerationConfig, M2M100Config,
                          M2M100ForConditionalGeneration, M2M100Tokenizer, MarianConfig, MarianMTModel,
                          MarianTokenizer)

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "wiki1m_head.txt"
FALLBACK = ["The cat sat on the mat.", "A man is playing a guitar in the park.", "South Australia has a history."]
SIZE = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=512, dropout=0.0,
            attention_dropout=0.0, activation_dropout=0.0)
INIT_STD = 0.3  # default 0.02 gives near-uniform logits, where float noise between batchings decides argmax
EOS_BIAS = 5.0  # so random models stop by themselves (the length limit is the backstop)
MARIAN_EOS_BIAS = 3.0  # Marian's first step starts from a zero embedding: at 5.0 most outputs would be empty


def corpus_lines(n: int = 400) -> list[str]:
    if not CORPUS.is_file():
        return FALLBACK * 20
    with CORPUS.open(encoding="utf-8") as f:
        return [line.strip() for _, line in zip(range(n), f) if line.strip()]


def _spm_bytes(lines: list[str], vocab_size: int) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    # hard_vocab_limit off: a few hundred lines may not support exactly vocab_size pieces
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   num_threads=1, minloglevel=2)
    return buf.getvalue()


def _spm_pieces(model: bytes) -> list[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Re-draw every weight matrix with a large std (biases and norms keep their init)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * INIT_STD)


def _bias_eos(model: torch.nn.Module, last_norm: torch.nn.LayerNorm, eos: int, bias: float = EOS_BIAS) -> None:
    """For output layers without a bias: pin hidden channel 0 of the last layer norm to 1 and let only eos read
    it, which adds exactly `bias` to the eos logit."""
    with torch.no_grad():
        last_norm.weight[0], last_norm.bias[0] = 0.0, 1.0
        lm = model.get_output_embeddings().weight
        lm[:, 0] = 0.0
        lm[eos, 0] = bias


def build_tiny_marian(out_dir: str | Path, seed: int = 0, vocab_size: int = 400,
                      target_codes: tuple[str, ...] = ()) -> Path:
    """A random MarianMT model whose tokenizer is a SentencePiece model trained on corpus lines. `target_codes`
    (e.g. (">>cmn_Hans<<", ">>yue_Hant<<")) makes it multi-target, as opus-mt-en-zh is: each code is a vocabulary
    token the input must start with."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spm_model = _spm_bytes(corpus_lines(), vocab_size)
    (out / "source.spm").write_bytes(spm_model)
    (out / "target.spm").write_bytes(spm_model)
    # Opus-MT layout: </s> = 0, <unk> = 1, the pieces, <pad> last (pad doubles as decoder start)
    pieces = [p for p in _spm_pieces(spm_model) if p not in ("<unk>", "<s>", "</s>", "<pad>")]
    vocab = {tok: i for i, tok in enumerate(["</s>", "<unk>", *pieces, *target_codes, "<pad>"])}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    pad, eos, n = vocab["<pad>"], vocab["</s>"], len(vocab)
    tok = MarianTokenizer(source_spm=str(out / "source.spm"), target_spm=str(out / "target.spm"),
                          vocab=str(out / "vocab.json"), source_lang="en", target_lang="xx", model_max_length=512)
    config = MarianConfig(vocab_size=n, decoder_vocab_size=n, pad_token_id=pad, eos_token_id=eos,
                          decoder_start_token_id=pad, forced_eos_token_id=eos, scale_embedding=True,
                          share_encoder_decoder_embeddings=True, **SIZE)
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    _randomise(model, seed)
    with torch.no_grad():
        model.final_logits_bias[0, eos] = MARIAN_EOS_BIAS
        model.model.shared.weight[pad] = 0.0  # as in opus-mt: the decoder starts from <pad>'s zero embedding
    model.generation_config = GenerationConfig(decoder_start_token_id=pad, eos_token_id=eos, pad_token_id=pad,
                                               bad_words_ids=[[pad]], max_new_tokens=16, num_beams=1)
    model.eval().save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _bpe_files(lines: list[str], vocab_size: int) -> tuple[dict, list[str]]:
    """Learn a subword-nmt style BPE (word-final pieces end in </w>) with the `tokenizers` trainer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    specials = ["<s>", "<pad>", "</s>", "<unk>"]  # fairseq dictionary order, as FSMT conversions keep it
    tk = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, end_of_word_suffix="</w>",
                                  show_progress=False)
    tk.train_from_iterator(lines, trainer)
    state = json.loads(tk.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    return state["vocab"], merges


def build_tiny_fsmt(out_dir: str | Path, seed: int = 0, vocab_size: int = 400) -> Path:
    """A random FSMT (fairseq wmt19 architecture) model with a BPE vocab learnt on corpus lines."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges = _bpe_files(corpus_lines(), vocab_size)
    for name in ("vocab-src.json", "vocab-tgt.json"):
        (out / name).write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "merges.txt").write_text("\n".join(merges) + "\n")
    tok = FSMTTokenizer(langs=["en", "de"], src_vocab_file=str(out / "vocab-src.json"),
                        tgt_vocab_file=str(out / "vocab-tgt.json"), merges_file=str(out / "merges.txt"))
    bos, pad, eos = vocab["<s>"], vocab["<pad>"], vocab["</s>"]
    config = FSMTConfig(langs=["en", "de"], src_vocab_size=len(vocab), tgt_vocab_size=len(vocab),
                        bos_token_id=bos, pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=eos,
                        tie_word_embeddings=False, scale_embedding=True, **SIZE)
    torch.manual_seed(seed)
    model = FSMTForConditionalGeneration(config)
    _randomise(model, seed)
    _bias_eos(model, model.model.decoder.layers[-1].final_layer_norm, eos)
    model.generation_config = GenerationConfig(decoder_start_token_id=eos, eos_token_id=eos, pad_token_id=pad,
                                               bos_token_id=bos, max_new_tokens=16, num_beams=1)
    model.eval().save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build_tiny_m2m100(out_dir: str | Path, seed: int = 0, vocab_size: int = 400) -> Path:
    """A random M2M100 (multilingual: needs target-language codes, as NLLB does) on a SentencePiece vocab."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spm_model = _spm_bytes(corpus_lines(), vocab_size)
    (out / "sentencepiece.bpe.model").write_bytes(spm_model)
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    pieces = [p for p in _spm_pieces(spm_model) if p not in specials]
    (out / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(specials + pieces)}, ensure_ascii=False))
    tok = M2M100Tokenizer(vocab_file=str(out / "vocab.json"), spm_file=str(out / "sentencepiece.bpe.model"),
                          src_lang="en", tgt_lang="de")
    n = len(tok.encoder) + len(tok.lang_code_to_id) + tok.num_madeup_words  # fairseq layout: langs after vocab
    config = M2M100Config(vocab_size=n, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                          decoder_start_token_id=2, scale_embedding=True, **SIZE)
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config)
    _randomise(model, seed)
    _bias_eos(model, model.model.decoder.layer_norm, 2, bias=3.0)  # its pre-norm logits run smaller
    model.generation_config = GenerationConfig(decoder_start_token_id=2, eos_token_id=2, pad_token_id=1,
                                               bos_token_id=0, max_new_tokens=16, num_beams=1)
    model.eval().save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build_all(out_dir: str | Path) -> dict[str, Path]:
    """Both Marian directions (two seeds, so en->xx->en is a two-model chain), one FSMT and one M2M100 model."""
    out = Path(out_dir)
    return {"marian-en-xx": build_tiny_marian(out / "marian-en-xx", seed=1),
            "marian-xx-en": build_tiny_marian(out / "marian-xx-en", seed=2),
            "fsmt-en-de": build_tiny_fsmt(out / "fsmt-en-de", seed=3),
            "m2m100": build_tiny_m2m100(out / "m2m100", seed=4)}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.tiny_mt OUT_DIR")
    for name, path in build_all(sys.argv[1]).items():
        print(f"{name}\t{path}")
