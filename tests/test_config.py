"""OptConfig: defaults, environment, arguments, sources, and every kind of bad value."""
from __future__ import annotations

import warnings

import pytest

from pyllamaopt import ConfigError, Context, FeatureUnavailableError, InvalidArgumentError, OptConfig, features, fields
from pyllamaopt.config import switches_without_effect

SPEC_DEFAULTS = {  # the specification's table (runtime defaults)
    "block_size": 64, "dedup_pool_max": 16384, "diff_min_unchanged": 8, "precompute_rope_max": 131072,
    "persist_enabled": False, "persist_dir": "", "memo_draft_max": 8, "attn_prune_enabled": False,
    "attn_prune_window": 10, "sparse_attn_enabled": False, "act_dedup_enabled": False,
    "algebraic_enabled": False, "h2o_enabled": False, "stats_enabled": False,
    "diff_reuse_shifted": False,  # ours: Tier 2, off by default like every approximate feature
    "diff_reuse_generated": False,
}
SPEC_VARIABLES = [
    "LLAMA_OPT_BLOCK_SIZE", "LLAMA_OPT_DEDUP_ENABLED", "LLAMA_OPT_DEDUP_POOL_MAX", "LLAMA_OPT_DIFF_ENABLED",
    "LLAMA_OPT_DIFF_MIN_UNCHANGED", "LLAMA_OPT_SCHEMA_SKIP_ENABLED", "LLAMA_OPT_CANON_ENABLED",
    "LLAMA_OPT_PRECOMPUTE_ENABLED", "LLAMA_OPT_PERSIST_ENABLED", "LLAMA_OPT_PERSIST_DIR", "LLAMA_OPT_MEMO_ENABLED",
    "LLAMA_OPT_ATTN_PRUNE_ENABLED", "LLAMA_OPT_ATTN_PRUNE_WINDOW", "LLAMA_OPT_ATTN_PRUNE_THRESHOLD",
    "LLAMA_OPT_SPARSE_ATTN_ENABLED", "LLAMA_OPT_ACT_DEDUP_ENABLED", "LLAMA_OPT_NOOP_ENABLED",
    "LLAMA_OPT_ALGEBRAIC_ENABLED", "LLAMA_OPT_STATS",
]


def test_defaults_follow_the_specification():
    cfg = OptConfig(env={})
    for name, value in SPEC_DEFAULTS.items():
        assert getattr(cfg, name) == value, name
        assert cfg.source(name) == "default"
    assert cfg.attn_prune_threshold == pytest.approx(0.001)
    assert cfg.sparse_relevance_threshold == pytest.approx(0.1)
    compiled = {f.enabled_field: f.compiled for f in features()}
    for flag in ("dedup_enabled", "diff_enabled", "schema_skip_enabled", "canon_enabled",
                 "memo_enabled"):  # on by default when compiled in
        assert getattr(cfg, flag) == compiled[flag]
    # the specification's "on" for these two would claim work that is not done (docs/profiling.md)
    assert cfg.precompute_enabled is False and cfg.noop_enabled is False


def test_every_variable_of_the_specification_is_known():
    known = {f.env for f in fields()}
    assert set(SPEC_VARIABLES) <= known


def test_environment_then_arguments(monkeypatch):
    monkeypatch.setenv("LLAMA_OPT_BLOCK_SIZE", "32")
    monkeypatch.setenv("LLAMA_OPT_DIFF_MIN_UNCHANGED", "16")
    cfg = OptConfig(diff_min_unchanged=4, persist_dir="/tmp/kv")
    assert (cfg.block_size, cfg.source("block_size")) == (32, "environment")
    assert (cfg.diff_min_unchanged, cfg.source("diff_min_unchanged")) == (4, "argument")
    assert (cfg.persist_dir, cfg.source("persist_dir")) == ("/tmp/kv", "argument")
    assert cfg.source("dedup_pool_max") == "default"
    row = next(r for r in cfg.table() if r[0] == "block_size")
    assert row == ("block_size", 32, "environment", "LLAMA_OPT_BLOCK_SIZE")


@pytest.mark.parametrize("text,expected", [("1", True), ("0", False), ("true", True), ("No", False),
                                           ("ON", True), (" yes ", True)])
def test_boolean_spellings(text, expected):
    assert OptConfig(env={"LLAMA_OPT_STATS": text}).stats_enabled is expected


@pytest.mark.parametrize("variable,value", [
    ("LLAMA_OPT_BLOCK_SIZE", "abc"), ("LLAMA_OPT_BLOCK_SIZE", "0"), ("LLAMA_OPT_BLOCK_SIZE", "-64"),
    ("LLAMA_OPT_BLOCK_SIZE", ""), ("LLAMA_OPT_DEDUP_POOL_MAX", "1e9"), ("LLAMA_OPT_DEDUP_ENABLED", "maybe"),
    ("LLAMA_OPT_ATTN_PRUNE_THRESHOLD", "-0.001"), ("LLAMA_OPT_ATTN_PRUNE_THRESHOLD", "nan"),
    ("LLAMA_OPT_SPARSE_ATTN_THRESHOLD", "2"), ("LLAMA_OPT_BLOCK_SIZE", "99999999999999999999999"),
])
def test_malformed_environment_values_name_the_variable(variable, value):
    with pytest.raises(ConfigError, match=variable) as info:
        OptConfig(env={variable: value})
    assert info.value.variable == variable


def test_typo_in_a_variable_name_is_an_error_with_a_suggestion():
    with pytest.raises(ConfigError, match="did you mean LLAMA_OPT_DEDUP_ENABLED"):
        OptConfig(env={"LLAMA_OPT_DEDUP_ENABLE": "1"})
    with pytest.raises(ConfigError, match="LLAMA_OPT_WHATEVER_THIS_IS"):
        OptConfig(env={"LLAMA_OPT_WHATEVER_THIS_IS": "1"})


def test_cli_variables_are_not_typos():
    assert OptConfig(env={"LLAMA_OPT_MODEL": "x.gguf", "LLAMA_OPT_N_CTX": "8192"}).block_size == 64


@pytest.mark.parametrize("name,value", [("block_size", "64"), ("block_size", 0), ("block_size", True),
                                        ("dedup_enabled", "yes"), ("attn_prune_threshold", -1.0),
                                        ("persist_dir", 3), ("blok_size", 64)])
def test_bad_arguments(name, value):
    with pytest.raises(ConfigError):
        OptConfig(env={}, **{name: value})


def test_only_llama_opt_variables_reach_the_engine_and_its_messages(monkeypatch):
    """A variable that is not valid UTF-8 elsewhere in the environment changes nothing (it broke
    every OptConfig(), and the error printed the whole environment, secrets included); in a
    LLAMA_OPT_* variable it is a ConfigError naming that variable, and nothing else."""
    environment = {"OTHER": "caf\udce9", "SECRET_TOKEN": "sk-very-secret", "LLAMA_OPT_BLOCK_SIZE": "32"}
    assert OptConfig(env=environment).block_size == 32
    with pytest.raises(ConfigError) as caught:
        OptConfig(env={**environment, "LLAMA_OPT_PERSIST_DIR": "/tmp/caf\udce9"})
    assert caught.value.variable == "LLAMA_OPT_PERSIST_DIR" and "not valid UTF-8" in str(caught.value)
    assert "sk-very-secret" not in str(caught.value)
    with pytest.raises(ConfigError, match="not valid UTF-8") as caught:
        OptConfig(env={}, persist_dir="/tmp/caf\udce9")
    assert caught.value.variable == "persist_dir"


def test_argument_errors_name_the_option_and_paths_expand_the_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert OptConfig(env={}, persist_dir="~/kv").persist_dir == str(tmp_path / "kv")
    for name, value in (("block_size", "64"), ("blok_size", 64)):
        with pytest.raises(ConfigError) as caught:
            OptConfig(env={}, **{name: value})
        assert caught.value.variable == name
    with pytest.raises(ConfigError, match="must be between 1 and"):  # whole, out of range: says the range
        OptConfig(env={"LLAMA_OPT_BLOCK_SIZE": "-1"})


def test_a_context_takes_an_optconfig_only(tiny_model):
    with pytest.raises(InvalidArgumentError, match="OptConfig"):
        Context(tiny_model, n_ctx=256, config={"block_size": 32})


def test_unknown_argument_suggests_the_name():
    with pytest.raises(ConfigError, match="did you mean 'block_size'"):
        OptConfig(env={}, blok_size=64)


def test_compiled_out_feature_is_a_clear_error_not_silence():
    compiled_out = [f for f in features() if not f.compiled]
    assert compiled_out, "the default build compiles the Tier-2 features out"
    for f in compiled_out:
        with pytest.raises(FeatureUnavailableError, match=f.cmake_switch):
            OptConfig(env={}, **{f.enabled_field: True})
        variable = next(x.env for x in fields() if x.name == f.enabled_field)
        with pytest.raises(FeatureUnavailableError, match=variable):
            OptConfig(env={variable: "1"})
        assert getattr(OptConfig(env={variable: "0"}), f.enabled_field) is False


def test_tier2_features_are_off_by_default():
    cfg = OptConfig(env={})
    for f in features():
        if f.tier == 2:
            assert getattr(cfg, f.enabled_field) is False


def test_a_switch_without_effect_says_so_and_is_never_on_by_default():
    """precompute, act_dedup, noop, algebraic were measured not to pay (docs/profiling.md): their
    switches are accepted (the specification's interface), off by default, and explain
    themselves; every implemented feature has an effect."""
    cfg = OptConfig(env={})
    without = {f.name for f in features() if f.no_effect}
    assert without == {"precompute", "act_dedup", "noop", "algebraic"}
    for f in features():
        assert bool(f.no_effect) == (not f.implemented), f.name
        if f.no_effect:
            assert f.no_effect.startswith("no effect:"), f.name
            assert getattr(cfg, f.enabled_field) is False, f"{f.enabled_field} is on by default and does nothing"
    assert switches_without_effect(cfg) == []
    turned_on = OptConfig(env={"LLAMA_OPT_PRECOMPUTE_ENABLED": "1"}, noop_enabled=True)
    assert [f.name for f in switches_without_effect(turned_on)] == ["precompute", "noop"]


def test_a_context_warns_about_a_switch_without_effect(tiny_model):
    with pytest.warns(UserWarning, match=r"precompute_enabled=1 no effect: measured not to pay.*profiling.md"):
        Context(tiny_model, n_ctx=256, n_batch=64, config=OptConfig(env={}, precompute_enabled=True)).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Context(tiny_model, n_ctx=256, n_batch=64, config=OptConfig(env={})).close()


def test_compiled_out_feature_without_effect_is_not_advertised_as_a_rebuild_away():
    for f in features():
        if not f.compiled and f.no_effect:
            with pytest.raises(FeatureUnavailableError, match="it would have no effect") as e:
                OptConfig(env={}, **{f.enabled_field: True})
            assert "reinstall" not in str(e.value)
