"""contramine.pipeline: the offline mining. stages/ (one module a stage; the run order follows from what each reads,
engine/discovery.py), engine/ (how stages run: declarations, the shard runner, resources), storage/ (the run folder on
disk), memo/ (the row memo), corpus/ (reading the input), config/ (profiles and settings), models/ and search/ (what
the stages compute with), export.py and report/ (what leaves a run)."""

# One file, one module: this folder is the package `contramine.pipeline` (contramine/pipeline links here), never the top-level
# `pipeline` that a checkout's root on sys.path would also offer (two module objects, two registries)
if __name__ != "contramine.pipeline":
    raise ImportError(f"import contramine.pipeline, not {__name__}: this folder is part of the package contramine")
