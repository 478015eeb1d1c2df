"""Names in GGUF files: llama.cpp's layer matrices, the delta tensors, the delta metadata keys.
Plain strings, importable without gguf."""
from __future__ import annotations

PREFIX = "pyllamaopt.delta."
VERSION_KEY = PREFIX + "version"

# the specification's seven matrices of a transformer layer
DEFAULT_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def matrix_name(layer: int, matrix: str) -> str:
    return f"blk.{layer}.{matrix}.weight"


def layer_of(tensor_name: str) -> int | None:
    """The layer index of a ``blk.N.*`` tensor, None for tensors outside the layers."""
    parts = tensor_name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1])
    return None


def base_name(base: int, matrix: str) -> str:
    return f"base.{base}.{matrix}.weight"


def delta_u_name(layer: int, matrix: str) -> str:
    return f"blk.{layer}.{matrix}.delta_u"


def delta_v_name(layer: int, matrix: str) -> str:
    return f"blk.{layer}.{matrix}.delta_v"
