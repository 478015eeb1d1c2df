"""The facts behind exact algebraic rewriting (specification 000 §5.3) for a GGUF model: is QKV
one matmul, are any attention heads equal or equal up to a permutation of their rows, how similar
are heads' weights (cosine), and is there low-rank structure an exact factorization could use
(numerical rank of each matrix; how much of a layer a subspace shared by all layers keeps).

    python benchmarks/weight_structure.py [--model gemma3-270m] [--rank 64]

Exact rewriting needs exact structure: equal heads, or a matrix whose rank is below its smaller
side. Similar-but-not-equal weights only allow approximate (Tier 2) rewrites.
"""
from __future__ import annotations

import argparse
import re
from collections import defaultdict

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from pyllamaopt.models import resolve


def load(path: str) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    reader = GGUFReader(path)
    weights = {}
    for t in reader.tensors:
        if re.match(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|attn_qkv|ffn_gate|ffn_up|ffn_down)\.weight$", t.name):
            weights[t.name] = dequantize(t.data, t.tensor_type).astype(np.float32)
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")

    def key(name: str) -> int:
        field = reader.fields[f"{arch}.{name}"]
        return int(field.parts[field.data[0]][0])

    hp = {"n_head": key("attention.head_count"), "n_head_kv": key("attention.head_count_kv"),
          "n_layer": key("block_count"), "head_dim": key("attention.key_length")}
    return weights, hp


def head_blocks(w: np.ndarray, n: int, head_dim: int, columns: bool) -> list[np.ndarray]:
    """Per head: its rows of a projection (rows out = n × head_dim), or its columns of the output
    projection, as (head_dim, other) arrays."""
    if columns:
        return [w[:, h * head_dim:(h + 1) * head_dim].T for h in range(n)]
    return [w[h * head_dim:(h + 1) * head_dim, :] for h in range(n)]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))


def best_row_match(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over a's rows of the best |cosine| with any row of b: 1.0 if b is a's rows permuted
    (or sign-flipped)."""
    an = a / np.linalg.norm(a, axis=1, keepdims=True)
    bn = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.abs(an @ bn.T).max(axis=1).mean())


def same_rows_up_to_permutation(a: np.ndarray, b: np.ndarray) -> bool:
    return sorted(r.tobytes() for r in a) == sorted(r.tobytes() for r in b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--rank", type=int, default=64, help="rank of the shared subspace measured")
    args = parser.parse_args()
    path = str(resolve(args.model))
    weights, hp = load(path)
    n_layer, n_head, n_head_kv, head_dim = hp["n_layer"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    print(f"model {args.model}: {n_layer} layers, {n_head} query heads, {n_head_kv} KV heads, head_dim {head_dim}")
    fused = any(".attn_qkv." in name for name in weights)
    print(f"QKV fused into one matmul in the file: {'yes' if fused else 'no (attn_q, attn_k, attn_v)'}")

    print("\nattention heads, per layer: max |cosine| between two heads' weights; mean best row match "
          "(1.0 = one head is another's rows permuted); heads equal up to a row permutation")
    print(f"{'layer':>5}  {'matrix':<12} {'heads':>5}  {'max |cos|':>9}  {'row match':>9}  equal")
    summary: dict[str, list[float]] = defaultdict(list)
    equal_pairs = 0
    for il in range(n_layer):
        for what, n, columns in (("attn_q", n_head, False), ("attn_k", n_head_kv, False),
                                 ("attn_v", n_head_kv, False), ("attn_output", n_head, True)):
            w = weights.get(f"blk.{il}.{what}.weight")
            if w is None or n < 2:
                continue
            blocks = head_blocks(w, n, head_dim, columns)
            pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
            cos = max(abs(cosine(blocks[a], blocks[b])) for a, b in pairs)
            match = max(best_row_match(blocks[a], blocks[b]) for a, b in pairs)
            equal = sum(same_rows_up_to_permutation(blocks[a], blocks[b]) for a, b in pairs)
            equal_pairs += equal
            summary[what].append(cos)
            summary[what + " row match"].append(match)
            print(f"{il:>5}  {what:<12} {n:>5}  {cos:>9.4f}  {match:>9.4f}  {equal}/{len(pairs)}")
    print(f"\nhead pairs equal up to a permutation of their rows: {equal_pairs}")
    for what, values in summary.items():
        print(f"  {what:<24} max over layers {max(values):.4f}")

    print(f"\nrank structure per matrix type: numerical rank (singular values above 1e-6 of the largest) "
          f"and the share of the matrix (Frobenius) left outside the top-{args.rank} subspace of its own "
          f"rows vs of a subspace shared by all layers")
    print(f"{'matrix':<12} {'shape':>11}  {'min rank':>8}  {'own residual':>12}  {'shared residual':>15}")
    for what in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        mats = [weights[f"blk.{il}.{what}.weight"] for il in range(n_layer) if f"blk.{il}.{what}.weight" in weights]
        if not mats:
            continue
        ranks, own = [], []
        for w in mats:
            s = np.linalg.svd(w, compute_uv=False)
            ranks.append(int((s > 1e-6 * s[0]).sum()))
            own.append(float(np.sqrt((s[args.rank:] ** 2).sum() / (s ** 2).sum())))
        # a shared input subspace: the top right singular vectors of all layers' rows stacked
        stacked = np.concatenate(mats, axis=0)
        _, _, vt = np.linalg.svd(stacked, full_matrices=False)
        v = vt[:args.rank].T
        shared = [float(np.linalg.norm(w - (w @ v) @ v.T) / np.linalg.norm(w)) for w in mats]
        print(f"{what:<12} {str(mats[0].shape):>11}  {min(ranks):>8}  {np.mean(own):>12.3f}  {np.mean(shared):>15.3f}")
    print("\nAn exact rewrite needs equal heads (none above) or a rank below the smaller side; a "
          "similarity short of equality only allows an approximate rewrite (Tier 2).")


if __name__ == "__main__":
    main()
