"""kv_type, the KV cache's storage type (kv/kv-codec): its values, where they come from, and the
typed errors of a context that cannot use one. Exactness of reuse with each type, the bytes
per token and the disk tier's refusal of another type's entries: tests/integration/test_kv_type_gemma.py
(the tiny model's heads of 16 values take no quantized type)."""
from __future__ import annotations

import pytest

from pyllamaopt import ConfigError, Context, OptConfig


def test_f16_by_default_and_the_quantized_types_from_the_environment_or_an_argument():
    assert OptConfig(env={}).kv_type == "f16"
    assert OptConfig(env={"LLAMA_OPT_KV_TYPE": "q8_0"}).kv_type == "q8_0"
    assert OptConfig(env={"LLAMA_OPT_KV_TYPE": " Q4_0 "}).kv_type == "q4_0"
    config = OptConfig(env={"LLAMA_OPT_KV_TYPE": "q8_0"}, kv_type="q4_0")
    assert (config.kv_type, config.source("kv_type")) == ("q4_0", "argument")


@pytest.mark.parametrize("variable,value", [("LLAMA_OPT_KV_TYPE", "q5_0"), ("LLAMA_OPT_KV_TYPE", ""),
                                            ("kv_type", "fp8"), ("kv_type", "~/q8_0")])
def test_an_unknown_type_names_the_allowed_ones(variable, value):
    with pytest.raises(ConfigError, match="must be one of f16, q8_0, q4_0") as caught:
        if variable == "kv_type":
            OptConfig(env={}, kv_type=value)
        else:
            OptConfig(env={variable: value})
    assert caught.value.variable == variable


def test_the_f16_context_reports_the_models_bytes_per_token(tiny_model):
    with Context(tiny_model, n_ctx=256, n_batch=64, n_threads=1, config=OptConfig(env={})) as ctx:
        assert ctx.kv_type == "f16"
        assert ctx.kv_bytes_per_token == tiny_model.kv_bytes_per_token


def test_a_head_the_types_block_does_not_divide_is_a_config_error_saying_what_to_do(tiny_model):
    for kv_type in ("q8_0", "q4_0"):
        with pytest.raises(ConfigError, match="blocks of 32 values.*do not divide.*K 16, V 16.*kv_type='f16'") as caught:
            Context(tiny_model, n_ctx=256, n_batch=64, n_threads=1, config=OptConfig(env={}, kv_type=kv_type))
        assert caught.value.variable == "kv_type"


def test_a_quantized_v_without_flash_attention_is_a_config_error_saying_what_to_do(tiny_model):
    with pytest.raises(ConfigError, match="only with flash attention.*flash_attn=True.*kv_type='f16'"):
        Context(tiny_model, n_ctx=256, n_batch=64, n_threads=1, flash_attn=False,
                config=OptConfig(env={}, kv_type="q8_0"))


def test_k_and_v_take_kv_types_unless_set_alone():
    """kv_type_k / kv_type_v, as llama-server's --cache-type-k / -v: "" (the default) is kv_type's."""
    config = OptConfig(env={"LLAMA_OPT_KV_TYPE": "q8_0", "LLAMA_OPT_KV_TYPE_V": "Q4_0"})
    assert (config.kv_type, config.kv_type_k, config.kv_type_v) == ("q8_0", "", "q4_0")
    assert config.source("kv_type_v") == "environment" and config.source("kv_type_k") == "default"
    config = OptConfig(env={}, kv_type_k="f16", kv_type_v="q8_0")
    assert (config.kv_type_k, config.kv_type_v, config.source("kv_type_k")) == ("f16", "q8_0", "argument")


@pytest.mark.parametrize("variable,value", [("LLAMA_OPT_KV_TYPE_K", "q5_0"), ("LLAMA_OPT_KV_TYPE_V", "fp8"),
                                            ("kv_type_k", "q8_0/q4_0"), ("kv_type_v", "bf16")])
def test_an_unknown_k_or_v_type_names_the_allowed_ones(variable, value):
    with pytest.raises(ConfigError, match="must be one of f16, q8_0, q4_0$") as caught:
        if variable.startswith("kv_type"):
            OptConfig(env={}, **{variable: value})
        else:
            OptConfig(env={variable: value})
    assert caught.value.variable == variable


def test_an_f16_context_reports_f16_for_k_and_v(tiny_model):
    with Context(tiny_model, n_ctx=256, n_batch=64, n_threads=1, config=OptConfig(env={}, kv_type_k="f16")) as ctx:
        assert (ctx.kv_type, ctx.kv_type_k, ctx.kv_type_v) == ("f16", "f16", "f16")
        assert ctx.kv_bytes_per_token == tiny_model.kv_bytes_per_token


@pytest.mark.parametrize("options,named,part", [({"kv_type_k": "q8_0"}, "kv_type_k='q8_0'", "K"),
                                                ({"kv_type_v": "q4_0"}, "kv_type_v='q4_0'", "V"),
                                                ({"kv_type": "q8_0", "kv_type_v": "f16"}, "kv_type='q8_0'", "K")])
def test_a_head_one_types_block_does_not_divide_names_that_setting(tiny_model, options, named, part):
    with pytest.raises(ConfigError, match=f"^{named} stores {part} in blocks of 32 values.*K 16, V 16.*use "
                                          f"{named.split('=')[0]}='f16'") as caught:
        Context(tiny_model, n_ctx=256, n_batch=64, n_threads=1, config=OptConfig(env={}, **options))
    assert caught.value.variable == named.split("=")[0]


def test_a_quantized_v_alone_without_flash_attention_names_kv_type_v(tiny_model):
    with pytest.raises(ConfigError, match="^kv_type_v='q4_0' stores V quantized, which llama.cpp computes only with "
                                          "flash attention.*flash_attn=True.*kv_type_v='f16'") as caught:
        Context(tiny_model, n_ctx=256, n_batch=64, n_threads=1, flash_attn=False,
                config=OptConfig(env={}, kv_type_v="q4_0"))
    assert caught.value.variable == "kv_type_v"


def test_a_quantized_k_without_flash_attention_is_refused_though_llama_cpp_takes_it(tiny_model):
    """llama.cpp refuses only a quantized V without flash attention; a quantized K there would
    compute K·Q by matrix products whose exactness under the canonical schedule nobody measured."""
    with pytest.raises(ConfigError, match="^kv_type_k='q8_0' stores K quantized: llama.cpp computes that without "
                                          "flash attention too.*flash_attn=True, or use kv_type_k='f16'") as caught:
        Context(tiny_model, n_ctx=256, n_batch=64, n_threads=1, flash_attn=False,
                config=OptConfig(env={}, kv_type_k="q8_0"))
    assert caught.value.variable == "kv_type_k"
