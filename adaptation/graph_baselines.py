"""Source-only graph baselines: a GCN and an MLP trained on the labelled source nodes, scored on the target.

They answer "what does adaptation add?": the GCN (Kipf & Welling, ICLR 2017; PyG's ``GCNConv``, 2
layers, hidden 64, a linear head) smooths over neighbours — the low-pass filter alone — and the MLP
ignores the edges, so it is immune to a change of homophily (and blind to the structure). Both train
every parameter with the task's loss (source cross-entropy); ``prepare`` gives the task's base model
a fresh encoder of the right kind, in place (`workbench.models.graph.GraphNet.set_encoder`).

Shapes:
    graph with x (n_nodes, in_features) → logits (n_nodes, n_classes)
"""

from __future__ import annotations

from workbench.adaptation.homophily import EncoderMethod

from workbench.registry import methods


@methods.register
class SourceOnlyGCN(EncoderMethod):
    name = "gcn"
    description = "Source-only 2-layer GCN (PyG GCNConv) + linear head: no adaptation"
    encoder = "gcn"


@methods.register
class SourceOnlyMLP(EncoderMethod):
    name = "mlp"
    description = "Source-only 2-layer MLP on node features (ignores the edges): no adaptation"
    encoder = "mlp"
