"""Node classifiers on graphs: the mixed-filter encoder of HGDA, a GCN and an MLP, behind one wrapper.

Mixed filters (Fang et al., "Homophily Enhanced Graph Domain Adaptation", ICML 2025): three branches
filter the node signal with

    low-pass   F_L = Ã = D̃^-½ (A + I) D̃^-½          (smooths over neighbours: homophilous graphs)
    high-pass  F_H = I − Ã                           (differences to neighbours: heterophilous graphs)
    full-pass  F_F = I                               (the node's own features)

and each stacks ``layers`` layers ``H ← ReLU(α · F · H · W)`` (a learnable scalar α per layer, W without
bias). The branch embeddings mix with learnable weights, ``Z = Σ_b w_b Z_b``, and a linear head gives
class logits. Every filter is a sparse product (``torch.sparse.mm`` with Ã in COO form, computed once per
graph and cached): cost and memory grow with the number of edges, never with n². Sparse node features
(bag-of-words: 0.5 % non-zero on the citation graphs) enter every encoder's first layer as a sparse matrix
(`GraphInput.features`, `SparseFeatures`), and input dropout drops their stored entries only (`dropout_linear`),
so the first layer costs O(non-zeros · width) rather than O(n · d · width).

Baselines share the wrapper: a 2-layer GCN (Kipf & Welling, ICLR 2017; PyG's ``GCNConv``) and an MLP
that ignores the edges, each with the same hidden width and linear head. `GraphNet` holds one encoder
and the head; each encoder is a registered model (``gnn``, ``gcn``, ``graph-mlp``) a graph task can adapt.

Shapes:
    x (n_nodes, in_features) float, edge_index (2, n_edges) int64 (both directions of each edge)
    → branch embeddings [(n_nodes, hidden_channels)] × n_branches → z (n_nodes, hidden_channels)
    → logits (n_nodes, n_classes)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from workbench.core.checkpoint import check_architecture, load_model, save_model, saved_model_files
from workbench.core.errors import UserError
from workbench.core.model import ModelFamily, ModelSpec
from workbench.core.registry import models

ENCODERS = ("mixed", "gcn", "mlp")
BRANCHES = ("low", "high", "full")


class GraphInput(Protocol):
    """What the encoders read from a graph (`workbench.domains.graphs.graph.Graph` is one)."""

    x: torch.Tensor
    edge_index: torch.Tensor

    def propagator(self, dtype: torch.dtype) -> torch.Tensor: ...

    def features(self) -> torch.Tensor | SparseFeatures:
        """``x``, or the same matrix as `SparseFeatures` (the first layer's input)."""
        ...


def normalized_adjacency(edge_index: torch.Tensor, n_nodes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Ã = D̃^-½ (A + I) D̃^-½ as a sparse COO tensor (n_nodes, n_nodes), D̃ the degrees of A + I.

    ``edge_index`` (2, n_edges) lists both directions of every undirected edge; existing self loops are
    kept once (weight 1), missing ones added. Built with PyG's ``gcn_norm`` — the same normalisation as
    ``GCNConv`` — so the low-pass branch and the GCN baseline smooth identically.
    """
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    index, weight = gcn_norm(edge_index, None, n_nodes, add_self_loops=True, dtype=dtype)
    return torch.sparse_coo_tensor(index, weight, (n_nodes, n_nodes), check_invariants=False).coalesce()


class SparseFeatures:
    """A sparse node-feature matrix (n, d), stored by rows and indexed by columns, for `dropout_linear`.

    ``values`` and ``columns`` (nnz,) in row-major order, ``row_offsets`` (n,) where each row starts; the same
    entries in column order: ``by_column`` (nnz,) their positions, ``rows_by_column`` (nnz,) their rows,
    ``column_offsets`` (d,) where each column starts. Built once per graph (`Graph.features`); never trained.
    """

    def __init__(self, x: torch.Tensor):
        coo = (x if x.is_sparse else x.to_sparse()).coalesce()  # entries in row-major order
        n, d = coo.shape
        self.shape = torch.Size((n, d))
        rows, self.columns = coo.indices()
        self.values = coo.values()
        self.row_offsets = self._offsets(rows, n)
        self.by_column = torch.argsort(self.columns, stable=True)
        self.rows_by_column = rows[self.by_column]
        self.column_offsets = self._offsets(self.columns, d)

    @staticmethod
    def _offsets(index: torch.Tensor, size: int) -> torch.Tensor:
        """Where each of ``size`` groups starts in an ordering of ``index`` sorted by group (size,)."""
        counts = torch.bincount(index, minlength=size)
        return torch.cumsum(counts, 0) - counts

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def to_dense(self) -> torch.Tensor:
        """The (n, d) matrix (for tests and small graphs)."""
        dense = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        dense[self.rows_by_column, self.columns[self.by_column]] = self.values[self.by_column]
        return dense


class _SparseLinear(torch.autograd.Function):
    """X·Wᵀ for sparse X (fixed, with ``values`` in place of its own) and a trained W (h, d): both directions are
    sums of weighted rows (``F.embedding_bag``): forward Σ_k v_k W[:, col_k] into row_k, backward
    ∂W = (Xᵀ G)ᵀ with Xᵀ read in column order. Cost O(non-zeros · h) each way."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, weight: torch.Tensor, features: SparseFeatures) -> torch.Tensor:
        ctx.features = features
        ctx.save_for_backward(values)
        table = weight.t().contiguous()  # (d, h)
        return F.embedding_bag(
            features.columns, table, features.row_offsets, mode="sum", per_sample_weights=values.to(table.dtype)
        )

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (values,) = ctx.saved_tensors
        features = ctx.features
        grad = grad.contiguous()
        weight_grad = F.embedding_bag(
            features.rows_by_column,
            grad,
            features.column_offsets,
            mode="sum",
            per_sample_weights=values[features.by_column].to(grad.dtype),
        )  # (d, h)
        return None, weight_grad.t(), None


def dropout_linear(
    h: torch.Tensor | SparseFeatures, weight: torch.Tensor, bias: torch.Tensor | None, p: float, training: bool
) -> torch.Tensor:
    """``F.linear(F.dropout(h, p, training), weight, bias)`` for dense ``h`` (n, d) or `SparseFeatures`.

    Sparse features: dropout drops their stored entries with probability ``p`` and scales the kept ones by
    1/(1 − p). A zero entry stays zero whether or not dense dropout drops it, so this is the dense dropout's
    random matrix restricted to the non-zeros — the same distribution — drawn in O(non-zeros) instead of
    O(n · d). Shapes: h (n, d), weight (h_out, d), bias (h_out,) → (n, h_out).
    """
    if not isinstance(h, SparseFeatures):
        return F.linear(F.dropout(h, p, training), weight, bias)
    values = F.dropout(h.values, p, training) if training and p > 0 else h.values
    out = _SparseLinear.apply(values, weight, h)
    return out if bias is None else out + bias


class MixedFilterEncoder(nn.Module):
    """Low-, high- and full-pass branches, ``layers`` layers each, mixed by learnable weights.

    Args:
        in_features: node feature dimension.
        hidden_channels: width of every layer and of the embedding (64 in HGDA).
        layers: layers per branch (2 in HGDA).
    """

    def __init__(self, in_features: int, hidden_channels: int = 64, layers: int = 2, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout
        self.weights = nn.ModuleDict(
            {
                branch: nn.ModuleList(
                    nn.Linear(in_features if i == 0 else hidden_channels, hidden_channels, bias=False)
                    for i in range(layers)
                )
                for branch in BRANCHES
            }
        )
        #: α of each layer of each branch (rows follow BRANCHES).
        self.alpha = nn.Parameter(torch.ones(len(BRANCHES), layers))
        #: w_b, the mixing weight of each branch.
        self.mix = nn.Parameter(torch.full((len(BRANCHES),), 1.0 / len(BRANCHES)))

    @staticmethod
    def filter(branch: str, propagator: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """F_b · h for one branch: Ã h, h − Ã h, or h (sparse products only)."""
        if branch == "full":
            return h
        smoothed = torch.sparse.mm(propagator, h)
        return smoothed if branch == "low" else h - smoothed

    def forward(self, graph: GraphInput) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(z (n, hidden), [z_low, z_high, z_full] each (n, hidden))."""
        propagator = graph.propagator(graph.x.dtype)
        parts = []
        for b, branch in enumerate(BRANCHES):
            h = graph.features()
            for layer, linear in enumerate(self.weights[branch]):
                h = dropout_linear(h, linear.weight, None, self.dropout, self.training)
                h = torch.relu(self.alpha[b, layer] * self.filter(branch, propagator, h))
            parts.append(h)
        z = sum(w * part for w, part in zip(self.mix, parts))
        return z, parts


class GCNEncoder(nn.Module):
    """``layers`` PyG ``GCNConv`` layers with ReLU (Kipf & Welling 2017); one branch."""

    def __init__(self, in_features: int, hidden_channels: int = 64, layers: int = 2, dropout: float = 0.0):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.dropout = dropout
        self.convs = nn.ModuleList(
            GCNConv(in_features if i == 0 else hidden_channels, hidden_channels) for i in range(layers)
        )

    def forward(self, graph: GraphInput) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h = graph.features()
        for conv in self.convs:
            if isinstance(h, SparseFeatures):  # GCNConv's own steps, its product on sparse features: Ã (X Wᵀ) + b
                projected = dropout_linear(h, conv.lin.weight, None, self.dropout, self.training)
                h = torch.sparse.mm(graph.propagator(projected.dtype), projected) + conv.bias
            else:
                h = conv(F.dropout(h, self.dropout, self.training), graph.edge_index)
            h = torch.relu(h)
        return h, [h]


class MLPEncoder(nn.Module):
    """``layers`` linear layers with ReLU; ignores the edges (the structure-free baseline)."""

    def __init__(self, in_features: int, hidden_channels: int = 64, layers: int = 2, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout
        self.linears = nn.ModuleList(
            nn.Linear(in_features if i == 0 else hidden_channels, hidden_channels) for i in range(layers)
        )

    def forward(self, graph: GraphInput) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h = graph.features()
        for linear in self.linears:
            h = torch.relu(dropout_linear(h, linear.weight, linear.bias, self.dropout, self.training))
        return h, [h]


def build_encoder(kind: str, in_features: int, hidden_channels: int, layers: int, dropout: float = 0.0) -> nn.Module:
    """A fresh encoder of ``kind`` (one of ENCODERS)."""
    classes = {"mixed": MixedFilterEncoder, "gcn": GCNEncoder, "mlp": MLPEncoder}
    if kind not in classes:
        raise UserError(f"unknown graph encoder '{kind}'; known: {', '.join(ENCODERS)}")
    return classes[kind](in_features, hidden_channels, layers, dropout)


class GraphNet(nn.Module):
    """An encoder (mixed filters, GCN or MLP) and a linear head: node class logits.

    Args:
        in_features: node feature dimension.
        n_classes: number of classes.
        hidden_channels: embedding width (64).
        layers: encoder layers (per branch for mixed filters) (2).
        encoder: "mixed", "gcn" or "mlp".
        dropout: dropout probability on the input of every encoder layer while training (0).
    """

    #: What the model declares to the methods (`workbench.core.model.ModelSpec`).
    workbench_spec = ModelSpec(family="gnn", head="head", embedding="embed")

    def __init__(
        self,
        in_features: int,
        n_classes: int,
        hidden_channels: int = 64,
        layers: int = 2,
        encoder: str = "mixed",
        dropout: float = 0.0,
    ):
        super().__init__()
        self.architecture: dict[str, Any] = {
            "in_features": int(in_features),
            "n_classes": int(n_classes),
            "hidden_channels": int(hidden_channels),
            "layers": int(layers),
            "encoder": encoder,
            "dropout": float(dropout),
        }
        if not 0.0 <= dropout < 1.0:
            raise UserError(f"dropout must be in [0, 1), got {dropout}")
        self.encoder = build_encoder(encoder, in_features, hidden_channels, layers, dropout)
        self.head = nn.Linear(hidden_channels, n_classes)

    @property
    def kind(self) -> str:
        return self.architecture["encoder"]

    def embed(self, graph: GraphInput) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(z (n, hidden), branch embeddings [(n, hidden)]) of every node of ``graph``."""
        if graph.x.shape[1] != self.architecture["in_features"]:
            raise UserError(
                f"the graph has {graph.x.shape[1]} node features; the model takes {self.architecture['in_features']}"
            )
        return self.encoder(graph)

    def forward(self, graph: GraphInput) -> torch.Tensor:
        """Class logits (n_nodes, n_classes)."""
        return self.head(self.embed(graph)[0])


def save_graph_net(model: GraphNet, path: str | Path) -> None:
    """Weights to ``path`` (.safetensors) and the architecture to the ``.json`` beside it."""
    save_model(model, path, "gnn")


def load_graph_net(path: str | Path) -> GraphNet:
    """A `GraphNet` saved by `save_graph_net` (safetensors + the JSON of its architecture)."""
    return load_model(
        path,
        lambda architecture: GraphNet(**architecture),
        "a graph model checkpoint",
        "{'in_features': int, 'n_classes': int, 'hidden_channels': int, 'layers': int, "
        f"'encoder': one of {list(ENCODERS)}}}",
    )


class GraphFamily(ModelFamily):
    """`GraphNet` node classifiers with one kind of encoder: a saved checkpoint, or (no ``source``) a fresh net of
    ``in_features``, ``n_classes`` (and ``hidden_channels``, ``layers``, ``dropout``)."""

    encoder: str = "mixed"

    def load(self, source: str | Path | None = None, *, trust_checkpoint: bool = False, **sizes) -> GraphNet:
        if source is None:
            if not {"in_features", "n_classes"} <= set(sizes):
                raise UserError(f"the {self.name} model ships no pretrained checkpoint; build one for a graph's sizes")
            return GraphNet(**sizes, encoder=self.encoder)
        model = load_graph_net(source)
        check_architecture(source, model.architecture, sizes, ("in_features", "n_classes"))
        return model

    def files(self, source=None) -> list[Path]:
        return [] if source is None else saved_model_files(source)


@models.register
class MixedFilterGraphFamily(GraphFamily):
    name = "gnn"
    description = "Node classifier with HGDA's mixed low/high/full-pass filter encoder (+ linear head)"


@models.register
class GCNFamily(GraphFamily):
    name = "gcn"
    description = "Node classifier with a 2-layer GCN encoder (PyG GCNConv, Kipf & Welling 2017) + linear head"
    encoder = "gcn"


@models.register
class GraphMLPFamily(GraphFamily):
    name = "graph-mlp"
    description = "Node classifier with a 2-layer MLP encoder that ignores the edges (+ linear head)"
    encoder = "mlp"
