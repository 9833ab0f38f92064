"""Translation for the back-translation stages (METHODS §3, §6).

    chains.py     which chains run, on which engine, device and dtype (the plan); loading them; running rows
    settings.py   what the engines share: token budgets, model types, language settings, the kv-cache choice
    engines/      one module per engine (HF, CTranslate2, Bergamot) and the registry that loads the plan's one
    decode/       our decode loop for HF Marian / FSMT models: the loop, its step, beam search, token ids, the RNG
"""
