"""One typed config for mining and training, loaded from a TOML profile and overridden per key.

    cfg = load_config("default", overrides=["neighbours.pool_size=32", "ipw.temperature=0.5"])

Profiles live in `configs/<name>.toml`; a profile may start with `inherit = "<other>"`. Every section forbids
unknown keys, so a typo fails at start with one line naming the key (`ConfigError`).

The one place callers import from: the sections and `Config` are defined in settings.py, loading (profiles,
overrides, the shard count) in profiles.py, which reads settings.py; neither imports this module, so there is no
import circle between them.
"""
from pipeline.profiles import (configure, load_config, read_profile, shards_for,  # noqa: F401
                               split_overrides)
from pipeline.settings import *  # noqa: F401,F403
from pipeline.settings import CONFIG_DIR, OBJECTIVE_NAMES, ROOT, SHARED_DATA  # noqa: F401  (named: callers use them)
from pipeline.translation_config import (BacktranslateCfg, ChainCfg, ChainRole,  # noqa: F401
                                        bergamot_greedy_problem, chain_name)
