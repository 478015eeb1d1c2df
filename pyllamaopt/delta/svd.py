"""Truncated SVD of a residual matrix and the rank choices made from its singular values.

Exact LAPACK SVD while the smaller side is at most EXACT_SVD_MAX_DIM; above that a randomized
SVD (Halko, Martinsson, Tropp 2011) of the leading singular triplets, so that a 8192 x 28672
matrix costs a few GEMMs instead of a full decomposition.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EXACT_SVD_MAX_DIM = 4096
OVERSAMPLING = 10
POWER_ITERATIONS = 2


@dataclass(frozen=True)
class TruncatedSVD:
    u: np.ndarray        # (rows, k), orthonormal columns
    s: np.ndarray        # (k,), descending
    vt: np.ndarray       # (k, cols), orthonormal rows
    tail_sq: np.ndarray  # (k + 1,): tail_sq[r] = squared Frobenius error of the rank-r truncation

    def numerical_rank(self) -> int:
        """Singular values above rounding noise, with numpy.linalg.matrix_rank's tolerance."""
        if self.s.size == 0:
            return 0
        tol = self.s[0] * max(self.u.shape[0], self.vt.shape[1]) * np.finfo(np.float32).eps
        return int(np.count_nonzero(self.s > tol))

    def factors(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """(U·√S, √S·Vᵀ) of the first `rank` triplets, in F16 as they are stored."""
        root = np.sqrt(self.s[:rank])
        return ((self.u[:, :rank] * root).astype(np.float16),
                (root[:, None] * self.vt[:rank]).astype(np.float16))


def truncated_svd(matrix: np.ndarray, max_rank: int, *, seed: int = 0) -> TruncatedSVD:
    """The leading `max_rank` singular triplets of `matrix` (float32), and the error of each
    truncation: exact with the exact SVD; with the randomized one, the true error of
    truncating within the sketched subspace, so a rank chosen from it is valid (maybe not minimal)."""
    matrix = np.asarray(matrix, dtype=np.float32)
    max_rank = min(max_rank, *matrix.shape)
    if min(matrix.shape) <= EXACT_SVD_MAX_DIM or max_rank + OVERSAMPLING >= min(matrix.shape):
        u, s, vt = np.linalg.svd(matrix, full_matrices=False)
        # summed from the tail itself: ‖M‖² − kept would lose small tails to cancellation
        tail_sq = np.concatenate((np.cumsum((s.astype(np.float64) ** 2)[::-1])[::-1], [0.0]))
    else:
        u, s, vt = _randomized_svd(matrix, max_rank, seed)
        norm_sq = float(np.einsum("ij,ij->", matrix, matrix, dtype=np.float64))
        tail_sq = np.maximum(norm_sq - np.concatenate(([0.0], np.cumsum(s.astype(np.float64) ** 2))), 0.0)
    return TruncatedSVD(u[:, :max_rank], s[:max_rank], vt[:max_rank], tail_sq[:max_rank + 1])


def _randomized_svd(matrix: np.ndarray, rank: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    sketch = matrix @ rng.standard_normal((matrix.shape[1], rank + OVERSAMPLING), dtype=np.float32)
    q, _ = np.linalg.qr(sketch)
    for _ in range(POWER_ITERATIONS):
        # re-orthonormalize between products, or the small singular directions drown in rounding
        q, _ = np.linalg.qr(matrix.T @ q)
        q, _ = np.linalg.qr(matrix @ q)
    u_small, s, vt = np.linalg.svd(q.T @ matrix, full_matrices=False)
    return q @ u_small, s, vt


def smallest_rank_within(svd: TruncatedSVD, max_error_sq: float) -> int | None:
    """The smallest rank whose truncation error (squared) is at most `max_error_sq`, or None
    when even all the computed triplets do not reach it."""
    meets = np.nonzero(svd.tail_sq <= max_error_sq)[0]
    return int(meets[0]) if meets.size else None
