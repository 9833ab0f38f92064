"""contramine.trainer: the lean trainer (train.py, one loop), its objectives (objectives/: DebCSE, OssCSE, SimCSE,
WhitenedCSE, DCLR), their sentence-transformers losses (st_losses/), STS evaluation (evaluate.py, sts.py) and
`make compare` (compare.py)."""
