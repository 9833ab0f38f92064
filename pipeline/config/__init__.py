"""One typed config for mining and training, loaded from a TOML profile and overridden per key.

    cfg = load_config("default", overrides=["neighbours.pool_size=32", "ipw.temperature=0.5"])

Profiles live in `configs/<name>.toml`; a profile may start with `inherit = "<other>"`. Every section forbids
unknown keys, so a typo fails at start with one line naming the key (`ConfigError`).

The package, by what it configures (each module imports only those below it):
  base.py            Section, ConfigError, the project's folders
  mining.py          run, runner, data and every mining stage's section but backtranslate
  backtranslation.py backtranslate: chains, generation, engines
  training.py        train, compare and mine (what a mine is for); the objective names (once)
  root.py            Config: all sections together, section_hash
  loading.py         profiles, overrides, the shard count
Callers outside pipeline/ import from here; pipeline's stages and models import from the module that defines what
they use, so their code versions do not cover settings they never read.
"""
from contramine.pipeline.config.backtranslation import (BacktranslateCfg, ChainCfg, ChainRole,  # noqa: F401
                                             bergamot_greedy_problem, chain_name)
from contramine.pipeline.config.base import (ARTIFACTS, CHECKOUT, CONFIG_DIR, ROOT, SHARED_DATA, ConfigError,  # noqa: F401
                                  Section, result_settings)
from contramine.pipeline.config.loading import (configure, load_config, read_profile, refuse_secrets,  # noqa: F401
                                               secret_pattern, secrets_to_environment, shards_for, split_overrides)
from contramine.pipeline.config.mining import (DataCfg, EmbeddingsCfg, EncoderCfg, IpwCfg, NegateCfg, NeighboursCfg,  # noqa: F401
                                    NoiseCfg, ParaphrasesCfg, Pooler, RunCfg, RunnerCfg, ScoresCfg, SentencesCfg)
from contramine.pipeline.config.root import Config  # noqa: F401
from contramine.pipeline.config.training import (FLAT_OBJECTIVE_KEYS, OBJECTIVE_NAMES, CompareCfg, MineCfg,  # noqa: F401
                                      Objective, TrainCfg)
