"""Contextual stochastic block models (CSBM) with a chosen edge homophily: source/target graph pairs.

Deshpande et al., "Contextual Stochastic Block Models", NeurIPS 2018; the homophily parametrisation
follows the HGDA paper's synthetic study. Nodes get balanced classes; with n_c nodes per class and mean
degree ``deg``, each node has on average ``h·deg`` neighbours of its own class and ``(1−h)·deg`` of the
others (the SBM with ``p_in = h·deg/n_c``, ``p_out = (1−h)·deg/(n − n_c)``). We draw the graph
*microcanonically*: the number of edges is fixed at ``m = round(n·deg/2)`` and ``round(h·m)`` of them join
same-class pairs, spread over the class blocks by a multinomial in proportion to their number of node
pairs; inside a block every node pair is equally likely (uniform sampling without replacement). The
measured edge homophily is then the requested one up to rounding (|Δh| ≤ 1/m), and sampling costs
O(m), never O(n²).

Features: ``x_i = μ_{y_i} + ε_i``, ``ε ~ N(0, I_d)``, class means ``μ_c = signal · u_c`` with random unit
vectors ``u_c`` shared by both graphs of a pair. The target's features are shifted by ``shift · v`` (a
random unit vector v) — a covariate shift on top of the structural (homophily) shift.

Shapes:
    x (n_nodes, feature_dim) float32, edge_index (2, 2·m) int64, y (n_nodes,) int64
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from workbench.domains.graphs.graph import Graph, make_graph

from workbench.core.errors import UserError


@dataclass(frozen=True)
class CSBMSettings:
    """Parameters of one CSBM pair (defaults: the csbm task's)."""

    nodes: int = 1000
    classes: int = 3
    mean_degree: float = 10.0
    feature_dim: int = 32
    #: Norm of each class mean in units of the noise's standard deviation.
    feature_signal: float = 1.0
    #: Norm of the mean shift of the target's features (noise standard deviations).
    feature_shift: float = 0.5
    source_homophily: float = 0.8
    target_homophily: float = 0.5

    def check(self) -> None:
        """A `UserError` naming the option that cannot give a graph."""
        for name in ("source_homophily", "target_homophily"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UserError(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(self, name)}")
        if self.classes < 2:
            raise UserError(f"--classes must be at least 2, got {self.classes}")
        if self.nodes < 4 * self.classes:
            raise UserError(f"--nodes must be at least 4 per class ({4 * self.classes}), got {self.nodes}")
        if not 0 < self.mean_degree < self.nodes / self.classes - 1:
            raise UserError(
                f"--mean-degree must be in (0, nodes/classes − 1) = (0, {self.nodes / self.classes - 1:.1f}), "
                f"got {self.mean_degree}"
            )
        if self.feature_dim < 1:
            raise UserError(f"--feature-dim must be at least 1, got {self.feature_dim}")
        if self.feature_signal < 0 or self.feature_shift < 0:
            raise UserError("--feature-signal and --feature-shift must not be negative")


def _unique_pairs(rng: np.random.Generator, count: int, draw, n_total: int) -> np.ndarray:
    """``count`` distinct undirected pairs (count, 2) from ``draw(k) -> (k, 2)`` pairs, by rejection."""
    found = np.empty((0, 2), dtype=np.int64)
    while len(found) < count:
        need = count - len(found)
        pairs = np.sort(draw(int(need * 1.1) + 16), axis=1)
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
        keys = np.concatenate([found[:, 0] * n_total + found[:, 1], pairs[:, 0] * n_total + pairs[:, 1]])
        _, first = np.unique(keys, return_index=True)
        first = np.sort(first)  # keep the order of drawing: the first `count` distinct pairs
        merged = np.concatenate([found, pairs])[first]
        found = merged[:count]
    return found


def sbm_edges(labels: np.ndarray, homophily: float, mean_degree: float, rng: np.random.Generator) -> np.ndarray:
    """Undirected edges (m, 2) of a microcanonical SBM with edge homophily ``homophily`` (module docstring)."""
    n = len(labels)
    classes = np.unique(labels)
    members = [np.flatnonzero(labels == c) for c in classes]
    sizes = np.array([len(m) for m in members], dtype=np.int64)
    m_total = int(round(n * mean_degree / 2))
    m_in = int(round(homophily * m_total))
    m_out = m_total - m_in
    intra_pairs = sizes * (sizes - 1) // 2
    a, b = np.triu_indices(len(classes), k=1)
    inter_pairs = sizes[a] * sizes[b]
    if m_in > intra_pairs.sum() or m_out > inter_pairs.sum():
        raise UserError(
            f"a graph of {n} nodes in {len(classes)} classes cannot hold {m_in} same-class and {m_out} other edges: "
            "lower --mean-degree or raise --nodes"
        )
    edges = []
    for blocks, count, pairs in (
        ("intra", m_in, intra_pairs),
        ("inter", m_out, inter_pairs),
    ):
        if count == 0:
            continue
        allocation = rng.multinomial(count, pairs / pairs.sum())
        # A block asked for more edges than it has pairs (tiny classes): move the excess to the others.
        while (allocation > pairs).any():
            excess = int(np.clip(allocation - pairs, 0, None).sum())
            allocation = np.minimum(allocation, pairs)
            room = pairs - allocation
            allocation += rng.multinomial(excess, room / room.sum())
        for k, size in enumerate(allocation):
            if size == 0:
                continue
            if blocks == "intra":
                nodes = members[k]
                draw = lambda s, nodes=nodes: nodes[rng.integers(0, len(nodes), (s, 2))]  # noqa: E731
            else:
                left, right = members[a[k]], members[b[k]]
                draw = lambda s, left=left, right=right: np.stack(  # noqa: E731
                    [left[rng.integers(0, len(left), s)], right[rng.integers(0, len(right), s)]], axis=1
                )
            edges.append(_unique_pairs(rng, int(size), draw, n))
    return np.concatenate(edges)


def balanced_labels(nodes: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    """Class labels (nodes,) with class sizes differing by at most one, in random order."""
    return rng.permutation(np.arange(nodes) % classes).astype(np.int64)


def make_csbm(
    settings: CSBMSettings, homophily: float, means: np.ndarray, shift: np.ndarray, seed: int, name: str
) -> Graph:
    """One CSBM graph with edge homophily ``homophily``, class means (C, d) and feature offset (d,)."""
    rng = np.random.default_rng(seed)
    labels = balanced_labels(settings.nodes, settings.classes, rng)
    edges = sbm_edges(labels, homophily, settings.mean_degree, rng)
    x = means[labels] + rng.standard_normal((settings.nodes, settings.feature_dim)) + shift
    return make_graph(x.astype(np.float32), torch.as_tensor(edges.T), labels, name)


def make_csbm_pair(settings: CSBMSettings, seed: int = 0) -> tuple[Graph, Graph]:
    """(source, target) graphs: shared class means, the settings' homophilies, the target's features shifted."""
    settings.check()
    rng = np.random.default_rng([seed, 0x5B])
    directions = rng.standard_normal((settings.classes + 1, settings.feature_dim))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    means = settings.feature_signal * directions[:-1]
    shift = settings.feature_shift * directions[-1]
    source = make_csbm(
        settings, settings.source_homophily, means, np.zeros(settings.feature_dim), seed * 2 + 1, "CSBM source"
    )
    target = make_csbm(settings, settings.target_homophily, means, shift, seed * 2 + 2, "CSBM target")
    return source, target
