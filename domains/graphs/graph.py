"""One attributed graph with node labels, its checks, and the statistics graph people look at first.

A `Graph` is undirected: ``edge_index`` holds both directions of every edge, sorted, without duplicates
or self loops (`make_graph` puts any edge list in that form and checks it). Homophily is measured with
PyG's ``torch_geometric.utils.homophily`` in its three definitions:

- edge homophily (Zhu et al., NeurIPS 2020): the share of edges joining same-class nodes;
- node homophily (Pei et al., ICLR 2020): the per-node share of same-class neighbours, averaged;
- class-insensitive edge homophily (Lim et al., NeurIPS 2021):
  ``1/(C−1) Σ_k max(0, h_k − |C_k|/n)``, 0 for a graph no more homophilous than chance.

Shapes:
    x (n_nodes, n_features) float32, edge_index (2, n_edges) int64, y (n_nodes,) int64 (−1: unknown)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from workbench.core.errors import UserError

#: Class indices must lie below this (int32's range); anything larger is a damaged label, not a class.
MAX_CLASS_INDEX = 2**31
#: Largest share of non-zero node features at which the encoders read them as a sparse matrix (`Graph.features`).
SPARSE_FEATURE_DENSITY = 0.1


@dataclass
class Graph:
    """An undirected attributed graph; ``y`` is −1 where a node's label is unknown."""

    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    #: Where it came from (a path or a description), for messages.
    name: str
    #: Per-(dtype, device) caches: the propagator Ã and the encoders' feature matrix.
    _propagators: dict[Any, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def n_edges(self) -> int:
        """Undirected edges (half the columns of ``edge_index``)."""
        return int(self.edge_index.shape[1] // 2)

    @property
    def labelled(self) -> torch.Tensor:
        """Boolean mask (n_nodes,) of nodes with a known label."""
        return self.y >= 0

    def propagator(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Ã = D̃^-½(A + I)D̃^-½ as a sparse (n, n) tensor on the graph's device, computed once per dtype."""
        key = (dtype, self.x.device)
        if key not in self._propagators:
            from workbench.models.graph import normalized_adjacency

            self._propagators[key] = normalized_adjacency(self.edge_index, self.n_nodes, dtype)
        return self._propagators[key]

    def features(self) -> Any:
        """The node features the encoders read: ``x`` itself, or `workbench.models.graph.SparseFeatures` of it (made
        once per dtype and device) when at most `SPARSE_FEATURE_DENSITY` of its entries are non-zero (bag-of-words
        citation features: 0.5 %), so a first layer costs O(non-zeros · width) instead of O(n · d · width)."""
        key = ("features", self.x.dtype, self.x.device)
        if key not in self._propagators:
            from workbench.models.graph import SparseFeatures

            sparse = 0 < int(torch.count_nonzero(self.x)) <= SPARSE_FEATURE_DENSITY * self.x.numel()
            self._propagators[key] = SparseFeatures(self.x) if sparse else self.x
        return self._propagators[key]

    def to(self, device: torch.device | str) -> "Graph":
        """The graph on ``device`` (itself when already there)."""
        device = torch.device(device)
        if self.x.device == device:
            return self
        return Graph(self.x.to(device), self.edge_index.to(device), self.y.to(device), self.name)


def make_graph(
    x: np.ndarray | torch.Tensor,
    edges: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor | None,
    name: str,
) -> Graph:
    """Check and normalise a graph read from anywhere; every problem is a `UserError` naming ``name``.

    ``edges`` (2, m) or (m, 2) node indices, in any direction, possibly with duplicates and self loops
    (removed); ``y`` (n,) class indices, −1 (or NaN) for unknown, or None for an unlabelled graph.
    """
    from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

    x = _numeric(x, name, "node features").float()
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise UserError(f"{name}: node features: expected a (n_nodes, n_features) array, found shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        bad = int((~torch.isfinite(x)).any(1).sum())
        raise UserError(f"{name}: node features: expected finite numbers, found NaN/inf in {bad} node(s)")
    n = x.shape[0]
    edges = _numeric(edges, name, "edge_index")
    if edges.ndim == 2 and edges.shape[0] != 2 and edges.shape[1] == 2:
        edges = edges.t()
    if edges.ndim != 2 or edges.shape[0] != 2:
        raise UserError(f"{name}: edge_index: expected shape (2, n_edges), found {tuple(edges.shape)}")
    if edges.is_floating_point():
        if not torch.equal(edges, edges.round()):
            raise UserError(f"{name}: edge_index: expected integer node indices, found fractional values")
    edges = edges.long()
    if edges.numel() and (edges.min() < 0 or edges.max() >= n):
        raise UserError(
            f"{name}: edge_index: expected node indices in [0, {n - 1}] ({n} nodes), "
            f"found {int(edges.min())}..{int(edges.max())}"
        )
    edges, _ = remove_self_loops(edges)
    if edges.shape[1] == 0:
        raise UserError(
            f"{name}: the graph has no edges between distinct nodes (every node is isolated); "
            "graph filters and GNNs need edges — check the edge list file"
        )
    edges = coalesce(to_undirected(edges, num_nodes=n), num_nodes=n)
    if y is None:
        labels = torch.full((n,), -1, dtype=torch.long)
    else:
        array = np.asarray(y.cpu().numpy() if torch.is_tensor(y) else y)
        if array.shape != (n,):
            raise UserError(f"{name}: labels: expected shape ({n},) (one per node), found {array.shape}")
        if array.dtype.kind == "f":
            known = np.isfinite(array)
            if not np.equal(array[known], np.round(array[known])).all():
                raise UserError(f"{name}: labels: expected class indices (integers), found fractional values")
            array = np.where(known, array, -1)
        elif array.dtype.kind not in "iub":
            raise UserError(f"{name}: labels: expected integer class indices, found dtype {array.dtype}")
        if (array >= MAX_CLASS_INDEX).any():  # a larger float would wrap round when cast to int64
            raise UserError(f"{name}: labels: expected class indices below {MAX_CLASS_INDEX}, found {array.max():.0f}")
        labels = torch.as_tensor(array.astype(np.int64))
        labels[labels < 0] = -1
    return Graph(x, edges, labels, name)


def _numeric(value: Any, name: str, field_name: str) -> torch.Tensor:
    """``value`` (a tensor or array-like) as a tensor of real numbers; a `UserError` naming ``name`` otherwise."""
    if not torch.is_tensor(value):
        try:
            array = np.asarray(value)
        except ValueError:  # ragged nested sequences
            array = np.asarray(None)
        if array.dtype.kind not in "biuf":
            raise UserError(
                f"{name}: {field_name}: expected numbers, found {type(value).__name__} of dtype {array.dtype}"
            )
        value = torch.as_tensor(array)
    if value.is_complex():
        raise UserError(f"{name}: {field_name}: expected real numbers, found dtype {value.dtype}")
    return value


def homophily(graph: Graph, labels: torch.Tensor | None = None) -> dict[str, float]:
    """Edge, node and class-insensitive edge homophily (PyG) over the edges between labelled nodes.

    ``labels`` (n_nodes,) replace the graph's own (e.g. predicted classes); unknown (−1) nodes and their
    edges are left out.
    """
    from torch_geometric.utils import homophily as pyg_homophily
    from torch_geometric.utils import subgraph

    y = graph.y if labels is None else labels
    known = y >= 0
    edge_index = graph.edge_index
    if not bool(known.all()):
        edge_index, _ = subgraph(known, edge_index, relabel_nodes=True, num_nodes=graph.n_nodes)
        y = y[known]
    if edge_index.shape[1] == 0 or y.numel() == 0:
        return {"edge": float("nan"), "node": float("nan"), "class_insensitive": float("nan")}
    y = y.cpu()
    edge_index = edge_index.cpu()
    result = {"edge": float(pyg_homophily(edge_index, y, method="edge"))}
    # PyG's node homophily counts a node without neighbours as 0: measure it on the nodes that have some.
    has_neighbour = torch.zeros(len(y), dtype=torch.bool)
    has_neighbour[edge_index[1]] = True
    inner, _ = subgraph(has_neighbour, edge_index, relabel_nodes=True, num_nodes=len(y))
    result["node"] = float(pyg_homophily(inner, y[has_neighbour], method="node"))
    if int(y.max()) > 0:
        result["class_insensitive"] = float(pyg_homophily(edge_index, y, method="edge_insensitive"))
    else:
        result["class_insensitive"] = float("nan")
    return result


def class_entropy(labels: torch.Tensor, n_classes: int) -> float:
    """Normalised entropy of a labelling's class frequencies: H(p̂) / log C, p̂_c = share of the nodes labelled c.

    1 when the C classes are equally frequent, 0 when every node has one class (a collapsed prediction); unknown
    (−1) nodes are left out (nan when none is known).
    """
    if n_classes < 2:
        raise ValueError(f"class entropy needs at least two classes, got {n_classes}")
    known = labels[labels >= 0].long().flatten().cpu()
    if known.numel() == 0:
        return float("nan")
    share = torch.bincount(known, minlength=n_classes).double() / known.numel()
    share = share[share > 0]
    return float(-(share * share.log()).sum() / math.log(n_classes))


def degree_stats(graph: Graph) -> dict[str, float]:
    """Mean, median and largest degree, and the number of isolated nodes."""
    degree = torch.bincount(graph.edge_index[0].cpu(), minlength=graph.n_nodes).double()
    return {
        "mean": float(degree.mean()),
        "median": float(degree.median()),
        "max": float(degree.max()),
        "isolated": int((degree == 0).sum()),
    }


def label_counts(graph: Graph) -> dict[int, int]:
    """Nodes per known class."""
    y = graph.y[graph.labelled].cpu()
    if y.numel() == 0:
        return {}
    counts = torch.bincount(y)
    return {int(c): int(n) for c, n in enumerate(counts) if n > 0}


def describe(graph: Graph, role: str) -> list[str]:
    """Lines for ``workbench data info``: size, homophily, degrees, labels of one graph."""
    h = homophily(graph)
    degrees = degree_stats(graph)
    counts = label_counts(graph)
    total = max(sum(counts.values()), 1)
    return [
        f"{role}: {graph.n_nodes} nodes, {graph.n_edges} undirected edges, {graph.x.shape[1]} features ({graph.name})",
        f"  homophily: edge {h['edge']:.3f}, node {h['node']:.3f}, class-insensitive {h['class_insensitive']:.3f}",
        f"  degree: mean {degrees['mean']:.2f}, median {degrees['median']:.0f}, max {degrees['max']:.0f}, "
        f"isolated nodes {degrees['isolated']}",
        f"  labels ({int(graph.labelled.sum())} of {graph.n_nodes} known): "
        + ", ".join(f"{c}: {n} ({n / total:.0%})" for c, n in counts.items()),
    ]
