"""The PhysioPFM backbone (workbench.models.physio.PatchGPT): shapes and spec, causality, the attention against
its closed form, LoRA on its declared groups, checkpoints and the sizes a task gives."""

from __future__ import annotations

import math

import pytest
import torch
from workbench.adaptation import lora
from workbench.models.physio import PatchGPT, load_patch_gpt, save_patch_gpt

from workbench.core.errors import UserError
from workbench.core.registry import models


def small(**options) -> PatchGPT:
    torch.manual_seed(0)
    return models.get("patch-gpt")().load(
        n_times=175, n_outputs=4, sfreq=250.0, n_layers=2, pretrained=False, **options
    )


def test_shapes_spec_and_sizes():
    model = small().eval()
    x = torch.randn(3, 175)
    assert model(x).shape == (3, 4)
    torch.testing.assert_close(model(x[:, None]), model(x))  # (batch, 1, n_times) too
    spec = model.workbench_spec
    assert spec.family == "patch-gpt" and spec.head == "head" and spec.signal.n_times == 175
    assert set(spec.adapter_target_groups) == {"qkv", "attn_out", "mlp"}
    assert model.hidden(torch.randn(2, 25 * 10)).shape == (2, 10, 64)  # longer series: for pretraining
    with pytest.raises(UserError, match="whole number"):
        small(patch_size=30)
    with pytest.raises(UserError, match="built for series of 175"):
        model(torch.randn(2, 200))
    with pytest.raises(UserError, match="needs"):
        models.get("patch-gpt")().load(n_times=175, pretrained=False)


def test_a_patch_sees_only_itself_and_the_patches_before_it():
    model = small().double().eval()
    x = torch.randn(2, 175, dtype=torch.float64)
    later = x.clone()
    later[:, 100:] += torch.randn(2, 75, dtype=torch.float64)  # patches 4, 5, 6
    before, after = model.hidden(x), model.hidden(later)
    torch.testing.assert_close(after[:, :4], before[:, :4], rtol=0, atol=1e-12)
    assert (after[:, 4:] - before[:, 4:]).abs().max() > 1e-3


def test_attention_is_masked_softmax_attention():
    attention = small().double().eval().blocks[0].attn
    h = torch.randn(2, 7, 64, dtype=torch.float64)
    q, k, v = attention.qkv(h).split(64, dim=-1)
    heads = lambda t: t.view(2, 7, 4, 16).transpose(1, 2)  # noqa: E731
    scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(16)
    scores = scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    expected = attention.proj((scores.softmax(-1) @ heads(v)).transpose(1, 2).reshape(2, 7, 64))
    torch.testing.assert_close(attention(h), expected, rtol=0, atol=1e-12)


def test_lora_on_qkv_starts_at_the_base_and_merges_exactly():
    model = small().double().eval()
    x = torch.randn(3, 175, dtype=torch.float64)
    base = model(x).detach()
    lora.apply(model, targets=["qkv"], rank=4, alpha=8)
    assert sorted(lora.lora_layers(model)) == ["blocks.0.attn.qkv", "blocks.1.attn.qkv"]
    assert all(".lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    torch.testing.assert_close(model(x), base, rtol=0, atol=1e-12)
    with torch.no_grad():
        for layer in lora.lora_layers(model).values():
            layer.lora_B.weight.normal_()
    adapted = model(x).detach()
    assert (adapted - base).abs().max() > 1e-3
    lora.merge(model)
    torch.testing.assert_close(model(x), adapted, rtol=0, atol=1e-10)


def test_checkpoint_round_trip_and_size_check(tmp_path):
    model = small().eval()
    path = tmp_path / "backbone.safetensors"
    save_patch_gpt(model, path)
    again = load_patch_gpt(path).eval()
    x = torch.randn(2, 175)
    torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)
    family = models.get("patch-gpt")()
    assert family.load(path, n_times=175, n_outputs=4, sfreq=250.0).architecture == model.architecture
    assert family.files(path) == [path, path.with_suffix(".json")]
    with pytest.raises(UserError, match="sfreq"):
        family.load(path, n_times=175, n_outputs=4, sfreq=360.0)
