"""contramine.trainer: the lean trainer (train.py, one loop), its objectives (objectives/: DebCSE, OssCSE, SimCSE,
WhitenedCSE, DCLR), their sentence-transformers losses (st_losses/), STS evaluation (evaluate.py, sts.py) and
`make compare` (compare.py)."""

# One file, one module: this folder is the package `contramine.trainer` (contramine/trainer links here), never the top-level
# `trainer` that a checkout's root on sys.path would also offer (two module objects, two registries)
if __name__ != "contramine.trainer":
    raise ImportError(f"import contramine.trainer, not {__name__}: this folder is part of the package contramine")
