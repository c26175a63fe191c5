"""workbench.adaptation.lora against HF PEFT on one small float64 model (Linear, Conv1d, Conv2d, fused qkv)."""

from __future__ import annotations

import copy
import json
import logging
import math

import peft
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.utils import parametrize
from workbench.adaptation import lora

from workbench.core.errors import UserError
from workbench.core.model import ModelSpec
from workbench.core.testing import assert_only_trainable_change

TARGETS = ["conv1d", "conv2d", "attention.qkv", "attention.proj"]


class Attention(nn.Module):
    """One-head self-attention with a fused ``qkv = Linear(d, 3d)``."""

    def __init__(self, width: int):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        return self.proj(F.scaled_dot_product_attention(q, k, v))


class Small(nn.Module):
    """x (batch, 3, 16) → Conv1d → Conv2d over (channels, time) → tokens → attention → mean → head (batch, 3)."""

    workbench_spec = ModelSpec(
        family="test",
        head="head",
        adapter_target_groups={"conv": ("conv1d", "conv2d"), "attention": ("attention.*",)},
        embedding="features",
    )

    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(3, 6, 5, stride=2, padding=2)  # (b, 6, 8)
        self.conv2d = nn.Conv2d(1, 4, (3, 3), stride=(1, 2), padding=(1, 1))  # (b, 4, 6, 4)
        self.attention = Attention(6)
        self.norm = nn.LayerNorm(6)
        self.head = nn.Linear(6, 3)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.conv1d(x))
        h = F.gelu(self.conv2d(h[:, None])).mean(dim=1).transpose(1, 2)  # tokens (b, 4, 6)
        h = h + self.attention(self.norm(h))
        return h.mean(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Plain(nn.Module):
    """The same layers without any declaration (no workbench_spec)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)

    def forward(self, x):
        return self.body(x)


def small(seed: int = 0) -> Small:
    torch.manual_seed(seed)
    return Small().double()


def inputs(n: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def randomize(params, seed: int = 2, std: float = 0.3) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.copy_(std * torch.randn(p.shape, generator=generator, dtype=p.dtype))


def peft_model(model: nn.Module, **config) -> peft.PeftModel:
    config.setdefault("target_modules", TARGETS)
    return peft.get_peft_model(model, peft.LoraConfig(**config))


def copy_factors_into_peft(ours: nn.Module, theirs: peft.PeftModel) -> None:
    """Our A/B into PEFT's ``<module>.lora_A.default.weight`` (PEFT's names, with its adapter name)."""
    theirs_params = dict(theirs.base_model.model.named_parameters())
    with torch.no_grad():
        for name, layer in lora.lora_layers(ours).items():
            theirs_params[f"{name}.lora_A.default.weight"].copy_(layer.lora_A.weight)
            theirs_params[f"{name}.lora_B.default.weight"].copy_(layer.lora_B.weight)


def trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# -- against PEFT ---------------------------------------------------------------------------------


def test_trainable_parameter_count_and_names_match_peft():
    ours = lora.apply(small(), targets=TARGETS, rank=4, alpha=8)
    theirs = peft_model(small(), r=4, lora_alpha=8)
    assert trainable(ours) == trainable(theirs) > 0
    ours_names = {n for n, p in ours.named_parameters() if p.requires_grad}
    theirs_names = {n for n, p in theirs.base_model.model.named_parameters() if p.requires_grad}
    assert ours_names == theirs_names  # PEFT's names, adapter name included (lora_A.default.weight)
    assert "conv1d.base_layer.weight" in dict(ours.named_parameters())
    assert ours.conv2d.lora_A.weight.shape == (4, 1, 3, 3) and ours.conv2d.lora_B.weight.shape == (4, 4, 1, 1)
    assert ours.attention.qkv.lora_B.weight.shape == (18, 4)


def test_outputs_match_peft_at_init_and_with_the_same_factors():
    x = inputs()
    base = small()
    ours = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=4, alpha=8)
    theirs = peft_model(copy.deepcopy(base), r=4, lora_alpha=8)
    assert torch.equal(ours(x), base(x))  # B = 0: identity at start
    assert torch.equal(theirs(x), base(x))
    randomize(lora.adapter_parameters(ours))
    copy_factors_into_peft(ours, theirs)
    assert (ours(x) - base(x)).abs().max() > 1e-3  # the factors really change the model
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-12)


def test_merged_weights_match_peft_and_merge_gives_the_original_classes():
    x = inputs()
    base = small()
    ours = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=4, alpha=8)
    theirs = peft_model(copy.deepcopy(base), r=4, lora_alpha=8)
    randomize(lora.adapter_parameters(ours))
    copy_factors_into_peft(ours, theirs)
    expected = ours(x)
    merged = lora.merge(ours)
    theirs_merged = theirs.merge_and_unload()
    assert type(merged.conv2d) is nn.Conv2d and type(merged.attention.qkv) is nn.Linear
    assert set(merged.state_dict()) == set(base.state_dict()) == set(theirs_merged.state_dict())
    for name, value in theirs_merged.state_dict().items():
        torch.testing.assert_close(merged.state_dict()[name], value, rtol=0, atol=1e-10)
    assert not torch.equal(merged.conv2d.weight, base.conv2d.weight)
    torch.testing.assert_close(merged(x), expected, rtol=0, atol=1e-12)
    assert not hasattr(merged, "_lora_configs") and not lora.lora_layers(merged)


def test_dropout_acts_on_the_adapter_path_only():
    x = inputs()
    base = small()
    ours = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=4, alpha=8, dropout=0.5)
    theirs = peft_model(copy.deepcopy(base), r=4, lora_alpha=8, lora_dropout=0.5)
    base.train(), ours.train(), theirs.train()
    torch.manual_seed(3)
    assert torch.equal(ours(x), base(x))  # B = 0: with dropout on, the base path is untouched
    randomize(lora.adapter_parameters(ours))
    copy_factors_into_peft(ours, theirs)
    torch.manual_seed(3)
    train_ours = ours(x)
    torch.manual_seed(3)
    train_theirs = theirs(x)
    torch.testing.assert_close(train_ours, train_theirs, rtol=0, atol=1e-12)  # the same masks in the same places
    ours.eval(), theirs.eval()
    assert (train_ours - ours(x)).abs().max() > 1e-3  # dropout does act in training
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-12)
    # one layer by hand: base(x) + scale · B A (mask ⊙ x) / (1 − p)
    layer = ours.attention.proj.train()
    h = torch.randn(4, 6, dtype=torch.float64)
    torch.manual_seed(4)
    out = layer(h)
    torch.manual_seed(4)
    kept = F.dropout(torch.ones_like(h), 0.5)
    expected = layer.base_layer(h) + layer.scale * (h * kept) @ layer.lora_A.weight.T @ layer.lora_B.weight.T
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_save_load_round_trip_and_peft_reads_the_folder(tmp_path):
    x = inputs()
    base = small()
    ours = lora.apply(copy.deepcopy(base), rank=4, alpha=8, rank_pattern={"attention.qkv": 2}, train=("head.*",))
    randomize([p for p in ours.parameters() if p.requires_grad])
    file = lora.save_adapter(ours, tmp_path / "adapter")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert "base_model.model.attention.qkv.lora_A.weight" in load_file(file)  # PEFT's names
    assert "base_model.model.head.weight" in load_file(file)
    loaded = copy.deepcopy(base)
    report = lora.load_adapter(loaded, tmp_path / "adapter")
    assert not report.missing and not report.unexpected and len(report.matched) == 2 * 4 + 2
    assert loaded.attention.qkv.rank == 2
    assert torch.equal(loaded(x), ours(x))
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter")
    torch.testing.assert_close(theirs(x), ours(x), rtol=0, atol=1e-12)
    assert (ours(x) - base(x)).abs().max() > 1e-3


def test_load_reports_unexpected_and_missing_tensors(tmp_path, caplog):
    x = inputs()
    ours = lora.apply(small(), rank=4, alpha=8)
    randomize(lora.adapter_parameters(ours))
    file = lora.save_adapter(ours, tmp_path / "adapter")
    tensors = load_file(file)
    tensors["base_model.model.extra.lora_A.weight"] = torch.zeros(2, 2)
    del tensors["base_model.model.conv1d.lora_B.weight"]
    with open(file, "rb") as handle:  # keep the metadata (the config), change the tensors
        metadata = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))["__metadata__"]
    save_file(tensors, str(file), metadata=metadata)
    loaded = small()
    with caplog.at_level(logging.INFO):
        report = lora.load_adapter(loaded, tmp_path / "adapter")
    assert report.unexpected == ("extra.lora_A.weight",) and report.missing == ("conv1d.lora_B.weight",)
    assert "unexpected 1" in caplog.text and "missing 1" in caplog.text
    assert torch.equal(loaded.conv1d.lora_B.weight, torch.zeros_like(loaded.conv1d.lora_B.weight))
    assert torch.equal(loaded.attention.qkv.lora_B.weight, ours.attention.qkv.lora_B.weight)
    with pytest.raises(UserError, match="unexpected 1"):
        lora.load_adapter(small(), file, strict=True)
    assert (loaded(x) - ours(x)).abs().max() > 0


def test_load_with_zero_matched_tensors_is_refused(tmp_path):
    lora.save_adapter(lora.apply(small(), targets=["conv"], rank=4), tmp_path / "conv")
    other = lora.apply(small(), targets=["attention"], rank=4)
    with pytest.raises(UserError, match=r"conv/adapter_model\.safetensors: none of its"):
        lora.load_adapter(other, tmp_path / "conv")
    with pytest.raises(UserError, match="expected shape"):
        lora.load_adapter(lora.apply(small(), targets=["conv"], rank=2), tmp_path / "conv")
    peft_model(small(), r=4).save_pretrained(tmp_path / "peft")
    with pytest.raises(UserError, match="apply LoRA with its targets"):  # a PEFT file has no workbench config
        lora.load_adapter(small(), tmp_path / "peft")


def test_a_peft_adapter_loads_into_layers_applied_by_hand(tmp_path):
    x = inputs()
    theirs = peft_model(small(), r=4, lora_alpha=8)
    randomize([p for p in theirs.parameters() if p.requires_grad])
    theirs.save_pretrained(tmp_path / "peft")
    ours = lora.apply(small(), targets=TARGETS, rank=4, alpha=8)
    report = lora.load_adapter(ours, tmp_path / "peft", strict=True)
    assert len(report.matched) == 8
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-12)


# -- merge, unmerge, ranks ------------------------------------------------------------------------


def test_unmerge_restores_the_base_weights():
    x = inputs()
    base = small()
    model = lora.apply(copy.deepcopy(base), rank=4, alpha=8)
    randomize(lora.adapter_parameters(model))
    adapted = model(x)
    lora.merge(model, unload=False)
    assert all(layer.merged for layer in lora.lora_layers(model).values())
    assert not torch.equal(model.conv1d.base_layer.weight, base.conv1d.weight)
    torch.testing.assert_close(model(x), adapted, rtol=0, atol=1e-12)
    lora.unmerge(model)
    for name, layer in lora.lora_layers(model).items():
        torch.testing.assert_close(layer.base_layer.weight, base.get_submodule(name).weight, rtol=0, atol=1e-15)
    torch.testing.assert_close(model(x), adapted, rtol=0, atol=1e-12)


def test_merge_is_exact_for_dilated_and_circular_convolutions():
    """Beyond PEFT (whose conv A drops dilation and padding mode): A keeps them, so merging stays exact."""
    model = nn.Sequential(
        nn.Conv1d(2, 5, 3, dilation=2, padding=2, padding_mode="circular"), nn.Conv2d(5, 3, 3, padding="same")
    ).double()

    def run(m):
        return m[1](m[0](x)[:, :, None].expand(-1, -1, 4, -1))

    x = torch.randn(2, 2, 11, dtype=torch.float64)
    lora.apply(model, targets=["0", "1"], rank=2)
    randomize(lora.adapter_parameters(model))
    expected = run(model)
    assert lora.peft_config_of(model)[0] is None  # PEFT could not rebuild these layers
    torch.testing.assert_close(run(lora.merge(model)), expected, rtol=0, atol=1e-12)


def test_weight_compute_is_the_same_function_with_the_same_gradients():
    x, y = inputs(), torch.tensor([0, 1, 2, 0, 1])
    base = small()
    by_input = lora.apply(copy.deepcopy(base), rank=4, alpha=8, train=("head.*",))
    by_weight = lora.apply(copy.deepcopy(base), rank=4, alpha=8, train=("head.*",), compute="weight")
    randomize([p for p in by_input.parameters() if p.requires_grad])
    randomize([p for p in by_weight.parameters() if p.requires_grad])
    assert (by_input(x) - base(x)).abs().max() > 1e-3
    torch.testing.assert_close(by_weight(x), by_input(x), rtol=0, atol=1e-12)
    loss_input, loss_weight = F.cross_entropy(by_input(x), y), F.cross_entropy(by_weight(x), y)
    params_input = [p for p in by_input.parameters() if p.requires_grad]
    params_weight = [p for p in by_weight.parameters() if p.requires_grad]
    for g_input, g_weight in zip(
        torch.autograd.grad(loss_input, params_input), torch.autograd.grad(loss_weight, params_weight)
    ):
        torch.testing.assert_close(g_weight, g_input, rtol=0, atol=1e-12)
    # one op: the stock layer's, with W + ΔW (no adapter activations)
    layer = by_weight.conv1d
    expected = F.conv1d(x, layer.base_layer.weight + layer.delta_weight(), layer.base_layer.bias, stride=2, padding=2)
    assert torch.equal(layer(x), expected)
    with pytest.raises(UserError, match="cannot be computed in weight space"):
        lora.apply(small(), targets=["attention"], rank=4, experts=2, compute="weight")


def test_weight_compute_falls_back_to_the_input_way_while_dropout_is_active():
    x = inputs()
    by_input = lora.apply(small(), rank=4, dropout=0.5)
    by_weight = lora.apply(small(), rank=4, dropout=0.5, compute="weight")
    randomize(lora.adapter_parameters(by_input))
    randomize(lora.adapter_parameters(by_weight))
    by_input.train(), by_weight.train()
    torch.manual_seed(5)
    train_input = by_input(x)
    torch.manual_seed(5)
    torch.testing.assert_close(by_weight(x), train_input, rtol=0, atol=1e-12)
    by_input.eval(), by_weight.eval()
    assert (train_input - by_input(x)).abs().max() > 1e-3
    torch.testing.assert_close(by_weight(x), by_input(x), rtol=0, atol=1e-12)


def test_rank_per_target_and_scale():
    model = lora.apply(small(), rank=4, alpha=8, rank_pattern={"attention.q*": 2, "attention.*": 1, "conv2d": 3})
    ranks = {name: layer.rank for name, layer in lora.lora_layers(model).items()}
    assert ranks == {"conv1d": 4, "conv2d": 3, "attention.qkv": 2, "attention.proj": 1}  # first matching pattern
    assert model.attention.qkv.scale == 8 / 2 and model.conv1d.scale == 8 / 4
    assert model.conv2d.lora_A.weight.shape == (3, 1, 3, 3)


def test_conv_rank_rule_values_checked_by_hand():
    # rank r adapter: r·(in·K + out) values; the weight: out·in·K; r = largest power of 2 that fits (at least 1)
    assert lora.conv_rule_rank(1, 8, 15) == 4  # LaBraM conv1 (1, 15): 120 vs 23r → 4 (92), not 8 (184)
    assert lora.conv_rule_rank(8, 8, 3) == 4  # LaBraM conv2/3 (1, 3): 192 vs 32r → 4 (128), not 8 (256)
    assert lora.conv_rule_rank(12, 32, 7) == 16  # ECG stem: 2688 vs 116r → 16 (1856), not 32 (3712)
    assert lora.conv_rule_rank(64, 64, 3) == 32  # 12288 vs 256r → 32 (8192), not 64 (16384)
    assert lora.conv_rule_rank(1, 1, 1) == 1  # no adapter fits: the smallest one
    model = lora.apply(small(), rank=8, conv_rank="rule")
    ranks = {name: layer.rank for name, layer in lora.lora_layers(model).items()}
    # conv1d (3→6, K=5): 90 vs 21r → 4; conv2d (1→4, K=9): 36 vs 13r → 2; linears keep rank 8
    assert ranks == {"conv1d": 4, "conv2d": 2, "attention.qkv": 8, "attention.proj": 8}
    for layer in (model.conv1d, model.conv2d):  # the adapter fits, one of twice the rank would not
        adapter = layer.lora_A.weight.numel() + layer.lora_B.weight.numel()
        assert adapter <= layer.base_layer.weight.numel() < 2 * adapter
    assert json.loads(json.dumps(lora.peft_config_of(model)[0]))["rank_pattern"] == {"^conv1d": 4, "^conv2d": 2}


# -- targets, training, refusals ------------------------------------------------------------------


def test_targets_are_groups_or_patterns_and_bad_ones_are_refused():
    assert list(lora.lora_layers(lora.apply(small()))) == ["conv1d", "conv2d", "attention.qkv", "attention.proj"]
    assert list(lora.lora_layers(lora.apply(small(), targets=["conv", "*.qkv"]))) == [
        "conv1d",
        "conv2d",
        "attention.qkv",
    ]
    assert list(lora.lora_layers(lora.apply(small(), targets="head"))) == ["head"]  # a pattern: the module name
    with pytest.raises(UserError, match="'nothing' selects no"):
        lora.apply(small(), targets=["conv", "nothing"])
    with pytest.raises(UserError, match="declares no LoRA target groups; name the layers"):
        lora.apply(Plain())
    assert list(lora.lora_layers(lora.apply(Plain(), targets=["body"]))) == ["body"]
    with pytest.raises(UserError, match="already carries LoRA layers"):
        lora.apply(lora.apply(small()))
    with pytest.raises(UserError, match="grouped convolution"):
        lora.apply(nn.Sequential(nn.Conv1d(4, 4, 3, groups=2)), targets=["0"])
    shared = nn.Linear(3, 3)
    with pytest.raises(UserError, match="several names"):
        lora.apply(nn.Sequential(shared, shared), targets=["0"])
    model = small()
    with pytest.raises(UserError, match="train pattern 'classifier.\\*' matches no parameter"):
        lora.apply(model, train=("classifier.*",))
    assert not lora.lora_layers(model) and all(p.requires_grad for p in model.parameters())  # left as it was
    with pytest.raises(UserError, match="rank must be a positive integer"):
        lora.apply(small(), rank=0)


def test_only_adapters_and_train_patterns_train():
    x, y = inputs(), torch.tensor([0, 1, 2, 0, 1])
    model = lora.apply(small(), rank=4, train=("head.*", "*.bias"))
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {"head.weight", "head.bias", "norm.bias", "conv1d.base_layer.bias"} <= names
    assert not {n for n in names if n.endswith("base_layer.weight")} and "norm.weight" not in names
    trained = [p for p in model.named_parameters() if p[1].requires_grad]
    assert [id(p) for p in lora.adapter_state(model).values()] == [id(p) for _, p in trained]
    assert list(lora.adapter_state(model))[1] == "conv1d.lora_A.weight"  # file names: no adapter name, as PEFT's
    assert lora.peft_config_of(model)[0] is None  # single biases are no PEFT modules_to_save
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)

    def step(m):
        optimizer.zero_grad()
        F.cross_entropy(m(x), y).backward()
        optimizer.step()

    step(model)  # B = 0: the first step moves B only
    assert_only_trainable_change(model, step)


class DoubleWeight(nn.Module):
    """A foreign parametrization: the layer uses 2·W."""

    def forward(self, weight):
        return 2 * weight


def test_a_foreign_parametrization_is_adapted_around_and_merged_without_being_removed():
    x = inputs()
    model = small()
    parametrize.register_parametrization(model.head, "weight", DoubleWeight())  # e.g. braindecode's max-norm
    before = model(x)
    lora.apply(model, rank=4, train=("head.*",))  # never refused for using a parametrization
    assert torch.equal(model(x), before)
    assert [n for n, p in model.named_parameters() if p.requires_grad][-2:] == [
        "head.bias",
        "head.parametrizations.weight.original",
    ]
    randomize([p for p in model.parameters() if p.requires_grad])
    expected = model(x)
    merged = lora.merge(model)
    assert isinstance(merged.head.parametrizations.weight[0], DoubleWeight)  # still there, still in use
    torch.testing.assert_close(merged.head.weight, 2 * merged.head.parametrizations.weight.original)
    torch.testing.assert_close(merged(x), expected, rtol=0, atol=1e-12)


def test_a_target_with_a_foreign_parametrization_runs_but_is_not_merged():
    model = small()
    parametrize.register_parametrization(model.attention.proj, "weight", DoubleWeight())
    lora.apply(model, rank=4)
    randomize(lora.adapter_parameters(model))
    h = torch.randn(3, 6, dtype=torch.float64)
    proj = model.attention.proj  # its weight is 2·W: y = 2W h + b + scale · B A h
    expected = h @ (2 * proj.base_layer.parametrizations.weight.original).T + proj.base_layer.bias
    expected = expected + proj.scale * h @ (proj.lora_B.weight @ proj.lora_A.weight).T
    torch.testing.assert_close(proj(h), expected, rtol=0, atol=1e-12)
    by_weight = small()  # the same base weights; compute="weight" sees the stock class under the parametrization
    parametrize.register_parametrization(by_weight.attention.proj, "weight", DoubleWeight())
    lora.apply(by_weight, rank=4, compute="weight")
    lora.set_adapter_weights(by_weight, {"attention.proj": (proj.lora_A.weight, proj.lora_B.weight)})
    torch.testing.assert_close(by_weight.attention.proj(h), expected, rtol=0, atol=1e-12)
    subclass = nn.Sequential(nn.modules.linear.NonDynamicallyQuantizableLinear(3, 3))  # a subclass
    with pytest.raises(UserError, match="use compute='input'"):
        lora.apply(subclass, targets=["0"], compute="weight")
    weights = {name: layer.base_layer.weight.clone() for name, layer in lora.lora_layers(model).items()}
    with pytest.raises(UserError, match="attention.proj: its base weight is computed by a parametrization"):
        lora.merge(model)
    for name, layer in lora.lora_layers(model).items():  # refused before anything changed
        assert not layer.merged and torch.equal(layer.base_layer.weight, weights[name])


# -- extension points -----------------------------------------------------------------------------


def test_routed_experts_equal_a_loop_over_moelora_experts():
    torch.manual_seed(0)
    base = nn.Linear(6, 5).double()
    layer = lora.LoraLayer(copy.deepcopy(base), lora.AdapterConfig(rank=8, alpha=16, experts=4))  # kind "hlora"
    randomize([layer.lora_B.weight], seed=5)
    x = torch.randn(3, 7, 6, dtype=torch.float64)  # (batch, tokens, in): token-level routing
    gates = torch.softmax(x @ layer.lora_route.weight.T, dim=-1)  # (3, 7, 4)
    scale = 16 / 8 * 4  # alpha / r · k, the authors' code
    expected = base(x)
    for e in range(4):
        rows = slice(2 * e, 2 * e + 2)
        a_e, b_e = layer.lora_A.weight[rows], layer.lora_B.weight[:, rows]
        expected = expected + gates[..., e : e + 1] * scale * (x @ a_e.T @ b_e.T)
    assert (expected - base(x)).abs().max() > 1e-2
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-12)
    assert (layer(x) - expected).abs().max() <= 1e-12
    with pytest.raises(UserError, match="input-dependent"):
        layer.merge()


def test_routed_layers_through_apply():
    x = inputs()
    model = lora.apply(small(), targets=["attention"], rank=4, experts=2)
    assert all(layer.adapters["default"].kind == "hlora" for layer in lora.lora_layers(model).values())
    assert torch.equal(model(x), small()(x))  # B = 0
    assert model.attention.qkv.lora_route.weight.shape == (2, 6)
    assert len(lora.adapter_parameters(model)) == 2 * 3  # A, B, router per layer
    with pytest.raises(UserError, match="cannot merge LoRA into this model: attention.qkv"):
        lora.merge(model)
    with pytest.raises(UserError, match="nn.Linear layers, not Conv1d"):
        lora.apply(small(), targets=["conv1d"], rank=4, experts=2)
    with pytest.raises(UserError, match="multiple of experts"):
        lora.apply(small(), targets=["attention"], rank=3, experts=2)


def test_set_adapter_weights_changes_the_output_as_the_formula_says():
    x = inputs()
    base = small()
    model = lora.apply(copy.deepcopy(base), targets=["conv", "attention"], rank=2, alpha=6)
    generator = torch.Generator().manual_seed(9)
    a = torch.randn(2, 6, generator=generator, dtype=torch.float64)
    b = torch.randn(6, 2, generator=generator, dtype=torch.float64)
    a_conv = torch.randn(2, 1, 3, 3, generator=generator, dtype=torch.float64)
    b_conv = torch.randn(4, 2, 1, 1, generator=generator, dtype=torch.float64)
    lora.set_adapter_weights(model, {"attention.proj": (a, b), "conv2d": (a_conv, b_conv)})
    expected = copy.deepcopy(base)
    with torch.no_grad():  # W' = W + (alpha / r) · B A
        expected.attention.proj.weight += 3.0 * b @ a
        expected.conv2d.weight += 3.0 * torch.einsum("or,rikl->oikl", b_conv[:, :, 0, 0], a_conv)
    torch.testing.assert_close(model(x), expected(x), rtol=0, atol=1e-12)
    assert (model(x) - base(x)).abs().max() > 1e-3
    with pytest.raises(UserError, match=r"'attention.proj': A has shape \(6, 2\), expected \(2, 6\)"):
        lora.set_adapter_weights(model, {"attention.proj": (a.T, b)})
    with pytest.raises(UserError, match="not LoRA layers"):
        lora.set_adapter_weights(model, {"head": (a, b)})


def test_lora_method_declares_what_it_needs():
    method = lora.LoRA(rank=2, alpha=2.0, targets="conv, attention.qkv", dropout=0.1)
    model = method.prepare(small())
    assert list(lora.lora_layers(model)) == ["conv1d", "conv2d", "attention.qkv"]
    assert model.head.weight.requires_grad and not model.norm.weight.requires_grad
    assert math.isclose(model.conv1d.lora_dropout.p, 0.1)
    frozen_head = lora.LoRA(head="frozen").prepare(small())
    assert not frozen_head.head.weight.requires_grad
    with pytest.raises(UserError, match="needs LoRA target groups|declares nothing"):
        lora.LoRA().check(None, None, Plain())


class _ReadsItsWeight(nn.Module):
    """Attention-style code that calls ``F.linear`` on ``self.qkv.weight`` itself (as braindecode's Labram does)."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(6, 18, bias=False)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.qkv.weight, torch.zeros(18, dtype=x.dtype))


def test_a_model_that_reads_the_weight_itself_sees_the_adapted_weight():
    torch.manual_seed(0)
    model = _ReadsItsWeight().double()
    x = torch.randn(4, 6, dtype=torch.float64)
    base = model(x).detach()
    lora.apply(model, targets=["qkv"], rank=2, alpha=2.0)
    torch.testing.assert_close(model(x), base, rtol=0, atol=0)  # B = 0: identity at start
    with torch.no_grad():
        model.qkv.lora_B.weight.normal_()
    expected = x @ (model.qkv.base_layer.weight + model.qkv.lora_B.weight @ model.qkv.lora_A.weight).T
    torch.testing.assert_close(model(x), expected, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(model(x), base)
    model(x).sum().backward()  # the gradient reaches the factors through the weight
    assert model.qkv.lora_B.weight.grad is not None and model.qkv.base_layer.weight.grad is None
    merged = lora.merge(model)
    torch.testing.assert_close(merged(x), expected, rtol=1e-12, atol=1e-12)

    with_dropout = lora.apply(_ReadsItsWeight().double(), targets=["qkv"], rank=2, alpha=2.0, dropout=0.5)
    with pytest.raises(UserError, match="reads the weight .* directly"):
        with_dropout.train()(x)
    with_dropout.eval()(x)  # dropout inactive: fine
