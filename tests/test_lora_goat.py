"""GOAT (Fan et al., ICML 2025) as a kind of the LoRA package, checked against closed forms and the authors' routing.

GOAT is not in PEFT: its init is checked against an independent SVD, its forward against the authors' gather loop
(``TopKGOATLayer.forward`` of Facico/GOAT-PEFT, re-written here from its description), its load-balancing loss against
the authors' formula, and its scale against ``sqrt(3 η n_in / r_e)``.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from workbench.adaptation import lora
from workbench.adaptation.lora.config import GOAT_RHO

from workbench.core.errors import UserError
from workbench.core.method import PlanInputs
from workbench.core.registry import methods
from workbench.core.trainer import TrainSettings


class Net(nn.Module):
    """x (batch, tokens, 24) → Linear (…, 16) → gelu → Linear (…, 3) → mean over tokens (batch, 3)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(24, 16)
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x))).mean(dim=1)


def net() -> Net:
    torch.manual_seed(0)
    return Net().double()


def inputs() -> torch.Tensor:
    return torch.randn(4, 5, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def goat(model: nn.Module, **options) -> nn.Module:
    settings = dict(targets=["fc"], rank=8, alpha=16.0, kind="goat", experts=4, init="goat", top_k=2)
    return lora.apply(model, **{**settings, **options})


def test_init_takes_each_experts_svd_segment_and_leaves_the_averaged_residual():
    base = net().fc.weight.detach().clone()
    model = goat(net())
    layer = lora.lora_layers(model)["fc"]
    u, s, vh = torch.linalg.svd(base, full_matrices=False)  # 16 singular values, 4 segments of 4, 2 per expert
    scale = 16.0 / 2
    assert layer.scales["default"] == scale
    residual = base.clone()
    for e, (a_e, b_e) in enumerate(zip(layer.lora_A["default"], layer.lora_B["default"])):
        chosen = [4 * e, 4 * e + 1]
        part = u[:, chosen] @ torch.diag(s[chosen] / GOAT_RHO) @ vh[chosen]
        torch.testing.assert_close(scale * b_e.weight @ a_e.weight, part, rtol=0, atol=1e-12)
        # each factor carries sqrt(S / (scale ρ)): equal norms on both sides
        torch.testing.assert_close(a_e.weight.norm(dim=1), b_e.weight.norm(dim=0), rtol=0, atol=1e-12)
        residual -= part / 4
    torch.testing.assert_close(layer.base_layer.weight, residual, rtol=0, atol=1e-12)
    lora.delete_adapter(model, "default")
    torch.testing.assert_close(model.fc.weight, base, rtol=0, atol=1e-12)


def authors_forward(layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' routing: softmax gate, top-k, renormalise, gather the chosen tokens per expert; and their
    load-balancing loss ``k · Σ_e (count_e / tokens) · mean_prob_e``."""
    flat = x.reshape(-1, x.shape[-1])
    probs = F.softmax(flat @ layer.lora_route["default"].weight.T, dim=-1)
    weights, selected = torch.topk(probs, 2, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros(len(flat), layer.base_layer.out_features, dtype=x.dtype)
    for e, (a_e, b_e) in enumerate(zip(layer.lora_A["default"], layer.lora_B["default"])):
        rows, nth = torch.where(selected == e)
        out[rows] += weights[rows, nth, None] * (flat[rows] @ a_e.weight.T @ b_e.weight.T) * layer.scales["default"]
    counts = torch.bincount(selected.reshape(-1), minlength=4).double() / len(flat)
    balance = 4 * (counts * probs.sum(dim=0) / len(flat)).sum()
    return layer.base_layer(x) + out.reshape(*x.shape[:-1], -1), balance


def test_forward_and_balance_loss_equal_the_authors_routing():
    model = goat(net())
    layer = lora.lora_layers(model)["fc"]
    with torch.no_grad():
        layer.lora_route["default"].weight.normal_(generator=torch.Generator().manual_seed(2))
    x = inputs()
    expected, balance = authors_forward(layer, x)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(layer.balance_loss["default"], balance, rtol=0, atol=1e-12)


def test_scalings():
    fc = lambda scaling: lora.lora_layers(goat(net(), scaling=scaling))["fc"].scales["default"]  # noqa: E731
    assert fc("goat") == pytest.approx(math.sqrt(3 * 1.0 * 24 / 2))  # sqrt(3 η n_in / r_e), η = 1
    assert fc("standard") == 16.0 / 2 and fc("rslora") == pytest.approx(16.0 / math.sqrt(2))


def test_refusals_name_what_is_wrong():
    with pytest.raises(UserError, match="belongs to GOAT's routed experts"):
        lora.apply(net(), targets=["fc"], init="goat")
    with pytest.raises(UserError, match="does not fit; lower the rank or the experts"):
        goat(net(), rank=20)  # 16 singular values in 4 segments of 4: an expert's rank 5 does not fit
    with pytest.raises(UserError, match="top_k must be an integer in 1..experts"):
        goat(net(), top_k=5)
    with pytest.raises(UserError, match="routed LoRA experts"):
        lora.apply(nn.Sequential(nn.Conv1d(3, 8, 3)), targets=["0"], rank=4, kind="goat", experts=2, init="goat")
    with pytest.raises(UserError, match="input-dependent update"):
        lora.merge(goat(net()))


class LossTask:
    def loss(self, model: nn.Module, batch: torch.Tensor, training: bool) -> torch.Tensor:
        return (model(batch) ** 2).mean()


def test_method_step_adds_the_weighted_balance_loss_and_keeps_the_model_unmerged(tmp_path):
    x, task = inputs(), LossTask()

    class Data:
        train, val = list(range(4)), [0]

    def router_grad(aux: float) -> torch.Tensor:
        method = methods.get("lora")(rank=8, alpha=16.0, targets="fc", head="frozen", init="goat", experts=4,
                                     goat_aux=aux)  # fmt: skip
        model = method.prepare(net())
        stage = method.plan(task, model, Data, PlanInputs(TrainSettings(epochs=1, batch_size=4)))[0]
        loss = stage.gradients(model, x, 0)
        assert loss == task.loss(model, x, True).detach()  # the task's loss is what the step reports
        assert method.merge(model) is model and lora.lora_layers(model)  # no merged form: kept as it is
        return lora.lora_layers(model)["fc"].lora_route["default"].weight.grad.clone()

    without, with_aux = router_grad(0.0), router_grad(10.0)
    assert not torch.allclose(without, with_aux)  # the balance loss reaches the router
    layer = lora.lora_layers(goat(net()))["fc"]
    layer(x)
    layer.balance_loss["default"].backward()
    torch.testing.assert_close(with_aux - without, 10.0 * layer.lora_route["default"].weight.grad)


def test_adapter_file_reloads_the_same_function(tmp_path):
    model = goat(net())
    for p in lora.adapter_parameters(model):
        with torch.no_grad():
            p.add_(0.1 * torch.randn_like(p))
    x = inputs()
    expected = model(x)
    lora.save_adapter(model, tmp_path / "goat")
    again = net()
    lora.load_adapter(again, tmp_path / "goat", strict=True)
    torch.testing.assert_close(again(x), expected, rtol=0, atol=1e-12)
    again(x)  # a training forward keeps the balance loss until the step takes it ...
    assert lora.lora_layers(again)["fc"].balance_loss
    lora.lora_layers(again)["fc"].take_balance_loss()
    assert copy.deepcopy(again)(x).shape == (4, 3)  # ... after which the model copies (EMA, best epoch)


@pytest.mark.slow  # ~40 s under load: a whole ptbxl run
def test_a_goat_run_through_the_engine_reloads_to_the_model_it_trained(tmp_path):
    import workbench
    from workbench.core.finished import Run

    out = tmp_path / "run"
    tiny = dict(epochs=1, train_size=8, val_size=8, batch_size=8, baselines=[], quiet=True)
    run = workbench.adapt("ptbxl", "lora", out=str(out), method_options={"init": "goat"}, **tiny)
    layers = lora.lora_layers(run.model)
    assert layers and all(isinstance(layer.base_layer, nn.Linear) for layer in layers.values())  # convs left out
    assert {layer.adapters["default"].kind for layer in layers.values()} == {"goat"}
    again = Run.load(out).model
    x = torch.randn(2, 12, 1000, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(again(x), run.model.eval()(x), rtol=0, atol=1e-6)
