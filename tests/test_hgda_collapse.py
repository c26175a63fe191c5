"""HGDA without collapse (issue 52): the named variants, the delayed pseudo-labels, the collapse diagnostic and the
epoch selection that refuses a collapsed epoch."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from workbench.adaptation.homophily import VARIANTS, HomophilyAlignment
from workbench.domains.graphs.graph import class_entropy, homophily, make_graph
from workbench.domains.graphs.task import COLLAPSE_PENALTY, CSBMTask, PairSample, collapse_diagnostics, collapsed

import workbench as wb
from workbench.cli.compare import _compare_spec
from workbench.cli.parser import parse
from workbench.comparison.design import CompareSpec, entry_of
from workbench.core.config import RunRequest, resolve_config, variant_options
from workbench.core.errors import UserError
from workbench.core.registry import methods
from workbench.core.trainer import Trainer, TrainSettings


# -- the variants ----------------------------------------------------------------------------------
def test_variant_names_resolve_to_their_options():
    for label in ("homophily:released", "homophily:delayed"):
        entry = entry_of(label)
        assert methods.get(entry.method) is HomophilyAlignment and entry.variant == label.split(":")[1]
    released = HomophilyAlignment(**variant_options("homophily:released"))
    assert released.config == HomophilyAlignment().config  # the released recipe is the options' defaults
    assert (released.config["pseudo_warmup"], released.config["pseudo_threshold"]) == (0.0, 0.0)
    delayed = HomophilyAlignment(**variant_options("homophily:delayed"))
    assert (delayed.config["pseudo_warmup"], delayed.config["pseudo_threshold"]) == (0.5, 0.9)
    assert HomophilyAlignment.variants is VARIANTS and set(VARIANTS) == {"released", "delayed"}
    labels = ("homophily:released", "homophily:delayed", "mixed-filters", "full@gcn")
    CompareSpec("csbm", labels, method_options={label: variant_options(label) for label in labels[:2]}).check()
    for wrong, known in (("homophily:paper", "homophily:released, homophily:delayed"), ("mixed-filters:delayed",
                                                                                         "none")):  # fmt: skip
        with pytest.raises(UserError, match=f"declares no variant .*its variants: {known}"):
            variant_options(wrong)


def test_adapt_and_compare_resolve_a_declared_variant_and_options_given_win():
    config, _ = resolve_config(RunRequest(domain="csbm", method="homophily:delayed", out="-"))
    assert config.method == "homophily" and config.method_options["pseudo_warmup"] == 0.5
    assert config.method_options["pseudo_threshold"] == 0.9
    config, _ = resolve_config(RunRequest(domain="csbm", method="homophily:delayed", out="-",
                                          method_options={"pseudo_threshold": 0.7}))  # fmt: skip
    assert (config.method_options["pseudo_warmup"], config.method_options["pseudo_threshold"]) == (0.5, 0.7)
    with pytest.raises(UserError, match="--method homophily:late: .*declares no variant 'late'"):
        resolve_config(RunRequest(domain="csbm", method="homophily:late", out="-"))
    adapt = parse(["adapt", "--domain", "csbm", "--method", "homophily:delayed", "--pseudo-threshold", "0.8"])
    assert adapt.method == "homophily:delayed" and adapt.opt_pseudo_threshold == 0.8  # its options are offered
    spec = _compare_spec(parse(["compare", "--domain", "csbm", "--methods", "homophily:delayed,homophily",
                                "--set", "homophily:delayed.pseudo_threshold=0.8"]))  # fmt: skip
    assert spec.method_options == {"homophily:delayed": {"pseudo_warmup": 0.5, "pseudo_threshold": 0.8}}


# -- delayed pseudo-labels -------------------------------------------------------------------------
def test_delayed_variant_uses_no_pseudo_label_before_its_delay(tmp_path, monkeypatch):
    """Every call of the pseudo-label loss inside a training step is recorded with the method's epoch: the delayed
    variant (delay = half of 6 epochs) must make none in epochs 0-2, and must make some afterwards."""
    calls: list[tuple[int, int]] = []
    stepping: list[HomophilyAlignment] = []
    real_pseudo = HomophilyAlignment.terms.__globals__["pseudo_label_loss"]
    real_loss = HomophilyAlignment.loss

    def loss(self, task, model, batch, training):
        stepping.append(self) if training else None
        try:
            return real_loss(self, task, model, batch, training)
        finally:
            stepping.clear()

    def recording(logits, threshold=0.0):
        if stepping:  # a training step (not the diagnostics after training)
            calls.append((stepping[0].epoch, stepping[0].epochs))
        return real_pseudo(logits, threshold)

    monkeypatch.setitem(HomophilyAlignment.terms.__globals__, "pseudo_label_loss", recording)
    monkeypatch.setattr(HomophilyAlignment, "loss", loss)
    wb.adapt(domain="csbm", method="homophily", baselines=[], nodes=80, feature_dim=4, epochs=6, quiet=True,
             method_options=variant_options("homophily:delayed"), out=str(tmp_path / "delayed"))  # fmt: skip
    assert calls, "the pseudo-label term never ran after its delay"
    assert all(epochs == 6 for _, epochs in calls), calls
    assert sorted({epoch for epoch, _ in calls}) == [3, 4, 5], f"pseudo-labels before the delay: {calls}"
    calls.clear()
    wb.adapt(domain="csbm", method="homophily", baselines=[], nodes=80, feature_dim=4, epochs=6, quiet=True,
             method_options=variant_options("homophily:released"), out=str(tmp_path / "released"))  # fmt: skip
    assert sorted({epoch for epoch, _ in calls}) == [0, 1, 2, 3, 4, 5]  # the released recipe: from the first epoch


def test_delayed_loss_before_the_delay_is_source_plus_alignment_only():
    task = CSBMTask(nodes=60, feature_dim=4)
    raw = task.read(None, seed=0)
    model = task.load_model(None)
    data, _ = task.prepare(model, raw, 1, 1, 0)
    batch = data.train[0]
    method = HomophilyAlignment(pseudo_warmup=0.5)  # the delay of homophily:delayed, every node (an untrained model
    method.start_epoch(4, 10)  # is never 0.9 confident)
    torch.manual_seed(0)
    model.eval()  # no dropout: the same forward twice
    terms = method.terms(model, batch)
    assert float(terms["pseudo"]) > 0
    before = method.loss(task, model, batch, training=True)
    assert float(before) == pytest.approx(float(terms["source"] + 0.1 * terms["alignment"]), rel=1e-6)
    method.start_epoch(5, 10)
    after = method.loss(task, model, batch, training=True)
    assert float(after) == pytest.approx(float(before + 0.1 * terms["pseudo"]), rel=1e-6)


# -- the collapse diagnostic -----------------------------------------------------------------------
def _path_graph(labels: list[int]):
    n = len(labels)
    edges = torch.tensor([[i, i + 1] for i in range(n - 1)]).T
    return make_graph(torch.zeros(n, 2), edges, torch.tensor(labels), "path")


def test_collapse_diagnostic_matches_closed_forms():
    graph = _path_graph([0, 0, 1, 1])  # edges 0-1, 1-2, 2-3
    one_class = torch.zeros(4, dtype=torch.long)
    assert collapse_diagnostics(graph, one_class, 2) == {"predicted_class_entropy": 0.0,
                                                         "predicted_target_homophily": 1.0}  # fmt: skip
    found = collapse_diagnostics(graph, torch.tensor([0, 0, 1, 1]), 2)
    assert found["predicted_class_entropy"] == pytest.approx(1.0)
    assert found["predicted_target_homophily"] == pytest.approx(2 / 3)  # 2 of 3 edges join equal labels
    assert homophily(graph)["edge"] == pytest.approx(2 / 3)
    # H(3/4, 1/4) / log 2, and two equally frequent of four classes: log 2 / log 4.
    expected = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(2)
    assert class_entropy(torch.tensor([0, 0, 0, 1]), 2) == pytest.approx(expected)
    assert class_entropy(torch.tensor([0, 0, 1, 1]), 4) == pytest.approx(0.5)
    assert class_entropy(torch.tensor([2, -1, 2]), 3) == 0.0  # unknown nodes left out
    assert collapse_diagnostics(graph, torch.tensor([0, 1, 0, 1]), 2)["predicted_target_homophily"] == 0.0


def test_every_graph_run_reports_the_collapse_diagnostic(tmp_path):
    run = wb.adapt(domain="csbm", method="homophily", baselines=["full@gcn"], nodes=60, feature_dim=4, epochs=2,
                   quiet=True, out=str(tmp_path / "run"))  # fmt: skip
    for block in (run.metrics["after"], *run.metrics["baselines"].values()):
        assert 0.0 <= block["predicted_class_entropy"] <= 1.0 and 0.0 <= block["predicted_target_homophily"] <= 1.0
    assert {"predicted_class_entropy", "predicted_target_homophily"} <= set(CSBMTask.metrics)


# -- epoch selection -------------------------------------------------------------------------------
class Planted(nn.Module):
    """A 'model' whose predictions are planted per epoch: on the source's validation nodes a number of them right,
    on the target either balanced or one class. ``epoch`` is set by the trainer's epoch hook."""

    def __init__(self, plan: list[tuple[int, bool]]):
        super().__init__()
        self.plan, self.epoch = plan, 0
        self.weight = nn.Parameter(torch.zeros(()))

    def forward(self, graph) -> torch.Tensor:
        right, collapsed_target = self.plan[self.epoch]
        n = graph.n_nodes
        if graph.name == "source":
            labels = graph.y.clone()
            labels[right:] = 1 - labels[right:]  # the first `right` nodes correct
        else:
            labels = torch.zeros(n, dtype=torch.long) if collapsed_target else torch.arange(n) % 2
        return 5.0 * nn.functional.one_hot(labels, 2).float() + 0.0 * self.weight


def _planted_fit(collapse_entropy: float, plan: list[tuple[int, bool]]) -> int:
    source = make_graph(torch.zeros(8, 2), torch.tensor([[0, 1], [1, 2]]).T, torch.tensor([0, 1] * 4), "source")
    target = make_graph(torch.zeros(8, 2), torch.tensor([[0, 1], [1, 2]]).T, None, "target")
    everything = torch.ones(8, dtype=torch.bool)
    sample = PairSample(source, target, everything, everything)
    task = CSBMTask(collapse_entropy=collapse_entropy)
    model = Planted(plan)

    def epoch_start(epoch: int, epochs: int) -> None:
        model.epoch = epoch

    settings = TrainSettings(epochs=len(plan), batch_size=1, learning_rate=1e-3, ema_decay=None, patience=100)
    trainer = Trainer(model, task.loss, task.collate, [sample], [sample], settings, progress=False,
                      epoch_start=epoch_start)  # fmt: skip
    trainer.fit()
    return trainer.best["epoch"]


def test_selection_refuses_a_collapsed_epoch_in_a_planted_history():
    # epoch: (source validation nodes right of 8, target collapsed onto one class)
    plan = [(4, False), (8, True), (6, False), (5, False)]
    assert _planted_fit(0.5, plan) == 2  # the best source epoch (1) collapsed the target: refused
    assert _planted_fit(0.0, plan) == 1  # source validation alone keeps it
    assert _planted_fit(0.5, [(4, True), (8, True), (6, True)]) == 1  # all refused: the source rule among them
    assert collapsed(0.2, 0.5) and not collapsed(0.6, 0.5) and not collapsed(0.0, 0.0)
    assert not collapsed(float("nan"), 0.5) and COLLAPSE_PENALTY > 1.0 + 1e-3 * 10
    with pytest.raises(UserError, match="--collapse-entropy"):
        CSBMTask(collapse_entropy=1.0)
