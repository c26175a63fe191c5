"""The graph domain: CSBM homophily, sparse filters against dense references, alignment terms, readers and
their errors, and the csbm task end to end (CLI, --data in the published layouts, Run.load)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.io
import scipy.sparse
import torch
from test_cli import workbench
from workbench.adaptation.homophily import branch_alignment, kl_means, kl_rows, pseudo_label_loss
from workbench.adaptation.udagcn import dann_schedule, reverse_gradient
from workbench.domains.graphs.csbm import CSBMSettings, make_csbm_pair
from workbench.domains.graphs.graph import Graph, homophily, make_graph
from workbench.domains.graphs.readers import read_graph, read_graph_pair
from workbench.domains.graphs.task import CSBMTask
from workbench.models.graph import GraphNet, MixedFilterEncoder, normalized_adjacency

import workbench as wb
from workbench.core.errors import UserError


def small_pair(**settings):
    return make_csbm_pair(CSBMSettings(**{"nodes": 300, "feature_dim": 6, **settings}), seed=0)


def dense_low_pass(edge_index: torch.Tensor, n: int) -> np.ndarray:
    """D̃^-½(A + I)D̃^-½ as a dense matrix, written out by hand (the reference)."""
    a = np.zeros((n, n))
    a[edge_index[0].numpy(), edge_index[1].numpy()] = 1.0
    a += np.eye(n)
    d = a.sum(1) ** -0.5
    return d[:, None] * a * d[None, :]


# -- the generator -------------------------------------------------------------------------------
@pytest.mark.parametrize("h_source, h_target", [(0.8, 0.2), (0.5, 1.0), (0.0, 0.35)])
def test_csbm_measured_homophily_matches_the_request(h_source, h_target):
    for seed in (0, 1):
        source, target = make_csbm_pair(
            CSBMSettings(nodes=240, classes=4, mean_degree=6, source_homophily=h_source, target_homophily=h_target),
            seed,
        )
        assert abs(homophily(source)["edge"] - h_source) <= 0.03
        assert abs(homophily(target)["edge"] - h_target) <= 0.03
        assert source.n_edges == target.n_edges == 720  # round(n · deg / 2)
        assert source.x.shape == (240, 32) and set(source.y.tolist()) == {0, 1, 2, 3}


def test_csbm_is_seeded_and_graphs_are_undirected_without_self_loops():
    a, _ = small_pair()
    b, _ = small_pair()
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
    other, _ = make_csbm_pair(CSBMSettings(nodes=300, feature_dim=6), seed=1)
    assert not torch.equal(a.edge_index, other.edge_index)
    edges = set(map(tuple, a.edge_index.t().tolist()))
    assert all((v, u) in edges for u, v in edges) and all(u != v for u, v in edges)


def test_csbm_rejects_impossible_settings():
    with pytest.raises(UserError, match="--target-homophily"):
        make_csbm_pair(CSBMSettings(target_homophily=1.5))
    with pytest.raises(UserError, match="--mean-degree"):
        make_csbm_pair(CSBMSettings(nodes=30, classes=3, mean_degree=20))


# -- filters against dense references --------------------------------------------------------------
def test_low_pass_operator_is_sparse_and_matches_the_dense_formula():
    graph, _ = small_pair(nodes=40, mean_degree=4)
    propagator = normalized_adjacency(graph.edge_index, graph.n_nodes, torch.float64)
    assert propagator.layout == torch.sparse_coo
    assert propagator._nnz() == graph.edge_index.shape[1] + graph.n_nodes  # edges + self loops, nothing dense
    np.testing.assert_allclose(propagator.to_dense().numpy(), dense_low_pass(graph.edge_index, 40), atol=1e-12)


def test_mixed_filter_branches_match_dense_matrices():
    graph, _ = small_pair(nodes=40, mean_degree=4)
    graph = Graph(graph.x.double(), graph.edge_index, graph.y, "small")
    torch.manual_seed(0)
    encoder = MixedFilterEncoder(graph.x.shape[1], hidden_channels=5, layers=2).double()
    with torch.no_grad():
        encoder.alpha.copy_(torch.tensor([[0.7, 1.3], [1.1, 0.9], [0.5, 2.0]]))
        encoder.mix.copy_(torch.tensor([0.2, 0.5, 0.3]))
    z, parts = encoder(graph)
    low = dense_low_pass(graph.edge_index, 40)
    filters = {"low": low, "high": np.eye(40) - low, "full": np.eye(40)}
    expected = []
    for b, branch in enumerate(("low", "high", "full")):
        h = graph.x.numpy()
        for layer, linear in enumerate(encoder.weights[branch]):
            w = linear.weight.detach().numpy().T
            h = np.maximum(encoder.alpha[b, layer].item() * filters[branch] @ h @ w, 0.0)
        expected.append(h)
        np.testing.assert_allclose(parts[b].detach().numpy(), h, atol=1e-10)
    np.testing.assert_allclose(
        z.detach().numpy(), 0.2 * expected[0] + 0.5 * expected[1] + 0.3 * expected[2], atol=1e-10
    )


def test_gcn_baseline_uses_the_same_normalised_adjacency():
    graph, _ = small_pair(nodes=40, mean_degree=4)
    torch.manual_seed(0)
    model = GraphNet(graph.x.shape[1], 3, hidden_channels=4, layers=1, encoder="gcn").double()
    graph = Graph(graph.x.double(), graph.edge_index, graph.y, "small")
    conv = model.encoder.convs[0]
    expected = dense_low_pass(graph.edge_index, 40) @ graph.x.numpy() @ conv.lin.weight.detach().numpy().T
    expected = np.maximum(expected + conv.bias.detach().numpy(), 0)
    np.testing.assert_allclose(model.embed(graph)[0].detach().numpy(), expected, atol=1e-10)


def test_each_encoder_is_a_registered_model_of_the_graph_sizes(tmp_path):
    from workbench.models.graph import save_graph_net

    from workbench.core.registry import models

    graph, _ = small_pair()
    for name, kind in (("gnn", "mixed"), ("gcn", "gcn"), ("graph-mlp", "mlp")):
        model = models.get(name)().load(None, in_features=graph.x.shape[1], n_classes=3, hidden_channels=8)
        assert model.kind == kind and model(graph).shape == (300, 3)
        assert model.workbench_spec.family == "gnn" and model.workbench_spec.head == "head"
    save_graph_net(model, tmp_path / "m.safetensors")
    with pytest.raises(UserError, match="the model has n_classes 3 \\(the data needs 4\\)"):
        models.get("gnn")().load(tmp_path / "m.safetensors", in_features=6, n_classes=4)


# -- alignment and pseudo-labels -----------------------------------------------------------------
def test_alignment_is_zero_for_identical_distributions():
    generator = torch.Generator().manual_seed(0)
    z = [torch.randn(50, 8, generator=generator) for _ in range(3)]
    permutation = torch.randperm(50, generator=generator)
    shuffled = [part[permutation] for part in z]
    assert branch_alignment(z, shuffled, pairing="mean").item() == pytest.approx(0.0, abs=1e-7)
    assert kl_rows(z[0], z[0]).item() == pytest.approx(0.0, abs=1e-7)
    # The authors' random-pair estimate measures pairwise spread: positive even when the distributions match.
    assert branch_alignment(z, shuffled, pairing="random", generator=generator).item() > 0.01
    shifted = [part + torch.linspace(0, 3, 8) for part in z]
    assert kl_means(z[0], shifted[0]) > 0.1
    for pairing in ("mean", "random"):
        value = branch_alignment(z, shifted, pairing=pairing, generator=torch.Generator().manual_seed(1))
        assert value > branch_alignment(z, shuffled, pairing="mean")


def test_alignment_gradients_reach_both_domains_and_pseudo_labels_respect_the_threshold():
    source = torch.randn(30, 4, requires_grad=True)
    target = torch.randn(20, 4, requires_grad=True)
    branch_alignment([source], [target], generator=torch.Generator().manual_seed(0)).backward()
    assert source.grad.abs().sum() > 0 and target.grad.abs().sum() > 0
    logits = torch.tensor([[5.0, 0.0], [0.1, 0.0]], requires_grad=True)
    confident = pseudo_label_loss(logits, threshold=0.9)
    assert confident.item() == pytest.approx(torch.nn.functional.cross_entropy(logits[:1], torch.tensor([0])).item())
    assert pseudo_label_loss(logits, threshold=0.999999).item() == 0.0


def test_pseudo_labels_wait_for_the_warmup_and_options_are_checked():
    from workbench.core.registry import methods

    method = methods.get("homophily")(pseudo_warmup=0.5)
    method.start_epoch(4, 10)
    assert not method.pseudo_active()
    method.start_epoch(5, 10)
    assert method.pseudo_active()
    with pytest.raises(UserError, match="--pseudo-warmup"):
        methods.get("homophily")(pseudo_warmup=1.0)
    with pytest.raises(UserError, match="--pairing must be one of"):
        wb.adapt(domain="csbm", method_options={"pairing": "sorted"}, quiet=True)


def test_gradient_reversal_and_schedule():
    x = torch.ones(3, requires_grad=True)
    (reverse_gradient(x, 0.5) * 2).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), -1.0))
    assert dann_schedule(0.0) == 0.0 and 0.99 < dann_schedule(1.0) < 1.0


# -- readers and bad input ---------------------------------------------------------------------------
def write_citation_mat(path, n=30, d=7, seed=0, **replace):
    """A small file in the ASN/ACDNE layout: sparse attrb, asymmetric sparse network, one-hot group."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n, 60)
    cols = (rows + rng.integers(1, 4, 60)) % n
    labels = np.arange(n) % 3
    content = {
        "attrb": scipy.sparse.csc_matrix((rng.random((n, d)) < 0.3).astype(np.float64)),
        "network": scipy.sparse.csc_matrix((np.ones(60), (rows, cols)), shape=(n, n)),
        "group": np.eye(3, dtype=np.uint8)[labels],
    }
    content.update(replace)
    scipy.io.savemat(path, {k: v for k, v in content.items() if v is not None})
    return path


def test_read_citation_mat_airports_text_and_pyg(tmp_path):
    from torch_geometric.data import Data

    graph, notes = read_graph(write_citation_mat(tmp_path / "acmv9.mat"))
    assert graph.x.shape == (30, 7) and graph.y.tolist() == (np.arange(30) % 3).tolist() and not notes
    assert graph.n_edges > 0 and (graph.edge_index[0] != graph.edge_index[1]).all()

    (tmp_path / "usa-airports.edgelist").write_text("101 205\n205 307\n307 101\n101 400\n")
    (tmp_path / "labels-usa-airports.txt").write_text("node label\n101 0\n205 1\n307 2\n400 3\n")
    airports, notes = read_graph(tmp_path, "USA")
    assert airports.x.shape == (4, 8) and airports.y.tolist() == [0, 1, 2, 3]
    assert airports.x[0].argmax() == 3 and "one-hot degree" in notes[0]  # airport 101 has 3 neighbours

    (tmp_path / "dblp_edgelist.txt").write_text("0,1\n1,2\n2,0\n")
    (tmp_path / "dblp_labels.txt").write_text("0\n1\n1\n")
    (tmp_path / "dblp_docs.txt").write_text("1,0\n0,1\n1,1\n")
    text, _ = read_graph(tmp_path, "dblp")
    assert text.x.tolist() == [[1, 0], [0, 1], [1, 1]] and text.n_edges == 3

    torch.save(
        Data(x=torch.randn(4, 3), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]), y=torch.arange(4)), tmp_path / "g.pt"
    )
    pyg, _ = read_graph(tmp_path / "g.pt")
    assert pyg.n_edges == 3 and pyg.y.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "source, target, message",
    [
        ({"edge_index": torch.tensor([[0, 1], [1, 9]])}, {}, "edge_index: expected node indices in \\[0, 3\\]"),
        ({"y": None}, {}, "the source graph has no node labels"),
        ({"edge_index": torch.tensor([[0, 1], [0, 1]])}, {}, "no edges between distinct nodes"),
        ({}, {"x": torch.randn(4, 5)}, "5 node features, but the source .* has 3"),
        ({}, {"y": torch.tensor([0, 1, 2, 7])}, "target label 7 is not a source class"),
    ],
)
def test_bad_graphs_get_clear_errors(tmp_path, source, target, message):
    base = {"x": torch.randn(4, 3), "edge_index": torch.tensor([[0, 1, 2], [1, 2, 3]]), "y": torch.tensor([0, 1, 2, 0])}
    for name, replace in (("source", source), ("target", target)):
        torch.save({k: v for k, v in {**base, **replace}.items() if v is not None}, tmp_path / f"{name}.pt")
    with pytest.raises(UserError, match=message):
        CSBMTask(source_graph="source", target_graph="target").read(tmp_path)


def test_reader_errors_name_the_file(tmp_path):
    with pytest.raises(UserError, match="acm.mat: field 'group'"):
        read_graph(write_citation_mat(tmp_path / "acm.mat", group=None))
    with pytest.raises(UserError, match="no graph named 'missing'.*found: acm"):
        read_graph(tmp_path, "missing")
    with pytest.raises(UserError, match="SOURCE,TARGET"):
        read_graph_pair(f"{tmp_path}/acm.mat,", "", "")
    (tmp_path / "x_edgelist.txt").write_text("0,1\n1,two\n")
    (tmp_path / "x_labels.txt").write_text("0\n1\n")
    with pytest.raises(UserError, match="x_edgelist.txt, line 2"):
        read_graph(tmp_path, "x")
    with pytest.raises(UserError, match="shape \\(2, n_edges\\)"):
        make_graph(np.zeros((3, 2)), np.zeros((3, 3)), None, "g")


def test_task_takes_one_pair_per_step():
    task = CSBMTask(nodes=60, feature_dim=4)
    raw = task.read(None, seed=0)
    with pytest.raises(UserError, match="--train-size and --val-size must be 1"):
        task.prepare(task.load_model(None), raw, 5, 1, 0)
    data, state = task.prepare(task.load_model(None), raw, 1, 1, 0)
    (sample,) = data.train
    assert (sample.target.y == -1).all() and (data.test[0].target.y >= 0).all()  # target labels only score
    assert not (sample.train_mask & sample.val_mask).any() and state["architecture"]["encoder"] == "mixed"


# -- end to end ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_adapt_csbm_writes_the_comparison(tmp_path):
    out = tmp_path / "run"
    result = workbench("adapt", "--domain", "csbm", "--epochs", "4", "--nodes", "150", "--out", str(out))
    assert "homophily (task's default method)" in result.stdout and "udagcn" in result.stdout
    assert "csbm: test split (" in result.stdout and " target nodes; trained on 1)" in result.stdout
    assert "edge homophily source 0.800 → target 0.500" in result.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["baselines"]) == {"mixed-filters", "full@gcn", "full@graph-mlp", "udagcn@gcn"}
    for block in (metrics["after"], *metrics["baselines"].values()):
        assert 0 <= block["accuracy"] <= 1 and 0 <= block["predicted_target_homophily"] <= 1
    assert {"mix_low", "mix_high", "mix_full", "final_alignment_loss"} <= set(metrics["after"])
    assert (out / "accuracy.png").is_file()
    run = wb.Run.load(out)
    assert run.model.kind == "mixed"
    rescored = workbench("evaluate", "--run", str(out), "--out", str(out.parent / "evaluation.json")).stdout
    assert "accuracy" in rescored
    info = workbench("data", "info", "csbm", "--nodes", "150", "--target-homophily", "0.2").stdout
    assert "class-insensitive" in info and "homophily gap (target − source): edge -0.600" in info


def test_adapt_on_citation_layout_and_reload_each_architecture(tmp_path):
    folder = tmp_path / "citation"
    folder.mkdir()
    write_citation_mat(folder / "acmv9.mat", n=40, seed=0)
    write_citation_mat(folder / "dblpv7.mat", n=30, seed=1)
    for method, model in (("full", "graph-mlp"), ("udagcn", "gcn")):
        run = wb.adapt(
            domain="csbm",
            method=method,
            model=model,
            baselines=[],
            data=str(folder),
            source_graph="acmv9",
            target_graph="dblpv7",
            epochs=2,
            out=str(tmp_path / method),
            quiet=True,
        )
        assert run.model.kind == {"graph-mlp": "mlp", "gcn": "gcn"}[model]
        assert not hasattr(run.model, "domain_classifier")  # merged away
        assert "acmv9 → dblpv7" in run.metrics["data"]
    with pytest.raises(UserError, match="--source-graph and --target-graph"):
        wb.adapt(domain="csbm", data=str(folder), out=str(tmp_path / "x"), quiet=True)
