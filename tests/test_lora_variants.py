"""LoRA's options rsLoRA, PiSSA and DoRA against HF PEFT (float64; PiSSA's init in float32, which PEFT requires),
and PiSSA's closed form."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
import workbench.models  # noqa: F401  (guards torchaudio before PEFT imports it)
from safetensors.torch import load_file
from torch import nn
from workbench.adaptation import lora

from workbench.core.errors import UserError
from workbench.core.options import resolve_options

import peft  # isort: skip

LINEARS = ["fc", "out"]
TARGETS = ["conv1d", "conv2d", *LINEARS]


class Net(nn.Module):
    """x (batch, 3, 12) → Conv1d → Conv2d over (channels, time) → Linear over time → mean → Linear (batch, 4)."""

    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(3, 5, 3, padding=1)  # (b, 5, 12)
        self.conv2d = nn.Conv2d(1, 2, (3, 3), padding=1)  # (b, 2, 5, 12)
        self.fc = nn.Linear(12, 7)
        self.out = nn.Linear(7, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.conv1d(x))
        h = F.gelu(self.conv2d(h[:, None])).mean(dim=1)  # (b, 5, 12)
        return self.out(F.gelu(self.fc(h)).mean(dim=1))


def net(dtype: torch.dtype = torch.float64) -> Net:
    torch.manual_seed(0)
    return Net().to(dtype)


def inputs(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(6, 3, 12, generator=torch.Generator().manual_seed(1), dtype=dtype)


def peft_model(model: nn.Module, targets=TARGETS, **config) -> peft.PeftModel:
    return peft.get_peft_model(model, peft.LoraConfig(target_modules=targets, **config))


def trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    return {n.removeprefix("base_model.model."): p for n, p in model.named_parameters() if p.requires_grad}


def randomize_and_copy(ours: nn.Module, *others: nn.Module, seed: int = 2) -> None:
    """Random A, B (std 0.3) and magnitudes (x (1 + 0.2 N)) into ``ours``, the same values into ``others``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainable(ours).items():
            noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
            p.copy_(p * (1 + 0.2 * noise) if "magnitude" in name else 0.3 * noise)
            for other in others:
                trainable(other)[name].copy_(p)


def gradients(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    (model(x) ** 2).sum().backward()
    return {n: p.grad.clone() for n, p in trainable(model).items()}


def assert_same(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-10) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=atol)


def assert_matches_peft(
    ours: nn.Module, theirs: peft.PeftModel, base: nn.Module, x: torch.Tensor, start_atol: float = 1e-12
) -> None:
    """Names and counts of trained parameters, identity at init (to ``start_atol``), outputs and gradients with the
    same factors, merged weights: ours equal PEFT's to 1e-10."""
    assert set(trainable(ours)) == set(trainable(theirs))
    assert sum(p.numel() for p in trainable(ours).values()) == sum(p.numel() for p in trainable(theirs).values()) > 0
    assert_same(ours(x), theirs(x))
    assert_same(ours(x), base(x), start_atol)
    randomize_and_copy(ours, theirs)
    assert (ours(x) - base(x)).abs().max() > 1e-2  # the factors change the model
    assert_same(ours(x), theirs(x))
    ours_grads, theirs_grads = gradients(ours, x), gradients(theirs, x)
    for name, grad in theirs_grads.items():
        assert grad.abs().max() > 0, name
        assert_same(ours_grads[name], grad)
    expected = ours(x)
    merged, theirs_merged = lora.merge(copy.deepcopy(ours)), copy.deepcopy(theirs).merge_and_unload()
    assert set(merged.state_dict()) == set(theirs_merged.state_dict()) == set(base.state_dict())
    for name, value in theirs_merged.state_dict().items():
        assert_same(merged.state_dict()[name], value)
    assert_same(merged(x), expected)


VARIANTS = {
    "rslora": ({"scaling": "rslora"}, {"use_rslora": True}),
    "dora": ({"dora": True}, {"use_dora": True}),
    "dora+rslora": ({"dora": True, "scaling": "rslora"}, {"use_dora": True, "use_rslora": True}),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_rslora_and_dora_equal_peft_on_linear_and_conv_layers(variant):
    ours_options, peft_options = VARIANTS[variant]
    base, x = net(), inputs()
    ours = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=4, alpha=6, **ours_options)
    theirs = peft_model(copy.deepcopy(base), r=4, lora_alpha=6, **peft_options)
    assert_matches_peft(ours, theirs, base, x)
    expected_scale = 6 / 2 if "rslora" in variant else 6 / 4
    assert ours.fc.scale == expected_scale == theirs.base_model.model.fc.scaling["default"]


def test_dora_computed_in_weight_space_and_with_dropout_equals_peft():
    base, x = net(), inputs()
    by_weight = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=4, alpha=6, dora=True, compute="weight")
    dropped = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=4, alpha=6, dora=True, dropout=0.4)
    theirs = peft_model(copy.deepcopy(base), r=4, lora_alpha=6, use_dora=True, lora_dropout=0.4)
    randomize_and_copy(theirs, by_weight, dropped)
    theirs.eval(), dropped.eval()
    assert_same(by_weight(x), theirs(x))  # (m / ||W + s B A||) ⊙ (W + s B A) as one weight
    theirs_grads = gradients(theirs, x)
    for name, grad in gradients(by_weight, x).items():
        assert_same(grad, theirs_grads[name])
    assert_same(dropped(x), theirs(x))
    theirs.train(), dropped.train()
    torch.manual_seed(3)
    train_theirs = theirs(x)
    torch.manual_seed(3)
    train_ours = dropped(x)
    assert (train_ours - dropped.eval()(x)).abs().max() > 1e-3  # dropout acts
    assert_same(train_ours, train_theirs)  # PEFT's (f - 1) W drop(x) + f s B A drop(x), the same masks


def test_dora_magnitude_starts_at_the_row_norms_and_merge_unmerge_round_trip():
    base, x = net(), inputs()
    ours = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=2, alpha=2, dora=True)
    assert_same(ours.fc.lora_magnitude_vector["default"].weight, base.fc.weight.norm(dim=1), 1e-14)
    assert ours.conv2d.lora_magnitude_vector["default"].weight.shape == (1, 2, 1, 1)  # PEFT's shape
    magnitude = ours.conv2d.lora_magnitude_vector["default"].weight
    assert_same(magnitude.flatten(), base.conv2d.weight.flatten(1).norm(dim=1))
    randomize_and_copy(ours)
    expected = ours(x)
    lora.merge(ours, unload=False)
    assert_same(ours(x), expected)
    for name in ("conv1d", "fc"):  # merged rows have the magnitudes as norms
        layer = getattr(ours, name)
        rows = layer.base_layer.weight.flatten(1).norm(dim=1)
        assert_same(rows, layer.lora_magnitude_vector["default"].weight.flatten())
    lora.unmerge(ours)
    for name in TARGETS:
        assert_same(getattr(ours, name).base_layer.weight, getattr(base, name).weight, 1e-12)
    assert_same(ours(x), expected)


@pytest.mark.parametrize("dora", [False, True])
def test_pissa_equals_peft_in_float32_then_in_float64(dora):
    base = net(torch.float32)
    ours = lora.apply(copy.deepcopy(base), targets=LINEARS, rank=3, alpha=6, init="pissa", dora=dora)
    theirs = peft_model(copy.deepcopy(base), LINEARS, r=3, lora_alpha=6, init_lora_weights="pissa", use_dora=dora)
    theirs_params = dict(theirs.base_model.model.named_parameters())
    assert set(dict(ours.named_parameters())) == set(theirs_params)
    for name, p in ours.named_parameters():  # factors, residual base weights (and magnitudes)
        assert_same(p, theirs_params[name], 1e-6)
    assert not torch.allclose(ours.fc.base_layer.weight, base.fc.weight, atol=1e-3)  # the residual replaced W
    base, ours, theirs = base.double(), ours.double(), theirs.double()
    assert_matches_peft(ours, theirs, base, inputs(), start_atol=1e-6)  # the residual was formed in float32


@pytest.mark.parametrize("scaling", ["standard", "rslora"])
def test_pissa_holds_the_top_singular_triplets_and_keeps_the_residual(scaling):
    base, x = net(), inputs()
    rank = 2
    ours = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=rank, alpha=3, init="pissa", scaling=scaling)
    assert_same(ours(x), base(x), 1e-12)  # W_res + s B A = W: the model is unchanged at start
    for name, layer in lora.lora_layers(ours).items():
        weight = getattr(base, name).weight.flatten(1)
        singular = torch.linalg.svdvals(weight)
        principal = layer.delta_weight().flatten(1)
        residual = layer.base_layer.weight.flatten(1)
        assert_same(residual + principal, weight, 1e-12)
        assert_same(torch.linalg.svdvals(principal)[:rank], singular[:rank], 1e-12)  # the top-r triplets
        assert_same(torch.linalg.svdvals(residual)[: len(singular) - rank], singular[rank:], 1e-12)  # the rest
        assert_same(principal.T @ residual, torch.zeros_like(principal.T @ residual), 1e-12)  # orthogonal parts
        a, b = layer.lora_A.weight.flatten(1), layer.lora_B.weight.flatten(1)
        assert_same(a @ a.T, b.T @ b, 1e-12)  # sqrt(S / scale) split evenly between the factors
    randomize_and_copy(ours)
    merged = lora.merge(copy.deepcopy(ours))
    for name, layer in lora.lora_layers(ours).items():  # merge gives W + scale · (B A − B₀ A₀)
        initial = layer.pissa_factors["default"]
        delta = layer.delta_weight() - layer._product("default", initial.A, initial.B)
        assert_same(getattr(merged, name).weight, getattr(base, name).weight + delta, 1e-12)
    lora.delete_adapter(ours, "default")  # puts W back
    for name in TARGETS:
        assert_same(getattr(ours, name).weight, getattr(base, name).weight, 1e-12)


def test_a_refused_pissa_apply_leaves_the_base_weights_as_they_were():
    base = net()
    model = copy.deepcopy(base)
    with pytest.raises(UserError, match="train pattern 'nothing.*'"):
        lora.apply(model, targets=TARGETS, rank=2, init="pissa", train=("nothing.*",))
    with pytest.raises(UserError, match=r"LoRA target 'out'.*rank 5 is too large for init='pissa'"):
        lora.apply(model, targets=TARGETS, rank=2, init="pissa", rank_pattern={"out": 5})  # out is (4, 7)
    assert not lora.lora_layers(model)
    for name, value in base.state_dict().items():  # W_res + s B₀ A₀: W up to rounding
        assert_same(model.state_dict()[name], value, 1e-15)


def test_dora_and_rslora_files_load_in_peft_and_back(tmp_path):
    base, x = net(), inputs()
    ours = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=4, alpha=6, dora=True, scaling="rslora")
    randomize_and_copy(ours)
    file = lora.save_adapter(ours, tmp_path / "ours")
    assert "base_model.model.fc.lora_magnitude_vector" in load_file(file)  # PEFT's file names
    written = json.loads((tmp_path / "ours" / "adapter_config.json").read_text())
    assert written["use_dora"] is True and written["use_rslora"] is True and written["init_lora_weights"] is True
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "ours")
    assert_same(theirs(x), ours(x))
    loaded = copy.deepcopy(base)
    report = lora.load_adapter(loaded, tmp_path / "ours", strict=True)
    assert len(report.matched) == 3 * len(TARGETS)
    assert torch.equal(loaded(x), ours(x))
    theirs.save_pretrained(tmp_path / "peft")  # and PEFT's file into layers applied by hand
    by_hand = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=4, alpha=6, dora=True, scaling="rslora")
    lora.load_adapter(by_hand, tmp_path / "peft", strict=True)
    assert_same(by_hand(x), ours(x))


def test_pissa_files_rebuild_the_residual_from_the_original_base(tmp_path):
    base, x = net(torch.float32), inputs(torch.float32)
    ours = lora.apply(copy.deepcopy(base), targets=LINEARS, rank=3, alpha=6, init="pissa")
    randomize_and_copy(ours)
    lora.save_adapter(ours, tmp_path / "linear")
    assert json.loads((tmp_path / "linear" / "adapter_config.json").read_text())["init_lora_weights"] == "pissa"
    loaded = copy.deepcopy(base)  # the original W, not the residual: the same SVD gives the same residual
    lora.load_adapter(loaded, tmp_path / "linear", strict=True)
    assert torch.equal(loaded(x), ours(x))
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "linear")  # PEFT does the same
    assert_same(theirs(x), ours(x), 1e-5)
    base, x = net(), inputs()  # convolutions: the workbench's PiSSA alone
    ours = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=2, init="pissa")
    randomize_and_copy(ours)
    lora.save_adapter(ours, tmp_path / "conv")
    assert not (tmp_path / "conv" / "adapter_config.json").exists()
    assert "PiSSA" in lora.peft_config_of(ours)[1]
    loaded = copy.deepcopy(base)
    lora.load_adapter(loaded, tmp_path / "conv", strict=True)
    assert_same(loaded(x), ours(x), 1e-12)


def test_bad_options_are_user_errors_naming_the_field(tmp_path):
    for field, value in (("init", "svd"), ("scaling", "sqrt"), ("dora", "yes")):
        with pytest.raises(UserError, match=f"LoRA {field} must be"):
            lora.LoraConfig(**{field: value})
    with pytest.raises(UserError, match=r"dora=True is an option of plain LoRA adapters, not of hlora"):
        lora.AdapterConfig(4, 8.0, experts=2, dora=True)
    with pytest.raises(UserError, match=r"bad.json: bad LoRA configuration \(LoRA init must be one of"):
        lora.LoraConfig.from_dict({"init": "gaussian"}, "bad.json")
    assert lora.LoraConfig.from_dict({"rank": 2}, "old.json").init == "kaiming"  # files written before the options
    with pytest.raises(UserError, match="option --lora-scaling must be one of"):
        resolve_options("lora", lora.LoRA.options, {"lora_scaling": "sqrt"})
    options = {o.name: o for o in lora.LoRA.options}
    assert options["init"].choices == lora.INITS and options["lora_scaling"].choices == lora.SCALINGS
    assert options["dora"].type is bool and options["dora"].default is False


# -- LoRA-One: closed form --------------------------------------------------------------------------------------


def mse(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def batches(sizes=(4, 2, 3)) -> list[tuple[tuple[torch.Tensor, torch.Tensor], int]]:
    generator = torch.Generator().manual_seed(5)
    out = []
    for n in sizes:
        x = torch.randn(n, 3, 12, generator=generator, dtype=torch.float64)
        out.append(((x, torch.randn(n, 4, generator=generator, dtype=torch.float64)), n))
    return out


@pytest.mark.parametrize("dora", [False, True])
def test_lora_one_factors_are_the_top_singular_subspaces_of_the_one_step_gradient(tmp_path, dora):
    base, rank, gamma = net(), 2, 4.0
    full = copy.deepcopy(base)  # the reference: one full fine-tuning gradient over all 9 samples at once
    x = torch.cat([b[0][0] for b in batches()])
    y = torch.cat([b[0][1] for b in batches()])
    reference = dict(zip(TARGETS, torch.autograd.grad(mse(full, (x, y)), [getattr(full, n).weight for n in TARGETS])))
    ours = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=rank, alpha=3, init="lora-one", scaling="rslora",
                      dora=dora)  # fmt: skip
    gradients = lora.init_lora_one(ours, mse, batches(), gamma=gamma)  # three chunks, weighed by their samples
    for name, layer in lora.lora_layers(ours).items():
        assert_same(gradients[name], reference[name], 1e-12)
        u, singular, vh = torch.linalg.svd(-reference[name].flatten(1), full_matrices=False)
        b, a = layer.lora_B.weight.flatten(1), layer.lora_A.weight.flatten(1)
        left, right = u[:, :rank], vh[:rank].T
        assert_same(b @ torch.linalg.pinv(b), left @ left.T, 1e-10)  # span(B) = top-r left singular subspace of −G
        assert_same(torch.linalg.pinv(a) @ a, right @ right.T, 1e-10)  # span(Aᵀ) = top-r right singular subspace
        step = layer.scale / (gamma * singular[0])  # scale · B A = −scale / (γ s₁) · G_r: one rank-r gradient step
        best = (left * singular[:rank]) @ right.T
        assert_same(layer._lora_weight("default").flatten(1), step * best, 1e-12)
        assert torch.equal(layer.base_layer.weight, getattr(base, name).weight)  # W is left as it is
        assert not layer.base_layer.weight.requires_grad and layer.base_layer.weight.grad is None
        if dora:
            rows = (layer.base_layer.weight + layer._lora_weight("default")).flatten(1).norm(dim=1)
            assert_same(layer.lora_magnitude_vector["default"].weight.flatten(), rows, 1e-12)
    stepped = copy.deepcopy(base)  # the adapted model is the base one rank-r gradient step away
    with torch.no_grad():
        for name, layer in lora.lora_layers(ours).items():
            getattr(stepped, name).weight.add_(layer._lora_weight("default"))
    assert_same(ours(x), stepped(x), 1e-12)
    assert (ours(x) - base(x)).abs().max() > 1e-4
    lora.save_adapter(ours, tmp_path / "one")  # W unchanged: PEFT loads it as a plain LoRA (DoRA) adapter
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "one")
    assert_same(theirs(x), ours(x))


def test_lora_one_refuses_other_inits_and_layers_off_the_loss_path():
    base = net()
    with pytest.raises(UserError, match="init='lora-one'; 'default' is not one"):
        lora.init_lora_one(lora.apply(copy.deepcopy(base), targets=TARGETS, rank=2), mse, batches())
    model = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=2, init="lora-one")
    before = {n: p.clone() for n, p in trainable(model).items()}

    def head_only(m, batch):  # conv1d, conv2d and fc do not enter this loss
        return (m.out(batch[0][:, 0, :7]) ** 2).mean()

    with pytest.raises(UserError, match=r"LoRA-One cannot initialise conv1d: the loss does not depend on its weight"):
        lora.init_lora_one(model, head_only, batches())
    for name, p in trainable(model).items():  # nothing changed, out included
        assert torch.equal(p, before[name]), name


@pytest.mark.slow  # reading the shipped PTB-XL cut takes ~8 s
@pytest.mark.parametrize("method_name", ["lora", "htuning"])
def test_a_method_sets_lora_one_from_the_task_loss_over_the_training_samples(method_name, monkeypatch):
    from workbench.adaptation.lora import method as lora_method

    from workbench.core.registry import methods, tasks

    task = tasks.get("ptbxl")()
    task.progress = False
    base = task.load_model(None)  # float32, as the task's samples
    data, _ = task.prepare(base, task.read(None, 0), 8, 4, 0)
    options = {"targets": "conv"} if method_name == "lora" else {}
    method = methods.get(method_name)(rank=2, init="lora-one", gamma=4.0, **options)
    model = method.prepare(copy.deepcopy(base))
    monkeypatch.setattr(lora_method, "GRADIENT_CHUNK", 3)  # 8 samples in chunks of 3, 3, 2
    method.setup(task, model, data, 0)
    layers = lora.lora_layers(model)
    full = copy.deepcopy(base).eval()  # the reference: the mean loss over all 8 samples in one batch
    weights = [full.get_submodule(name).weight for name in layers]
    reference = torch.autograd.grad(task.loss(full, task.collate(data.train, torch.device("cpu")), False), weights)
    for (name, layer), gradient in zip(layers.items(), reference):
        u, singular, vh = torch.linalg.svd(-gradient.flatten(1), full_matrices=False)
        best = (u[:, :2] * singular[:2]) @ vh[:2]
        expected = layer.scale / (4.0 * singular[0]) * best
        torch.testing.assert_close(
            layer._lora_weight("default").flatten(1), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item()
        )
        assert layer._lora_weight("default").abs().max() > 0, name


# -- LIFT's principal weights: closed form ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(9, 7), (4, 3, 5)])
def test_lift_mask_is_the_top_entries_of_the_rank_r_approximation(shape):
    import numpy as np
    from workbench.adaptation.lift import lora_budget, principal_mask

    weight = torch.randn(shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    rank = 2
    count = lora_budget(weight, rank)
    assert count == min((shape[0] + weight[0].numel()) * rank, weight.numel())
    mask = principal_mask(weight, rank, count)
    assert mask.shape == weight.shape and mask.dtype == torch.bool and int(mask.sum()) == count
    u, s, vh = np.linalg.svd(weight.flatten(1).numpy(), full_matrices=False)  # an independent rank-r approximation
    approximation = (u[:, :rank] * s[:rank]) @ vh[:rank]
    expected = set(np.argsort(-np.abs(approximation).ravel())[:count].tolist())
    assert set(torch.nonzero(mask.flatten()).flatten().tolist()) == expected
    by_magnitude = set(weight.abs().flatten().topk(count).indices.tolist())
    assert by_magnitude != expected  # principal weights are not the largest entries of W itself


def test_lift_mask_refuses_bad_rank_and_count():
    from workbench.adaptation.lift import principal_mask

    weight = torch.randn(4, 6)
    for rank in (0, 5, 1.5):
        with pytest.raises(UserError, match=r"LIFT rank must be an integer in 1..4 for a \(4, 6\) weight"):
            principal_mask(weight, rank, 3)
    for count in (0, 25):
        with pytest.raises(UserError, match=r"LIFT count must be an integer in 1..24"):
            principal_mask(weight, 2, count)


def test_lift_trains_only_the_principal_entries_and_a_new_mask_drops_the_moments_that_left():
    from workbench.adaptation import lift

    base = net()
    model = lift.apply(copy.deepcopy(base), targets=TARGETS, rank=2, budget_rank=1)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {f"{t}.weight" for t in TARGETS}
    for name in TARGETS:
        weight = getattr(base, name).weight
        assert torch.equal(getattr(model, name).lift_mask, lift.principal_mask(weight, 2, lift.lora_budget(weight, 1)))
    assert set(model.state_dict()) == set(base.state_dict())  # masks are not saved with the model
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)

    def steps(n: int) -> None:
        for batch, _ in batches()[:n]:
            optimizer.zero_grad()
            mse(model, batch).backward()
            optimizer.step()

    def moved_outside_masks(before: dict[str, torch.Tensor]) -> list[str]:
        return [n for n in TARGETS if (getattr(model, n).weight != before[n])[~getattr(model, n).lift_mask].any()]

    steps(3)
    assert not moved_outside_masks({n: getattr(base, n).weight for n in TARGETS})
    assert all((getattr(model, n).weight != getattr(base, n).weight).any() for n in TARGETS)
    for name, value in base.state_dict().items():
        if not name.endswith("weight") or name.split(".")[0] not in TARGETS:
            assert torch.equal(model.state_dict()[name], value), name
    with torch.no_grad():  # a large rank-1 change moves the principal weights elsewhere
        generator = torch.Generator().manual_seed(9)
        model.fc.weight.add_(
            3 * torch.outer(*(torch.randn(n, generator=generator, dtype=torch.float64) for n in (7, 12)))
        )
    old_mask, old_moment = model.fc.lift_mask.clone(), optimizer.state[model.fc.weight]["exp_avg"].clone()
    kept = lift.update_masks(model, optimizer)
    assert kept["fc"] < 1 and (old_moment[old_mask & ~model.fc.lift_mask] != 0).any()
    assert torch.equal(model.fc.lift_mask, lift.principal_mask(model.fc.weight, 2, int(old_mask.sum())))
    moment = optimizer.state[model.fc.weight]["exp_avg"]
    assert torch.equal(moment, old_moment * model.fc.lift_mask)  # the moments of entries that left are zero
    before = {n: getattr(model, n).weight.detach().clone() for n in TARGETS}
    steps(1)
    assert not moved_outside_masks(before)  # entries that left the mask stay where they are
    lift.remove(model)
    assert not hasattr(model, lift.STATE) and not hasattr(model.fc, "lift_mask")
    mse(model, batches()[0][0]).backward()
    assert (model.fc.weight.grad != 0).all()  # no mask on the gradient any more
    capped = lift.apply(copy.deepcopy(base), targets=TARGETS, rank=3)  # conv2d's (2, 1, 3, 3) weight has rank 2
    rank, count, _ = getattr(capped, lift.STATE)["conv2d"]
    assert rank == 2 and torch.equal(capped.conv2d.lift_mask, lift.principal_mask(capped.conv2d.weight, 2, count))
    with pytest.raises(UserError, match="LIFT rank must be a positive integer"):
        lift.apply(copy.deepcopy(base), targets=TARGETS, rank=0)
    with pytest.raises(UserError, match="LIFT budget_rank must be a positive integer"):
        lift.apply(copy.deepcopy(base), targets=TARGETS, rank=1, budget_rank=0)
