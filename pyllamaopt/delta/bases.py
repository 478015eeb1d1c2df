"""Shared bases: the mean of a matrix type over the layers of each k-means cluster of layers.

Memory stays at one layer plus the bases: layers are read one at a time, and k-means runs on
a fixed random sample of each layer's entries (an unbiased sketch of the squared distances
between layers), never on all layers at once.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

SKETCH_ENTRIES = 65536
MAX_ITERATIONS = 100
KMEANS_PLUS_PLUS_STARTS = 4

LayerLoader = Callable[[int], np.ndarray]


def cluster_layers(load: LayerLoader, n_layers: int, n_clusters: int, *, seed: int = 0) -> list[int]:
    """Cluster index of each layer. Lloyd's k-means from contiguous groups (early / middle /
    late, as the specification suggests) and from a few k-means++ starts; the tightest wins,
    the contiguous one on ties. (Contiguous starts alone stall on interleaved groups: a layer
    is then as far from its own group's centroid as from the other's.)"""
    contiguous = np.arange(n_layers) * n_clusters // n_layers
    if n_clusters == 1:
        return contiguous.tolist()
    sketches = _sketches(load, n_layers, seed)
    rng = np.random.default_rng(seed)
    starts = [contiguous] + [_kmeans_plus_plus(sketches, n_clusters, rng) for _ in range(KMEANS_PLUS_PLUS_STARTS)]
    results = [_lloyd(sketches, start, n_clusters) for start in starts]
    best = results[min(range(len(results)), key=lambda i: (results[i][1], i))][0]
    # number the clusters in order of their first layer: base 0 holds layer 0
    order = list(dict.fromkeys(best.tolist()))
    return [order.index(k) for k in best.tolist()]


def _lloyd(sketches: np.ndarray, assignment: np.ndarray, n_clusters: int) -> tuple[np.ndarray, float]:
    """Lloyd's iterations from `assignment`; the final assignment and its inertia."""
    for _ in range(MAX_ITERATIONS):
        centroids = np.stack([sketches[assignment == k].mean(axis=0) for k in range(n_clusters)])
        distances = ((sketches[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
        new = distances.argmin(axis=1)
        _fill_empty_clusters(new, distances, n_clusters)
        if np.array_equal(new, assignment):
            break
        assignment = new
    centroids = np.stack([sketches[assignment == k].mean(axis=0) for k in range(n_clusters)])
    return assignment, float(((sketches - centroids[assignment]) ** 2).sum())


def _kmeans_plus_plus(sketches: np.ndarray, n_clusters: int, rng: np.random.Generator) -> np.ndarray:
    """Assignment to k-means++ seeds: each next seed drawn with probability ∝ squared distance."""
    seeds = [int(rng.integers(len(sketches)))]
    for _ in range(1, n_clusters):
        d2 = ((sketches[:, None, :] - sketches[seeds][None, :, :]) ** 2).sum(axis=2).min(axis=1)
        # all layers equal to the seeds so far: any other layer will do
        seeds.append(int(rng.choice(len(sketches), p=d2 / d2.sum())) if d2.sum() > 0 else len(seeds))
    distances = ((sketches[:, None, :] - sketches[seeds][None, :, :]) ** 2).sum(axis=2)
    assignment = distances.argmin(axis=1)
    _fill_empty_clusters(assignment, distances, n_clusters)
    return assignment


def _sketches(load: LayerLoader, n_layers: int, seed: int) -> np.ndarray:
    first = load(0)
    size = first.size
    picked = np.sort(np.random.default_rng(seed).choice(size, min(size, SKETCH_ENTRIES), replace=False))
    return np.stack([(first if layer == 0 else load(layer)).reshape(-1)[picked] for layer in range(n_layers)])


def _fill_empty_clusters(assignment: np.ndarray, distances: np.ndarray, n_clusters: int) -> None:
    """An emptied cluster takes the layer farthest from its own centroid (from a cluster of 2+)."""
    for k in range(n_clusters):
        if np.any(assignment == k):
            continue
        counts = np.bincount(assignment, minlength=n_clusters)
        own = distances[np.arange(len(assignment)), assignment]
        own[counts[assignment] < 2] = -1.0
        assignment[int(own.argmax())] = k


def cluster_means(load: LayerLoader, assignment: list[int], n_clusters: int) -> list[np.ndarray]:
    """Mean of the layers of each cluster, accumulated in float64 one layer at a time."""
    sums: list[np.ndarray | None] = [None] * n_clusters
    counts = np.bincount(assignment, minlength=n_clusters)
    for layer, k in enumerate(assignment):
        w = load(layer)
        if sums[k] is None:
            sums[k] = w.astype(np.float64)
        else:
            sums[k] += w
    return [(total / counts[k]).astype(np.float32) for k, total in enumerate(sums)]
