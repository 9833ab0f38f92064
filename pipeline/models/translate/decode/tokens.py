"""A Marian tokenizer's input ids through SentencePiece's batch call (engines/hf.py calls it for every batch of rows).

    ids = input_ids(tokenizer, texts, max_length)   # == tokenizer(texts, truncation=True, max_length=...)["input_ids"]

transformers' MarianTokenizer is Python: per row it splits the text around special tokens, encodes it with
SentencePiece, maps each piece through its vocabulary and appends </s> (~42 us a row on this box). Here the rows go
to SentencePiece in one call and its piece ids through a table of the same vocabulary (id_table; a row with a
piece SentencePiece does not know maps its pieces' text, as the tokenizer does): the same ids
(tests/test_decode_loop.py).
Rows that hold a "<" or ">" past a leading >>code<< (special tokens in the text) and every other tokenizer go
through the tokenizer itself.
Output ids come back as the batch's array: `texts` maps them to SentencePiece ids with one table lookup and decodes
them in one SentencePiece call (array_texts), with no Python per token.
"""
from __future__ import annotations

import numpy as np


def input_ids(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    spm = getattr(tokenizer, "spm_source", None)
    vocab = getattr(tokenizer, "current_encoder", None)
    if type(tokenizer).__name__ != "MarianTokenizer" or spm is None or vocab is None \
            or tokenizer.current_spm is not spm:
        return tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    codes, bodies, slow = [], [], []
    for i, t in enumerate(texts):
        code, body = tokenizer.remove_language_code(t)
        codes.append(code)
        bodies.append(body)
        if "<" in body or ">" in body or (code and code[0] not in vocab):
            slow.append(i)
    unk, eos = vocab[tokenizer.unk_token], tokenizer.eos_token_id
    table, spm_unk = id_table(tokenizer, spm, vocab, unk), spm.unk_id()
    out = []
    for i, (code, pieces) in enumerate(zip(codes, spm.encode(bodies))):
        if spm_unk in pieces:  # a piece SentencePiece does not know may still be in the vocabulary by its text
            pieces = [vocab.get(p, unk) for p in spm.encode(bodies[i], out_type=str)]
        else:
            pieces = [table[p] for p in pieces]
        ids = ([vocab.get(c, unk) for c in code] + pieces)[: max_length - 1]
        out.append(ids + [eos])
    if slow:
        for i, ids in zip(slow, tokenizer([texts[i] for i in slow], truncation=True, max_length=max_length)[
                "input_ids"]):
            out[i] = ids
    return out


def id_table(tokenizer, spm, vocab: dict, unk: int) -> list[int]:
    """The vocabulary's id of each SentencePiece id's piece (unk where the vocabulary lacks it), made once a
    tokenizer: the rows' ids map through a list index instead of a piece string's dictionary lookup."""
    table = getattr(tokenizer, "_contramine_id_table", None)
    if table is None or len(table) != spm.get_piece_size():
        table = [vocab.get(spm.id_to_piece(i), unk) for i in range(spm.get_piece_size())]
        tokenizer._contramine_id_table = table
    return table


def texts(tokenizer, seqs) -> list[str]:
    """`tokenizer.batch_decode(seqs, skip_special_tokens=True)`, for a Marian tokenizer through one SentencePiece
    batch call: special ids dropped, each id's token as the tokenizer names it (added tokens, its vocabulary, else
    the target SentencePiece's piece), the pieces decoded, "▁" made a space and the ends stripped, as
    MarianTokenizer.convert_tokens_to_string does. A row with an id past the table or a token named like a special
    token (which the tokenizer decodes apart) goes through the tokenizer itself; so does every other tokenizer.
    `seqs`: lists of ids, or a 2-D integer array (array_texts: no Python pass over the ids)."""
    marian = type(tokenizer).__name__ == "MarianTokenizer" and hasattr(tokenizer, "separate_vocabs")
    if isinstance(seqs, np.ndarray):
        if marian:
            return array_texts(tokenizer, seqs)
        seqs = seqs.tolist()
    if not marian:
        return tokenizer.batch_decode(seqs, skip_special_tokens=True)
    # as MarianTokenizer._decode: the source's SentencePiece unless the vocabularies are separate
    spm = tokenizer.spm_target if tokenizer.separate_vocabs else tokenizer.spm_source
    names, skip, apart = token_table(tokenizer, spm)
    rows: list[list[str]]  # each sequence's token strings ([] for a slow one)
    rows, slow, n = [], [], len(names)
    for r, seq in enumerate(seqs):
        if seq and (max(seq) >= n or min(seq) < 0) or not apart.isdisjoint(seq):
            slow.append(r)
            rows.append([])
        else:
            rows.append([names[i] for i in seq if i not in skip])
    out = [s.replace("\u2581", " ").strip() for s in spm.decode(rows)] if rows else []
    if tokenizer.clean_up_tokenization_spaces:
        out = [tokenizer.clean_up_tokenization(s) for s in out]
    if slow:
        for r, s in zip(slow, tokenizer.batch_decode([seqs[r] for r in slow], skip_special_tokens=True)):
            out[r] = s
    return out


def token_table(tokenizer, spm) -> tuple[list[str], set[int], set[int]]:
    """(each id's token, the special ids skipped, the other ids whose token is named like a special token), made
    once a tokenizer."""
    table = getattr(tokenizer, "_contramine_token_table", None)
    if table is None:
        size = max(len(tokenizer.decoder), spm.get_piece_size(), *(i + 1 for i in tokenizer._added_tokens_decoder))
        kept, tokenizer._decode_use_source_tokenizer = tokenizer._decode_use_source_tokenizer, \
            spm is tokenizer.spm_source  # its id -> piece fallback reads the SentencePiece decoding uses
        try:
            names = [tokenizer.convert_ids_to_tokens(i) for i in range(size)]
        finally:
            tokenizer._decode_use_source_tokenizer = kept
        skip = set(tokenizer.all_special_ids)
        special = set(tokenizer.all_special_tokens)
        table = (names, skip, {i for i, name in enumerate(names) if name in special and i not in skip})
        tokenizer._contramine_token_table = table
    return table


def array_texts(tokenizer, seqs: np.ndarray) -> list[str]:
    """texts() of a Marian tokenizer's rows held in a 2-D array (a batch's output ids): each id mapped to its
    SentencePiece id by one table lookup over the array and the rows decoded by ids in one SentencePiece call (its
    C++ maps ids to pieces): no Python per token, which the decode loop's next batch would wait on for the GIL.
    The table maps an id only where decoding that SentencePiece id is decoding the id's piece (a normal piece of
    the same text) and the special ids skipped to a control id (decoded to nothing); a row holding any other id
    goes through texts()' lists."""
    spm = tokenizer.spm_target if tokenizer.separate_vocabs else tokenizer.spm_source
    table, direct = spm_id_table(tokenizer, spm)
    inside = (seqs >= 0) & (seqs < len(table))
    ids = np.where(inside, seqs, 0)
    fast = inside.all(1) & direct[ids].all(1)
    out = [""] * len(seqs)
    rows = np.flatnonzero(fast)
    if len(rows):
        decoded = [s.replace("\u2581", " ").strip() for s in spm.decode(table[ids[rows]].tolist())]
        if tokenizer.clean_up_tokenization_spaces:
            decoded = [tokenizer.clean_up_tokenization(s) for s in decoded]
        for r, text in zip(rows.tolist(), decoded):
            out[r] = text
    slow = np.flatnonzero(~fast).tolist()
    for r, text in zip(slow, texts(tokenizer, [seqs[r].tolist() for r in slow])):
        out[r] = text
    return out


def spm_id_table(tokenizer, spm) -> tuple[np.ndarray, np.ndarray]:
    """(each id's SentencePiece id, whether array_texts may decode the id through it), made once a tokenizer."""
    cached = getattr(tokenizer, "_contramine_spm_ids", None)
    if cached is not None and cached[0] is spm:
        return cached[1], cached[2]
    names, skip, apart = token_table(tokenizer, spm)
    controls = [i for i in (spm.bos_id(), spm.eos_id(), spm.pad_id()) if 0 <= i < spm.get_piece_size()
                and spm.is_control(i)]
    table: np.ndarray = np.zeros(len(names), dtype=np.int64)
    direct: np.ndarray = np.zeros(len(names), dtype=bool)
    for i, name in enumerate(names):
        if i in skip:
            if controls:
                table[i], direct[i] = controls[0], True
            continue
        j = spm.piece_to_id(name) if isinstance(name, str) else -1
        if i not in apart and 0 <= j < spm.get_piece_size() and spm.id_to_piece(j) == name and not (
                spm.is_control(j) or spm.is_unknown(j) or spm.is_unused(j) or spm.is_byte(j)):
            table[i], direct[i] = j, True
    tokenizer._contramine_spm_ids = (spm, table, direct)
    return table, direct
