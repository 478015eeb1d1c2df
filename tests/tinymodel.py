"""Tiny synthetic GGUF models for fast, deterministic tests (written with the gguf package).

A llama-architecture model with random weights and a small SentencePiece-style vocabulary
with byte fallback, so that any text tokenizes. Same seed -> same file, byte for byte.
"""
from __future__ import annotations

import string
from pathlib import Path

import gguf
import numpy as np

WORDS = ("the be to of and a in that have it for not on with he as you do at this but his by from they we "
         "say her she or an will my one all would there their what so up out if about who get which go me "
         "when make can like time no just him know take people into year your good some could them see "
         "other than then now look only come its over think also back after use two how our work first "
         "well way even new want because any these give day most us hello world python function test "
         "capital france paris code file error return value list").split()


# ChatML (SmolLM2's turns), for tests of the chat layer and the server's chat routes
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _vocab(characters: bool = True) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    pieces = []
    if characters:  # byte fallback and single characters: any text can be tokenized
        tokens += [f"<0x{b:02X}>" for b in range(256)]
        types += [gguf.TokenType.BYTE] * 256
        pieces += ["\u2581"] + list(string.ascii_letters + string.digits + string.punctuation)
        pieces += ["\u2581" + c for c in string.ascii_lowercase]
    pieces += ["\u2581" + w for w in WORDS] + list(dict.fromkeys(WORDS))
    pieces = list(dict.fromkeys(p for p in pieces if p not in tokens))
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    # SentencePiece prefers higher scores: longer pieces first
    scores = [0.0] * (len(tokens) - len(pieces)) + [float(len(p)) - i * 1e-4 for i, p in enumerate(pieces)]
    return tokens, scores, [int(t) for t in types]


def write_tiny_llama(path: Path, *, seed: int = 0, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 128, n_ctx_train: int = 4096, characters: bool = True,
                     chat_template: str | list[dict[str, str]] | None = None) -> Path:
    """Write a tiny llama model to `path` and return it. characters=False: a vocabulary of
    whole words only (no byte fallback), where a grammar can leave a single token.
    chat_template: a jinja2 template in its metadata (default: none), or named ones
    ([{"name": "default" | "tool_use" | ..., "template": ...}], gguf's add_chat_template)."""
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab(characters)
    n_vocab, head_dim = len(tokens), n_embd // n_head

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama-test")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd) * 4)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(n_head * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_head * head_dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", norm())
    writer.add_tensor("output.weight", weight(n_vocab, n_embd) * 4)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
