"""Several named adapters in one `LoraLayer` (`workbench.adaptation.lora`): add / set / delete / merge a chosen one,
each saved and loaded under PEFT's file names, against PEFT's ``add_adapter`` / ``set_adapter`` on the same weights
(float64)."""

from __future__ import annotations

import copy
import json

import peft
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from workbench.adaptation import lora

from workbench.core.checkpoint import read_metadata
from workbench.core.errors import UserError

TARGETS = ["conv", "fc"]


class Small(nn.Module):
    """A conv and two linears: (batch, 2, 9) → (batch, 3)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 9, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.fc(torch.tanh(self.conv(x)).flatten(1))))


def small(seed: int = 0) -> Small:
    torch.manual_seed(seed)
    return Small().double()


def inputs() -> torch.Tensor:
    return torch.randn(5, 2, 9, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def randomize(params, seed: int = 2) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.copy_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))


def two_adapters():
    """(ours, PEFT's) on copies of one base: ``default`` (r 4, alpha 8) and ``b`` (r 2, alpha 6), equal factors."""
    base = small()
    ours = lora.apply(copy.deepcopy(base), targets=TARGETS, rank=4, alpha=8)
    lora.add_adapter(ours, "b", lora.LoraConfig(targets=TARGETS, rank=2, alpha=6))
    randomize(lora.adapter_parameters(ours))
    theirs = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    theirs.add_adapter("b", peft.LoraConfig(r=2, lora_alpha=6, target_modules=TARGETS))
    params = dict(theirs.base_model.model.named_parameters())
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if ".lora_" in name:
                params[name].copy_(p)  # the same in-memory names as PEFT's: <module>.lora_A.<adapter>.weight
    return base, ours, theirs


def test_two_named_adapters_act_as_peft_set_adapter_chooses():
    x = inputs()
    base, ours, theirs = two_adapters()
    assert {n for n, _ in ours.named_parameters()} == {n for n, _ in theirs.base_model.model.named_parameters()}
    outputs = {}
    for active in ("default", "b", ["default", "b"]):
        lora.set_adapter(ours, active)
        theirs.base_model.set_adapter(active)
        outputs[str(active)] = ours(x)
        torch.testing.assert_close(outputs[str(active)], theirs(x), rtol=0, atol=1e-12)
    assert (outputs["default"] - outputs["b"]).abs().max() > 1e-3  # the two adapters differ
    assert (outputs["default"] - base(x)).abs().max() > 1e-3
    lora.set_adapter(ours, [])
    assert torch.equal(ours(x), base(x))  # none active: the base model
    with pytest.raises(UserError, match=r"no LoRA adapter named \['c'\]"):
        lora.set_adapter(ours, "c")


def test_each_named_adapter_saves_peft_file_names_and_loads_back(tmp_path):
    x = inputs()
    base, ours, theirs = two_adapters()
    theirs.save_pretrained(tmp_path / "peft", selected_adapters=["default", "b"])  # b in its sub-folder "b"
    for adapter, peft_folder in (("default", tmp_path / "peft"), ("b", tmp_path / "peft" / "b")):
        file = lora.save_adapter(ours, tmp_path / adapter, adapter=adapter)
        mine, peft_file = load_file(file), load_file(peft_folder / "adapter_model.safetensors")
        assert set(mine) == set(peft_file) and all(torch.equal(mine[k], peft_file[k]) for k in mine)
        assert json.loads(read_metadata(file)["config"])["rank"] == {"default": 4, "b": 2}[adapter]
        theirs_loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / adapter)  # PEFT reads ours
        lora.set_adapter(ours, adapter)
        torch.testing.assert_close(theirs_loaded(x), ours(x), rtol=0, atol=1e-12)
    fresh = lora.load_adapter(small(), tmp_path / "default")  # onto a base model: applied as "default"
    fresh_model = small()
    lora.load_adapter(fresh_model, tmp_path / "default")
    report = lora.load_adapter(fresh_model, tmp_path / "b", adapter="b", strict=True)  # added beside it
    assert not fresh.missing and not report.missing and not report.unexpected
    assert set(lora.lora_layers(fresh_model)["fc"].adapters) == {"default", "b"}
    for adapter in ("default", "b", ["default", "b"]):
        lora.set_adapter(ours, adapter)
        lora.set_adapter(fresh_model, adapter)
        assert torch.equal(fresh_model(x), ours(x))


def test_merging_a_chosen_adapter_folds_that_one_alone_as_peft():
    x = inputs()
    base, ours, theirs = two_adapters()
    lora.set_adapter(ours, "b")
    expected = ours(x)
    lora.merge(ours, unload=False, adapter="b")
    theirs.base_model.merge_adapter(adapter_names=["b"])
    for name in ("conv", "fc"):
        layer = ours.get_submodule(name)
        assert layer.merged_adapters == ["b"]
        torch.testing.assert_close(
            layer.base_layer.weight, theirs.base_model.model.get_submodule(name).base_layer.weight, rtol=0, atol=1e-14
        )
    torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-12)  # b folded, not added twice
    lora.set_adapter(ours, ["default", "b"])  # default still adds its update on top of the folded b
    lora.unmerge(ours)
    unmerged = ours(x)
    lora.merge(ours, unload=False, adapter="b")
    torch.testing.assert_close(ours(x), unmerged, rtol=0, atol=1e-12)
    with pytest.raises(UserError, match="merged into conv, fc; unmerge"):
        lora.delete_adapter(ours, "b")
    plain = lora.merge(ours, adapter="default")  # both folded, then the original classes
    assert type(plain.fc) is nn.Linear and not lora.lora_layers(plain)
    torch.testing.assert_close(plain(x), unmerged, rtol=0, atol=1e-12)


def test_deleting_an_adapter_removes_its_parameters_and_leaves_the_others():
    x = inputs()
    _, ours, _ = two_adapters()
    lora.set_adapter(ours, "default")
    before = ours(x)
    lora.delete_adapter(ours, "b")
    assert not any(".b." in name for name, _ in ours.named_parameters())
    assert all(list(layer.adapters) == ["default"] for layer in lora.lora_layers(ours).values())
    assert torch.equal(ours(x), before)
    lora.delete_adapter(ours, "default")  # layers left without adapters are their base layers again
    assert not lora.lora_layers(ours) and type(ours.conv) is nn.Conv1d
    with pytest.raises(UserError, match="no LoRA adapter named 'default'"):
        lora.delete_adapter(ours, "default")


def test_one_layer_holds_adapters_of_every_kind():
    """add / set / delete / merge on the layer itself; a routed adapter beside a plain one."""
    torch.manual_seed(0)
    base = nn.Linear(6, 5).double()
    layer = lora.LoraLayer(copy.deepcopy(base))
    layer.add_adapter("plain", lora.AdapterConfig(rank=2, alpha=4))
    layer.add_adapter("fused", lora.AdapterConfig(rank=4, alpha=8, experts=2))
    layer.add_adapter("looped", lora.AdapterConfig(rank=4, alpha=8, experts=2, kind="moelora"))
    assert layer.active_adapters == ()  # adding does not activate (PEFT's update_layer)
    randomize([p for name, p in layer.named_parameters() if ".lora_B." in name or name.startswith("lora_B")])
    x = torch.randn(3, 7, 6, dtype=torch.float64)
    assert torch.equal(layer(x), base(x))
    with torch.no_grad():  # the looped experts as the fused ones' row and column blocks
        layer.lora_route["looped"].weight.copy_(layer.lora_route["fused"].weight)
        for e in range(2):
            layer.lora_A["looped"][e].weight.copy_(layer.lora_A["fused"].weight[2 * e : 2 * e + 2])
            layer.lora_B["looped"][e].weight.copy_(layer.lora_B["fused"].weight[:, 2 * e : 2 * e + 2])
    each = {}
    for name in ("plain", "fused", "looped"):
        layer.set_adapter(name)
        each[name] = layer(x) - base(x)
    assert (each["fused"] - each["looped"]).abs().max() <= 1e-12
    layer.set_adapter(["plain", "fused"])
    torch.testing.assert_close(layer(x), base(x) + each["plain"] + each["fused"], rtol=0, atol=1e-12)
    with pytest.raises(UserError, match="'fused' computes an input-dependent update"):
        layer.merge()
    layer.merge("plain")  # the chosen one: W ← W + ΔW_plain
    torch.testing.assert_close(layer.base_layer.weight, base.weight + layer.delta_weight("plain"), rtol=0, atol=1e-15)
    torch.testing.assert_close(layer(x), base(x) + each["plain"] + each["fused"], rtol=0, atol=1e-12)
    layer.unmerge()
    torch.testing.assert_close(layer.base_layer.weight, base.weight, rtol=0, atol=1e-15)
    layer.delete_adapter("fused")
    assert layer.active_adapters == ("plain",) and "fused" not in layer.lora_A and "fused" not in layer.lora_route
    with pytest.raises(UserError, match="already has a LoRA adapter named 'plain'"):
        layer.add_adapter("plain", lora.AdapterConfig(rank=2, alpha=4))
    with pytest.raises(UserError, match="nn.Linear layers, not Conv1d"):
        lora.LoraLayer(nn.Conv1d(2, 2, 3)).add_adapter("r", lora.AdapterConfig(rank=2, alpha=2, experts=2))


def test_run_files_keep_their_tensor_names(tmp_path):
    """A run's adapter.safetensors (the lora method's `trainable_state`) and a plug-in file written before adapters
    had names (``layout`` in its config, no ``compute``) still load."""
    x = inputs()
    method = lora.LoRA(rank=2, alpha=4.0, targets="fc", head="frozen", compute="input")
    model = method.prepare(small())
    randomize(lora.adapter_parameters(model))
    state = method.trainable_state(model)
    assert set(state) == {"fc.lora_A.weight", "fc.lora_B.weight"}  # the names runs have always written
    fresh = lora.LoRA(rank=2, alpha=4.0, targets="fc", head="frozen", compute="input")
    rebuilt = fresh.prepare(small())
    fresh.load_trainable_state(rebuilt, state)
    assert torch.equal(rebuilt(x), model(x))
    with pytest.raises(UserError, match="does not fit LoRA adapter 'default'"):
        fresh.load_trainable_state(rebuilt, {**state, "fc.lora_A.default.weight": state["fc.lora_A.weight"]})

    plugins = {"p": lora.PluginConfig(4, 8.0, 2)}
    model = lora.apply_plugins(small(), ["fc"], plugins)
    randomize(lora.adapter_parameters(model))
    path = lora.save_plugin(model, "p", tmp_path / "p.safetensors")
    metadata = read_metadata(path)
    config = json.loads(metadata["config"])
    config["layout"] = config.pop("kind")
    del config["compute"]
    save_file(load_file(path), str(tmp_path / "old.safetensors"), metadata={**metadata, "config": json.dumps(config)})
    assert set(load_file(path)) == {f"base_model.model.fc.{k}.weight" for k in ("lora_A", "lora_B", "lora_route")}
    fresh = lora.apply_plugins(small(), ["fc"], plugins)
    lora.load_plugin(fresh, "p", tmp_path / "old.safetensors")
    with lora.active_plugin(model, "p"), lora.active_plugin(fresh, "p"):
        assert torch.equal(fresh(x), model(x))
