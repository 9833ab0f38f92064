"""What `contramine --help` and each command's --help say: what it does and an example (flows/cli.py builds the
parsers from these)."""

DESCRIPTION = """Mine training data for unsupervised contrastive sentence embeddings (DebCSE, OssCSE, SimCSE,
WhitenedCSE, DCLR) from a plain corpus, look at it with SQL, export it for sentence-transformers, and train and
evaluate encoders on it. Every stage is cached and resumable: run a command again and it reuses what is intact.
A bad setting, corpus or model is one `error:` line naming it (exit code 2), before anything is written."""
EXAMPLES = """examples:
  contramine mine --corpus sentences.txt --run demo        mine a corpus (artifacts/demo/)
  contramine sql --run demo -q "SELECT * FROM pairs LIMIT 5"
  contramine export --run demo --format triplet            a Hugging Face dataset folder
  contramine train --run demo --objective debcse           an encoder with a model card
  contramine COMMAND --help                                what COMMAND does, its options, an example"""
# command -> (what it does, an example): its line in `contramine --help` and the head and foot of its own --help
COMMANDS = {
    "mine": ("run every mining stage in order, reusing intact shards (--for OBJECTIVE: only the stages whose tables "
             "that objective trains on)", "contramine mine --corpus sentences.txt --run demo --set noise.n_variants=4"),
    "stage": ("run one stage (the tables it reads must exist)", "contramine stage neighbours --run demo --force"),
    "sql": ("DuckDB over a run's tables: one query, or a shell", 'contramine sql --run demo -q "SELECT count(*) '
            'FROM pairs"'),
    "report": ("write the mining report of a run: a Markdown page (report/index.md, with PNG plots) of what was "
               "mined and why", "contramine report --run demo"),
    "export": ("write a run's mined rows as a Hugging Face dataset folder", "contramine export --run demo --format "
               "triplet debcse"),
    "cache": ("the row memo: its size per stage; --prune by age or by what no run uses; --verify every pack",
              "contramine cache --prune --older-than 30 --dry-run"),
    "verify": ("check every shard of a run against its manifest's hashes (--memo: the row memo too); exit 2 if "
               "anything is damaged", "contramine verify --run demo --memo"),
}
# Commands whose own module parses the rest of the line (`contramine train --help` prints that module's options).
DELEGATED = {
    "train": ("contramine.trainer.train", "train an encoder on a run's mined tables (an objective, a start model, a budget)"),
    "eval": ("contramine.trainer.evaluate", "score a model on STS12-16, STS-B and SICK-R (SentEval's protocol)"),
    "compare": ("contramine.trainer.compare", "every objective from one start on a run's tables: table, bootstrap, plots"),
    "bench": ("bench.run", "speed and memory against peers measured in the same run (in a checkout)"),
    "scale": ("bench.scale", "N synthetic sentences through every stage: seconds and peak RSS (in a checkout)"),
    "doctor": ("contramine.flows.doctor", "what this environment runs on, what it lacks and the one command that installs it"),
}
