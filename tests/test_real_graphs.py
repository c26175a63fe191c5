"""The csbm task on the citation graphs as the ACDNE authors publish them (``tests/data/real/graphs``: ACMv9,
Citationv1, DBLPv7 ``.mat``): the reader's counts against the published ones, ``data check``, a short default run,
and the sparse-feature path of the encoders against the dense one it replaces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
import torch.nn.functional as F
from test_cli import workbench
from workbench.domains.graphs.graph import Graph, homophily, make_graph
from workbench.domains.graphs.readers import read_graph
from workbench.models.graph import GraphNet, SparseFeatures, dropout_linear

import workbench as wb
from workbench import cli
from workbench.core.errors import UserError

REAL = Path(__file__).parent / "data" / "real" / "graphs"

#: (nodes, edges, features, classes) in Table 1 of ACDNE (Shen et al., AAAI 2020) and ASN (Zhang et al., CIKM 2021);
#: their edge counts include each node's self loop stored in the file.
PUBLISHED = {
    "acmv9": (9360, 15602, 6775, 5),
    "citationv1": (8935, 15113, 6775, 5),
    "dblpv7": (5484, 8130, 6775, 5),
}
#: Edge homophily of the graphs read here (first class of multi-class nodes).
HOMOPHILY = {"acmv9": 0.800, "citationv1": 0.860, "dblpv7": 0.820}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_reader_counts_match_the_published_ones(name):
    path = REAL / f"{name}.mat"
    graph, notes = read_graph(path)
    nodes, edges, features, classes = PUBLISHED[name]
    stored = scipy.io.loadmat(path)["network"]
    self_loops = int((stored.diagonal() != 0).sum())  # dropped by the reader (a GNN adds its own)
    assert graph.n_nodes == nodes
    assert graph.n_edges + self_loops == edges
    assert graph.x.shape == (nodes, features)
    assert int(graph.y.max()) + 1 == classes and bool(graph.labelled.all())
    assert abs(homophily(graph)["edge"] - HOMOPHILY[name]) < 0.005
    assert any("several classes" in note for note in notes)  # multi-label nodes are counted, not hidden


def test_data_check_on_the_real_pair_is_ok(capsys):
    assert (
        cli.run(["data", "check", "csbm", "--data", str(REAL), "--source-graph", "acmv9", "--target-graph", "dblpv7"])
        == 0
    )
    out = capsys.readouterr().out
    assert "source: 9360 nodes, 15556 undirected edges, 6775 features" in out
    assert "target: 5484 nodes, 8117 undirected edges" in out
    assert out.strip().splitlines()[-1].startswith("ok: ")


def test_a_bad_real_file_is_an_error_naming_the_file_and_field(tmp_path, capsys):
    content = scipy.io.loadmat(REAL / "dblpv7.mat")
    scipy.io.savemat(tmp_path / "dblpv7.mat", {"attrb": content["attrb"], "network": content["network"]})
    (tmp_path / "acmv9.mat").write_bytes((REAL / "acmv9.mat").read_bytes()[:50_000])  # cut short
    for name, expected in (("dblpv7", "'group'"), ("acmv9", "not a readable MATLAB .mat file")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["data", "check", "csbm", "--data", str(tmp_path), "--source-graph", name, "--target-graph", name])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"{name}.mat" in err and expected in err and "Traceback" not in err


def test_short_default_run_on_a_real_pair(tmp_path):
    """Every default method and baseline, 2 epochs at width 8: the run completes and scores the target."""
    out = tmp_path / "run"
    wb.adapt(
        "csbm",
        data=str(REAL),
        source_graph="dblpv7",
        target_graph="acmv9",
        epochs=2,
        hidden_channels=8,
        out=str(out),
        quiet=True,
    )  # the Python API: the CLI's parser would import every plug-in first
    metrics = json.loads((out / "metrics.json").read_text())
    text = json.dumps(metrics)
    for name in ("mixed-filters", "full@gcn", "full@graph-mlp", "udagcn@gcn"):
        assert name in text
    assert metrics["skipped_records"] == {"skipped": 0, "seen": 2, "records": []}
    assert 0.0 <= metrics["after"]["accuracy"] <= 1.0


# -- the sparse feature path against the dense one it replaces ---------------------------------------
def real_cut(name: str, nodes: int, dtype=torch.float64) -> Graph:
    """The first ``nodes`` nodes of a real graph and the edges among them."""
    graph, _ = read_graph(REAL / f"{name}.mat")
    keep = (graph.edge_index < nodes).all(0)
    return Graph(graph.x[:nodes].to(dtype), graph.edge_index[:, keep], graph.y[:nodes], f"{name}[:{nodes}]")


class DenseFeatureGraph(Graph):
    """The same graph read by the encoders as a dense matrix (the code path before sparse features)."""

    def features(self) -> torch.Tensor:
        return self.x


@pytest.mark.parametrize("encoder", ["mixed", "gcn", "mlp"])
def test_sparse_features_give_the_dense_forward_and_gradients(encoder):
    graph = real_cut("dblpv7", 400)
    assert isinstance(graph.features(), SparseFeatures)  # 0.5 % non-zero
    dense = DenseFeatureGraph(graph.x, graph.edge_index, graph.y, graph.name)
    torch.manual_seed(0)
    model = GraphNet(6775, 5, hidden_channels=16, encoder=encoder, dropout=0.5).double()
    model.eval()  # no dropout: the two paths compute the same function
    grads = []
    for g in (graph, dense):
        model.zero_grad()
        logits = model(g)
        F.cross_entropy(logits, g.y).backward()
        grads.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-10, atol=1e-10)
    for sparse_grad, dense_grad in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(sparse_grad, dense_grad, rtol=1e-9, atol=1e-10)


def test_sparse_dropout_is_dense_dropout_on_the_non_zeros():
    """Dropping stored entries only: zeros stay zero, kept entries are scaled by 1/(1−p), about p are dropped."""
    torch.manual_seed(0)
    x = (torch.rand(300, 40, dtype=torch.float64) < 0.2) * torch.rand(300, 40, dtype=torch.float64)
    features = SparseFeatures(x)
    torch.testing.assert_close(features.to_dense(), x)
    p = 0.3
    dropped = dropout_linear(features, torch.eye(40, dtype=torch.float64), None, p, training=True)  # X̃ · I
    assert bool((dropped[x == 0] == 0).all())
    kept = dropped[x != 0] != 0
    torch.testing.assert_close(dropped[x != 0][kept], x[x != 0][kept] / (1 - p))
    assert abs(1 - kept.double().mean().item() - p) < 0.03  # ~2,400 entries: 3 standard errors ≈ 0.028
    same = dropout_linear(features, torch.eye(40, dtype=torch.float64), None, p, training=False)
    torch.testing.assert_close(same, x)


def test_dense_features_keep_the_dense_path():
    """Generated CSBM features (Gaussian, dense) are read as they are: the results of the CSBM runs do not move."""
    from workbench.domains.graphs.csbm import CSBMSettings, make_csbm_pair

    source, _ = make_csbm_pair(CSBMSettings(nodes=200, feature_dim=6), seed=0)
    assert source.features() is source.x


@pytest.mark.slow
def test_default_method_at_default_settings_on_a_real_pair(tmp_path):
    """The default run (homophily + its four baselines, 100 epochs, seed 0) on ACMv9 → DBLPv7 transfers above the
    largest class's share (benchmarks/results/graph_citation.json: 0.578 against 0.330)."""
    out = tmp_path / "run"
    data = ["--data", str(REAL), "--source-graph", "acmv9", "--target-graph", "dblpv7"]
    workbench("adapt", "--domain", "csbm", *data, "--out", str(out), "--quiet")
    metrics = json.loads((out / "metrics.json").read_text())
    largest_class = 1808 / 5484
    assert metrics["after"]["accuracy"] > largest_class + 0.15
    assert metrics["after"]["source_accuracy"] > 0.7


def test_bad_feature_values_name_the_field(tmp_path):
    with pytest.raises(UserError, match="node features"):
        make_graph(np.full((3, 2), np.nan), np.array([[0, 1], [1, 2]]), np.array([0, 1, 0]), "x.mat")
