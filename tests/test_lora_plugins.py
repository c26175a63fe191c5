"""LoRA plug-ins chosen by task kind (`workbench.adaptation.lora.plugins`: named adapters of one `LoraLayer`):
H-LoRA's fused experts against a loop over MoELoRA experts, identity at start, isolation of the plug-ins, strict
plug-in files — on a real (tiny) transformers LLaMA, in float64."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn
from workbench.adaptation import lora
from workbench.adaptation.lora.plugins import FILE_KIND

from workbench.core.checkpoint import read_metadata
from workbench.core.errors import UserError
from workbench.core.model import ModelSpec

LANGUAGE = ("model.layers.*.self_attn.*_proj", "model.layers.*.mlp.*_proj")


def tiny_llama(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).double().eval()
    model.workbench_spec = ModelSpec(family="test", head="lm_head", adapter_target_groups={"language": LANGUAGE})
    return model


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(seed))


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits


def randomize_b(model: nn.Module, seed: int = 3) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=generator, dtype=p.dtype))


PLUGINS = {
    "comprehension": lora.PluginConfig(rank=8, alpha=16, experts=4),
    "generation": lora.PluginConfig(rank=12, alpha=24, experts=4),
}


def test_the_language_group_wraps_every_linear_but_the_head():
    model = lora.apply_plugins(tiny_llama(), ["language"], PLUGINS)
    layers = lora.lora_layers(model)
    assert len(layers) == 2 * 7 and "lm_head" not in layers
    assert all(list(layer.adapters) == ["comprehension", "generation"] for layer in layers.values())
    assert isinstance(model.lm_head, nn.Linear) and not model.lm_head.weight.requires_grad
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".comprehension." in name or ".generation." in name for name in trained)


@pytest.mark.parametrize("kind", ["hlora", "moelora", "lora"])
def test_every_kind_starts_as_the_base_model(kind):
    experts = None if kind == "lora" else 2
    base, ids = tiny_llama(), tokens()
    model = lora.apply_plugins(copy.deepcopy(base), ["language"], {"p": lora.PluginConfig(4, 8, experts, kind)})
    with lora.active_plugin(model, "p"):
        assert torch.equal(logits(model, ids), logits(base, ids))


def test_hlora_equals_a_loop_over_moelora_experts_with_the_same_weights():
    """The fused layer (one matmul pair, gates repeated r/k times) against k separate experts, through a LLaMA."""
    base, ids = tiny_llama(), tokens()
    fused = lora.apply_plugins(copy.deepcopy(base), ["language"], {"p": lora.PluginConfig(8, 16, 4, "hlora")})
    looped = lora.apply_plugins(copy.deepcopy(base), ["language"], {"p": lora.PluginConfig(8, 16, 4, "moelora")})
    randomize_b(fused)
    with torch.no_grad():
        for name, ours in lora.lora_layers(fused).items():
            theirs = lora.lora_layers(looped)[name]
            theirs.lora_route["p"].weight.copy_(ours.lora_route["p"].weight)
            for e in range(4):  # expert e holds rows 2e, 2e+1 of A and the same columns of B
                theirs.lora_A["p"][e].weight.copy_(ours.lora_A["p"].weight[2 * e : 2 * e + 2])
                theirs.lora_B["p"][e].weight.copy_(ours.lora_B["p"].weight[:, 2 * e : 2 * e + 2])
    with lora.active_plugin(fused, "p"), lora.active_plugin(looped, "p"):
        a, b = logits(fused, ids), logits(looped, ids)
    assert (a - logits(base, ids)).abs().max() > 1e-2  # the plug-in does change the model
    assert (a - b).abs().max() <= 1e-10
    count = lambda m: sum(p.numel() for p in m.parameters() if p.requires_grad)  # noqa: E731
    assert count(fused) == count(looped)


def test_the_fused_update_is_the_formula_of_the_authors_code():
    torch.manual_seed(0)
    base = nn.Linear(6, 5).double()
    layer = lora.LoraLayer(base, lora.PluginConfig(rank=8, alpha=16, experts=4), "p")
    with torch.no_grad():
        layer.lora_B["p"].weight.normal_()
    x = torch.randn(2, 7, 6, dtype=torch.float64)
    gates = torch.softmax(x @ layer.lora_route["p"].weight.T, dim=-1).repeat_interleave(2, dim=-1)
    expected = ((x @ layer.lora_A["p"].weight.T) * gates) @ layer.lora_B["p"].weight.T * (16 / 8 * 4)
    assert (layer.update("p", x) - expected).abs().max() <= 1e-12


def test_a_plain_lora_plugin_is_the_lora_formula():
    torch.manual_seed(0)
    base = nn.Linear(6, 5).double()
    layer = lora.LoraLayer(copy.deepcopy(base), lora.PluginConfig(4, 12, None, "lora"), "p")
    with torch.no_grad():
        layer.lora_B["p"].weight.normal_()
    x = torch.randn(3, 6, dtype=torch.float64)
    expected = base(x) + 12 / 4 * x @ (layer.lora_B["p"].weight @ layer.lora_A["p"].weight).T
    assert (layer(x) - expected).abs().max() <= 1e-12


def test_training_the_generation_plugin_leaves_comprehension_and_the_base_bit_identical():
    model, ids = lora.apply_plugins(tiny_llama(), ["language"], PLUGINS), tokens()
    randomize_b(model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        with lora.active_plugin(model, "generation"):
            model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all(".generation." in name for name in changed)
    assert set(lora.plugin_parameters(model, "generation")) >= changed
    assert all(p.grad is None for p in lora.plugin_parameters(model, "comprehension").values())


def test_the_hard_router_picks_the_plugin_and_restores_the_previous_choice():
    base, ids = tiny_llama(), tokens()
    model = lora.apply_plugins(copy.deepcopy(base), ["language"], PLUGINS)
    randomize_b(model)
    with lora.active_plugin(model, "comprehension"):
        comprehension = logits(model, ids)
        with lora.active_plugin(model, "generation"):
            generation = logits(model, ids)
        assert torch.equal(logits(model, ids), comprehension)
    assert torch.equal(logits(model, ids), logits(base, ids))  # none active: the base model
    assert (comprehension - generation).abs().max() > 1e-3
    with pytest.raises(UserError, match="no LoRA plug-in named 'vision'"):
        with lora.active_plugin(model, "vision"):
            pass


@pytest.mark.parametrize(
    "config, message",
    [
        (dict(rank=6, alpha=8, experts=4), "rank 6 must be a multiple of experts 4"),
        (dict(rank=8, alpha=8, experts=4, kind="moelora"), None),
        (dict(rank=6, alpha=8, experts=4, kind="moelora"), "rank 6 must be a multiple of experts 4"),
        (dict(rank=8, alpha=8, experts=2, kind="lora"), "plain LoRA adapter has no experts"),
        (dict(rank=8, alpha=8, experts=None, kind="hlora"), "needs a positive number of experts"),
        (dict(rank=0, alpha=8, experts=None, kind="lora"), "positive integer"),
        (dict(rank=8, alpha=8, kind="dora"), "kind must be one of"),
    ],
)
def test_plugin_configs_are_checked_at_construction(config, message):
    if message is None:
        assert lora.PluginConfig(**config).scale == 8 / 8 * 4
    else:
        with pytest.raises(UserError, match=message):
            lora.PluginConfig(**config)


def test_plugins_adapt_linear_layers_only_and_not_twice():
    with pytest.raises(UserError, match="selects no nn.Linear"):
        lora.apply_plugins(tiny_llama(), ["model.embed_tokens"], PLUGINS)
    model = lora.apply_plugins(tiny_llama(), ["language"], PLUGINS)
    with pytest.raises(UserError, match="already carries LoRA layers"):
        lora.apply_plugins(model, ["language"], PLUGINS)


def test_a_plugin_file_round_trips_and_holds_peft_style_names(tmp_path):
    ids = tokens()
    model = lora.apply_plugins(tiny_llama(), ["language"], PLUGINS)
    randomize_b(model)
    path = lora.save_plugin(model, "generation", tmp_path / "generation.safetensors")
    tensors = load_file(path)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_route.weight" in tensors
    assert all(".generation." not in key for key in tensors) and read_metadata(path)["method"] == FILE_KIND
    fresh = lora.apply_plugins(tiny_llama(), ["language"], PLUGINS)
    lora.load_plugin(fresh, "generation", path)
    with lora.active_plugin(model, "generation"), lora.active_plugin(fresh, "generation"):
        assert torch.equal(logits(model, ids), logits(fresh, ids))


def test_a_plugin_file_missing_router_keys_or_of_another_rank_is_refused(tmp_path):
    model = lora.apply_plugins(tiny_llama(), ["language"], PLUGINS)
    path = lora.save_plugin(model, "comprehension", tmp_path / "comprehension.safetensors")
    tensors, metadata = load_file(path), read_metadata(path)
    without_router = {k: v for k, v in tensors.items() if "lora_route" not in k}
    save_file(without_router, str(tmp_path / "no-router.safetensors"), metadata=metadata)
    fresh = lora.apply_plugins(tiny_llama(), ["language"], PLUGINS)
    before = {k: p.clone() for k, p in lora.plugin_parameters(fresh, "comprehension").items()}
    with pytest.raises(UserError, match=r"no-router.safetensors: plug-in 'comprehension' lacks 14 of its 42 tensors "
                                        r"\(lora_route: "):  # fmt: skip
        lora.load_plugin(fresh, "comprehension", tmp_path / "no-router.safetensors")
    assert all(torch.equal(p, before[k]) for k, p in lora.plugin_parameters(fresh, "comprehension").items())
    with pytest.raises(UserError, match="has rank 8 in the file's config, but the model's plug-in has rank 12"):
        lora.load_plugin(fresh, "generation", path)
    other = lora.apply_plugins(tiny_llama(), ["language"], {"comprehension": lora.PluginConfig(8, 16, 2)})
    with pytest.raises(UserError, match="has experts 4 in the file's config"):
        lora.load_plugin(other, "comprehension", path)
