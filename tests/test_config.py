"""One typed config: profiles, per-key overrides, and one-line errors that name the key."""
import re

import pytest

from contramine.pipeline.config import ConfigError, load_config


def test_profiles_validate_including_paper_ones():
    for name in ("default", "debcse-paper", "osscse-paper"):
        cfg = load_config(name)
        assert cfg.profile == name
    paper = load_config("debcse-paper")
    assert paper.encoder.model == "princeton-nlp/unsup-simcse-bert-base-uncased"
    assert paper.encoder.pooler == "cls_before_pooler"
    assert (paper.neighbours.lo, paper.neighbours.hi, paper.ipw.lambda_neg, paper.ipw.m_pos) == (0.25, 0.75, 0.8, 2)


def test_overrides_parse_toml_values():
    cfg = load_config("default", ["neighbours.pool_size=32", "ipw.temperature=0.5", "run.name=x",
                                  'scores.positives=["noise"]', "backtranslate.fallback=false"])
    assert cfg.neighbours.pool_size == 32 and cfg.ipw.temperature == 0.5 and cfg.run.name == "x"
    assert cfg.scores.positives == ["noise"] and cfg.backtranslate.fallback is False


@pytest.mark.parametrize("override, names", [
    ("neighbours.pool_sise=3", "neighbours.pool_sise: unknown key"),
    ("nosuch.key=1", "nosuch: unknown key"),
    ("neighbours.pool_size=abc", "neighbours.pool_size"),
    ("neighbours.lo=0.9", "neighbours.lo (0.9) > neighbours.hi"),
    ("ipw.temperature=0", "ipw.temperature"),
    ("ipw.m_neg=100", "ipw.m_neg (100) > neighbours.pool_size"),
    ("encoder.pooler=max", "encoder.pooler"),
])
def test_bad_values_fail_with_one_line_naming_the_key(override, names):
    with pytest.raises(ConfigError) as e:
        load_config("default", [override])
    msg = str(e.value)
    assert names in msg and "\n" not in msg


def test_unknown_profile_lists_known_ones():
    with pytest.raises(ConfigError, match="known profiles: .*default"):
        load_config("no-such-profile")


def test_section_hash_changes_only_with_its_section():
    a, b = load_config("default"), load_config("default", ["ipw.temperature=0.5"])
    assert a.section_hash("neighbours") == b.section_hash("neighbours")
    assert a.section_hash("ipw") != b.section_hash("ipw")


def test_set_splits_between_keys_never_inside_a_toml_value():
    from contramine.pipeline.config import split_overrides

    text = 'a.b=1 backtranslate.chains=[{models=["x", "y"], role="positives"}] c.d="p q=r" e.f=[1, 2]'
    assert split_overrides(text) == ["a.b=1", 'backtranslate.chains=[{models=["x", "y"], role="positives"}]',
                                     'c.d="p q=r"', "e.f=[1, 2]"]
    cfg = load_config("default", split_overrides('backtranslate.chains=[{models=["m1", "m2"], role="paraphrases"}]'))
    assert cfg.backtranslate.chains[0].role == "paraphrases" and cfg.backtranslate.chains[0].models == ["m1", "m2"]


def test_unquoted_paths_and_hub_ids_in_a_list_are_strings():
    """`SET="backtranslate.chains=[[/models/en-xx,/models/xx-en]]"` as a shell user types it, without TOML's quotes."""
    from contramine.pipeline.config import split_overrides

    cfg = load_config("default", split_overrides(
        "backtranslate.chains=[[/m/en-xx,/m/xx-en],[Helsinki-NLP/opus-mt-en-de, Helsinki-NLP/opus-mt-de-en]] "
        "scores.positives=[noise]"))
    assert [c.models for c in cfg.backtranslate.chains] == [["/m/en-xx", "/m/xx-en"],
                                                            ["Helsinki-NLP/opus-mt-en-de", "Helsinki-NLP/opus-mt-de-en"]]
    assert cfg.scores.positives == ["noise"]
    assert load_config("default", ["neighbours.lo=0.2"]).neighbours.lo == 0.2  # numbers stay numbers
    with pytest.raises(ConfigError, match="neighbours.pool_size"):
        load_config("default", ["neighbours.pool_size=[a, b]"])


def _float_settings() -> list[str]:
    """Every float setting of the config (train.<objective>.* are Sections too, checked when a run starts)."""
    import typing

    from pydantic import BaseModel

    from contramine.pipeline.config import Config

    keys = []

    def walk(model, prefix):
        for name, f in model.model_fields.items():
            key = prefix + (f.alias or name)
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
                walk(f.annotation, key + ".")
            elif float in (typing.get_args(f.annotation) or (f.annotation,)):
                keys.append(key)

    walk(Config, "")
    return keys


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_no_float_setting_takes_nan_or_infinity(value):
    """`ipw.absolute_margin=nan` silently dropped no negative, `backtranslate.max_new_tokens_factor=inf` crashed on
    the first row, `train.lr=inf` trained NaNs: every float setting refuses them in one line naming the key."""
    keys = _float_settings()
    assert {"ipw.absolute_margin", "ipw.temperature", "train.lr", "backtranslate.max_new_tokens_factor"} <= set(keys)
    for key in keys:
        with pytest.raises(ConfigError, match=rf"{key}: Input should be a finite number"):
            load_config("default", [f"{key}={value}"])


@pytest.mark.parametrize("key", ["neighbours.nprobe", "neighbours.ef_search"])
def test_an_index_searches_at_least_one_list_or_candidate(key):
    for bad in (0, -3):
        with pytest.raises(ConfigError, match=rf'{key} must be >= 1 or "auto", not {bad}'):
            load_config("default", [f"{key}={bad}"])
    assert getattr(load_config("default", [f"{key}=1"]).neighbours, key.split(".")[1]) == 1


@pytest.mark.parametrize("override, wanted", [
    ("run.name=", "run.name '': a run name is one folder inside run.root"),
    ("data.corpus=", "data.corpus is empty: name a file, a folder, a glob or hf:<dataset id>"),
    ("data.candidates=  ", "data.candidates is empty"),
])
def test_an_empty_name_is_refused_not_taken_as_the_default_or_the_working_folder(override, wanted):
    """`--run ""` mined into the profile's run (`default`), `--corpus ""` read the working directory as a folder
    corpus: each is one line now, from the CLI's options as from --set."""
    from contramine.pipeline.config import configure

    with pytest.raises(ConfigError, match=re.escape(wanted)):
        load_config("default", [override])
    key, value = override.split("=", 1)
    if key in ("run.name", "data.corpus"):
        with pytest.raises(ConfigError, match=re.escape(wanted)):
            configure("default", **{"run" if key == "run.name" else "corpus": value})
