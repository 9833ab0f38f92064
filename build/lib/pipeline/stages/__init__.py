"""The mining stages, one module each: its computation (pure functions over Arrow tables) and, next to it, its
declaration (`@stage(...)` from pipeline/engine/spec.py: what it reads, writes, which settings and facts change it).

ORDER is the order `make mine` runs them in (each stage after the stages whose tables it reads). Adding a stage:
a new module here with one `@stage` function, its name in ORDER, and `python -m flows.deployments > prefect.yaml`.
An entry with a dot is a full module path (a stage that lives outside this package).
"""
ORDER = ["sentences", "pool_sentences", "embeddings", "pool_embeddings", "neighbours",
         "noise", "backtranslate", "negate", "scores", "ipw", "pairs",
         "paraphrases", "triplets"]
