"""LoRA options beyond PEFT's: plug-ins that keep them, RepLoRA's reparameterised factors, Flat-LoRA's objective."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from workbench.adaptation import lora
from workbench.adaptation.lora import flat

from workbench.core.errors import UserError
from workbench.core.method import PlanInputs
from workbench.core.registry import methods
from workbench.core.trainer import TrainSettings


class Net(nn.Module):
    """x (batch, 3, 12) → Conv1d (batch, 5, 12) → Linear over time (batch, 5, 7) → mean → Linear (batch, 4)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 5, 3, padding=1)
        self.fc = nn.Linear(12, 7)
        self.out = nn.Linear(7, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(F.gelu(self.conv(x)))).mean(dim=1))


def net() -> Net:
    torch.manual_seed(0)
    return Net().double()


def inputs() -> torch.Tensor:
    return torch.randn(6, 3, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


@pytest.mark.parametrize("option", [{"scaling": "rslora"}, {"init": "pissa"}, {"dora": True}])
def test_plain_lora_plugins_keep_their_init_scaling_and_dora(option):
    plugins = {"p": lora.PluginConfig(4, 8.0, kind="lora", **option), "q": lora.PluginConfig(2, 4.0, kind="lora")}
    model = lora.apply_plugins(net(), ["fc", "out"], plugins)
    for layer in lora.lora_layers(model).values():
        assert layer.adapters["p"] == plugins["p"] and layer.adapters["q"] == plugins["q"]
    if "dora" in option:
        assert set(model.fc.lora_magnitude_vector) == {"p"}
    if "init" in option:  # PiSSA's factors hold the top singular triplets of W
        layer = model.fc
        expected = torch.linalg.svdvals(net().fc.weight)[:4]
        torch.testing.assert_close(torch.linalg.svdvals(layer._lora_weight("p"))[:4], expected)


def randomize(model: nn.Module, seed: int = 2) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))


def replora_factors(layer: lora.LoraLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """RepLoRA's (A, B) written out, flattened to (r, in·K) and (out, r)."""
    mlp = layer.lora_reparam["default"]
    h, pa, pb = mlp.hidden.weight, mlp.A.weight, mlp.B.weight
    free_a, free_b = layer.lora_A["default"].weight.flatten(1), layer.lora_B["default"].weight.flatten(1)
    return pa @ F.gelu(h @ free_a), F.gelu(free_b @ h.T) @ pb.T


# -- RepLoRA ----------------------------------------------------------------------------------------------------


def test_replora_computes_w_x_plus_scale_b_a_x_of_its_mlp_factors_and_merges_them(tmp_path):
    base, x = net(), inputs()
    model = lora.apply(net(), targets=["conv", "fc"], rank=3, alpha=6.0, reparam="replora")
    torch.testing.assert_close(model(x), base(x), rtol=0, atol=0)  # B̂ = 0 gives B = 0: the identity at start
    parts = ("lora_A.default.weight", "lora_B.default.weight") + tuple(
        f"lora_reparam.default.{m}.weight" for m in ("hidden", "A", "B")
    )
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        f"{t}.{p}" for t in ("conv", "fc") for p in parts
    }
    assert sum(p.numel() for p in model.conv.lora_reparam.parameters()) == 3 * 3**2
    randomize(model)
    h = torch.randn(6, 5, 12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    a, b = replora_factors(model.fc)
    torch.testing.assert_close(model.fc(h), F.linear(h, base.fc.weight, base.fc.bias) + 2.0 * h @ a.T @ b.T)
    a, b = replora_factors(model.conv)
    delta = 2.0 * (b @ a).reshape(base.conv.weight.shape)
    torch.testing.assert_close(model.conv(x), F.conv1d(x, base.conv.weight + delta, base.conv.bias, padding=1))
    torch.testing.assert_close(model.conv.delta_weight(), delta, rtol=0, atol=1e-14)
    expected = model(x)
    assert (expected - base(x)).abs().max() > 1e-3  # the update changes the model
    lora.merge(model, unload=False)
    torch.testing.assert_close(model.conv.base_layer.weight, base.conv.weight + delta, rtol=0, atol=1e-14)
    torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-12)
    lora.unmerge(model)
    torch.testing.assert_close(model.conv.base_layer.weight, base.conv.weight, rtol=0, atol=1e-14)
    torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-12)
    lora.save_adapter(model, tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "adapter_config.json").exists()  # PEFT has no RepLoRA
    reloaded = net()
    lora.load_adapter(reloaded, tmp_path / "adapter", strict=True)
    assert reloaded._lora_configs["default"].reparam == "replora"
    torch.testing.assert_close(reloaded(x), expected, rtol=0, atol=0)


def test_replora_refuses_what_it_does_not_define_naming_the_field():
    with pytest.raises(UserError, match="reparam='replora' with init='pissa' is not defined"):
        lora.apply(net(), targets=["fc"], reparam="replora", init="pissa")
    with pytest.raises(UserError, match="reparam='replora' with dora=True is not defined"):
        lora.apply(net(), targets=["fc"], reparam="replora", dora=True)
    with pytest.raises(UserError, match="LoRA reparam must be one of"):
        lora.apply(net(), targets=["fc"], reparam="mlp")
    with pytest.raises(UserError, match="reparam='replora' is an option of plain LoRA adapters, not of hlora"):
        lora.PluginConfig(4, 8.0, 2, reparam="replora")
    with pytest.raises(UserError, match="option --reparam must be one of"):
        methods.get("lora")(reparam="mlp")


# -- Flat-LoRA --------------------------------------------------------------------------------------------------


def test_flat_lora_noise_is_regenerated_from_its_seed_scaled_per_row_and_is_the_one_the_forward_uses():
    x = inputs()
    model = lora.apply(net(), targets=["conv", "fc"], rank=2, alpha=2.0, objective="flat-lora")
    randomize(model)
    merged = lora.merge(copy.deepcopy(model))
    noise = flat.perturbations(model, seed=5, sigma=0.1)
    generator = torch.Generator().manual_seed(5)  # closed form: N(0, 1) draws in module order, scaled per row
    for name in ("conv", "fc"):
        weight = getattr(merged, name).weight
        std = 0.1 * weight.flatten(1).norm(dim=1) / weight[0].numel() ** 0.5
        draw = torch.randn(weight.shape, generator=generator, dtype=weight.dtype)
        torch.testing.assert_close(noise[name], draw * std.view((-1,) + (1,) * (weight.dim() - 1)))
        assert not noise[name].requires_grad
    with flat.perturbed(model, seed=5, sigma=0.1):
        out = model(x)
    with torch.no_grad():
        for name, epsilon in noise.items():
            getattr(merged, name).weight.add_(epsilon)
    torch.testing.assert_close(out, merged(x), rtol=0, atol=1e-12)
    assert all(layer.perturbation is None for layer in lora.lora_layers(model).values())  # nothing kept
    assert not torch.equal(flat.perturbations(model, seed=6, sigma=0.1)["fc"], noise["fc"])
    schedule = [flat.sigma_at(0.05, step, 10) for step in (0, 5, 10, 12)]
    assert schedule == pytest.approx([0.0, 0.025, 0.05, 0.05], rel=0, abs=1e-15)  # cosine-increasing, then σ
    assert lora.LoraConfig.from_dict(model._lora_configs["default"].to_dict(), "x").objective == "flat-lora"


class LossTask:
    """The one piece of a task Flat-LoRA's step calls: the mean squared output of the model on a batch."""

    def loss(self, model: nn.Module, batch: torch.Tensor, training: bool) -> torch.Tensor:
        return (model(batch) ** 2).mean()


def test_flat_lora_steps_train_only_the_factors_and_with_sigma_zero_equal_plain_lora():
    x, task = inputs(), LossTask()

    def grads(model: nn.Module) -> dict[str, torch.Tensor]:
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    def run(sigma: float, step: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        method = methods.get("lora")(rank=2, alpha=2.0, targets="conv,fc", head="frozen", objective="flat-lora",
                                     flat_sigma=sigma)  # fmt: skip
        model = method.prepare(net())
        randomize(model)
        settings = TrainSettings(epochs=2, batch_size=3, learning_rate=1e-3, seed=4)
        stage = method.plan(task, model, Data, PlanInputs(settings))[0]
        return stage.gradients(model, x, step), grads(model)

    class Data:
        train, val = list(range(6)), [0]

    plain = lora.apply(net(), targets=["conv", "fc"], rank=2, alpha=2.0, compute="weight")  # the method's default
    randomize(plain)
    task.loss(plain, x, True).backward()
    loss, gradients = run(0.0, 2)
    assert set(gradients) == {n for n, p in plain.named_parameters() if p.requires_grad}  # the factors alone
    assert loss == task.loss(plain, x, True).detach()
    for name, grad in grads(plain).items():
        torch.testing.assert_close(gradients[name], grad, rtol=0, atol=0)
    noisy, noisy_gradients = run(0.5, 2)
    assert set(noisy_gradients) == set(gradients) and noisy != loss
    assert run(0.5, 2)[0] == noisy and run(0.5, 3)[0] != noisy  # the step's seed, the same draw each time
    assert run(0.5, 0)[0] == loss  # σ_0 = 0 under the cosine-increasing schedule


def test_flat_lora_refusals_name_the_field():
    with pytest.raises(UserError, match="LoRA flat_sigma must be a number >= 0, got -0.1"):
        lora.apply(net(), targets=["fc"], objective="flat-lora", flat_sigma=-0.1)
    with pytest.raises(UserError, match="LoRA objective must be one of"):
        lora.apply(net(), targets=["fc"], objective="sam")
    with pytest.raises(UserError, match="objective='flat-lora' is an option of plain LoRA adapters, not of hlora"):
        lora.LoraConfig(targets=["fc"], experts=2, rank=4, objective="flat-lora")
    with pytest.raises(UserError, match="option --objective must be one of"):
        methods.get("lora")(objective="sam")
