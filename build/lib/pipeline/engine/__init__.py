"""How stages run, knowing none by name: the spec a stage declares (spec.py), the shard runner (runner.py), code
versions for cache keys (codeversion.py), Parquet shards and their sidecars (store.py), the one reader of a finished
run (tables.py) and the atomic writes everything goes through (atomic.py)."""
