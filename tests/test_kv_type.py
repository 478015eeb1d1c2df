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
