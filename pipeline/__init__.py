"""contramine.pipeline: the offline mining. stages/ (one module a stage, ORDER the run order), engine/ (how stages
run: declarations, the shard runner, resources), storage/ (the run folder on disk), memo/ (the row memo), corpus/
(reading the input), config/ (profiles and settings), models/ and search/ (what the stages compute with), export.py
and report/ (what leaves a run)."""
