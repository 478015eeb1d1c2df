"""The model families and KV cache types the exactness tests run on (tests/integration/test_*_gemma.py)."""
from __future__ import annotations

import os

import pytest

# One model of each family, by the name of its path fixture (conftest.py): sliding-window layers
# and Q5_0/Q8_0 weights (Gemma 3), the llama architecture and Q4_1 (SmolLM2), the Qwen2
# architecture and K-quants (Qwen2.5-Coder).
FAMILIES = {"gemma3-270m": "gemma_path", "smollm2-135m": "smollm2_path", "qwen2.5-coder-0.5b": "qwen_path"}

# The (family, KV cache type) pairs of the tests taking `family_kv_path` / `family_kv_model`: each
# family with f16. Reuse is exact relative to the same types.
#
# Every pair: PYLLAMAOPT_TESTS_EVERY_KV_PAIR=1 adds q8_0 and q4_0 on Gemma 3, q8_0 on SmolLM2 (full
# attention only), and K and V of different types on Gemma 3 ("K/V", kv_options): q8_0/q4_0
# (llama-server users' quantized pair) and f16/q8_0 (an F16 K, which keeps K's F16 dot products,
# with a quantized V). They passed on every CI from stop 51 to 56 but took 58 % of the
# canonical-schedule test's time (a quantized cache's attention takes ggml's one-row path): on a
# 2-core AVX2-only machine the suite did not fit the CI's 90 minutes with them. In the CI,
# test_kv_type_gemma.py still runs each type and pair for what is particular to it, q8_0 and
# q8_0/q4_0 keep other sessions bitwise exact beside a Tier-2 edit (test_reuse_gemma.py), and
# q8_0/q4_0 runs the sliding-window view (test_swa_view_gemma.py).
EVERY_FAMILY_KV_TYPE = [(family, "f16") for family in FAMILIES] + \
    [("gemma3-270m", "q8_0"), ("gemma3-270m", "q4_0"), ("smollm2-135m", "q8_0"),
     ("gemma3-270m", "q8_0/q4_0"), ("gemma3-270m", "f16/q8_0")]
FAMILY_KV_TYPES = EVERY_FAMILY_KV_TYPE if os.environ.get("PYLLAMAOPT_TESTS_EVERY_KV_PAIR") == "1" else \
    [(family, "f16") for family in FAMILIES]


def kv_options(kv_type: str) -> dict[str, str]:
    """OptConfig's arguments for a KV cache type of FAMILY_KV_TYPES: "q8_0" (K and V) or "q8_0/q4_0" (K/V)."""
    k, _, v = kv_type.partition("/")
    return {"kv_type_k": k, "kv_type_v": v} if v else {"kv_type": k}


def pair_id(pair: tuple[str, str]) -> str:
    return "-".join(pair)


def greedy_everywhere_seeded_on_f16(seeded: dict) -> list:
    """Cases for parametrize(("family_kv_path", "sampling"), ..., indirect=["family_kv_path"]):
    greedy sampling on every pair, seeded sampling on the f16 ones only (seeding adds nothing the
    quantized types would test; the CI's time)."""
    greedy = [pytest.param(pair, {}, id=f"{pair_id(pair)}-greedy") for pair in FAMILY_KV_TYPES]
    return greedy + [pytest.param(pair, seeded, id=f"{pair_id(pair)}-seeded")
                     for pair in FAMILY_KV_TYPES if pair[1] == "f16"]
