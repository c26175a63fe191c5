"""One contract for every registered method: identity at start, a step moves only what it owns,
its state saves and loads, merging changes nothing. A method without a case here fails the suite."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import outputs_on, randomize_trainable, small_mace
from workbench.domains.atomistic.frames import Frame, collate, to_graphs
from workbench.models.mlp import FeatureNet

from workbench.core.checkpoint import load_tensors, save_tensors
from workbench.core.registry import methods
from workbench.core.testing import assert_identity_at_init, assert_merge_equivalent, assert_only_trainable_change


def mace_case(ethanol):
    """(base model builder, outputs, step) on the ethanol frames with a small MACE."""
    z, coords = ethanol
    batch = collate(to_graphs([Frame(z, c) for c in coords[:3]], [1, 6, 7, 8], 5.0), "cpu")

    def loss(model):
        out = model(batch.to_dict(), training=True, compute_force=True)
        return out["energy"].sum() + out["forces"].square().sum()

    return small_mace, outputs_on(z, coords[:2]), loss


def mlp_case(ethanol):
    """(base model builder, outputs, step) with a small FeatureNet (float64, for exact comparisons)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 5, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (8,), generator=generator)

    def build():
        torch.manual_seed(0)
        return FeatureNet(5, 3, (16,)).double()

    def loss(model):
        return torch.nn.functional.cross_entropy(model(x), y)

    return build, lambda model: {"logits": model(x)}, loss


def graph_case(encoder):
    """Case builder for graph methods training a `GraphNet` with ``encoder`` (the base already has it)."""

    def case(ethanol):
        from workbench.domains.graphs.graph import Graph
        from workbench.models.graph import GraphNet

        generator = torch.Generator().manual_seed(0)
        ring = torch.arange(12)
        edges = torch.stack([torch.cat([ring, ring]), torch.cat([(ring + 1) % 12, (ring + 5) % 12])])
        edge_index = torch.cat([edges, edges.flip(0)], dim=1)
        graph = Graph(torch.randn(12, 5, generator=generator, dtype=torch.float64), edge_index, ring % 3, "ring")

        def build():
            torch.manual_seed(0)
            return GraphNet(5, 3, hidden_channels=8, encoder=encoder).double()

        def loss(model):
            return torch.nn.functional.cross_entropy(model(graph), graph.y)

        return build, lambda model: {"logits": model(graph)}, loss

    return case


def ecg_case(ethanol):
    """(base model builder, outputs, step) with a tiny `ECGEncoder` (float64) on a random 12-lead batch."""
    from workbench.models.ecg import ECGEncoder

    generator = torch.Generator().manual_seed(0)
    ecg = torch.randn(4, 12, 64, generator=generator, dtype=torch.float64)
    labels = (torch.rand(4, 5, generator=generator) > 0.5).double()

    def build():
        torch.manual_seed(0)
        return ECGEncoder(n_times=64, width=8, n_layers=1, n_heads=2, stem_channels=(8, 8)).double()

    def loss(model):
        return torch.nn.functional.binary_cross_entropy_with_logits(model(ecg), labels)

    return build, lambda model: {"logits": model(ecg)}, loss


def patch_gpt_case(ethanol):
    """(base model builder, outputs, step) with a tiny `PatchGPT` (float64) on random beats. The outputs are the
    backbone's features: PhysioPFM's methods replace the head by their fixed ETF head by design."""
    from workbench.models.physio import PatchGPT

    generator = torch.Generator().manual_seed(0)
    beats = torch.randn(6, 50, generator=generator, dtype=torch.float64)
    labels = torch.arange(6) % 4

    def build():
        torch.manual_seed(0)
        return PatchGPT(50, 4, 250.0, width=16, n_heads=2, n_layers=2).double().eval()

    def loss(model):
        return torch.nn.functional.cross_entropy(model(beats), labels)

    return build, lambda model: {"features": model.features(beats), "logits": model(beats)}, loss


def medvl_case(ethanol):
    """(base model builder, outputs, step) with a tiny `MedVL` (float64): a comprehension and a generation batch,
    each through its own projector (and, for the H-LoRA methods, its own plug-in)."""
    from workbench.models.medvl import MedVL, MedVLConfig
    from workbench.models.vq import VQConfig

    words = "is there a lesion yes no ? reconstruct the image .".split()
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(2, 1, 64, 64, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 16, (2, 8, 8), generator=generator)

    def build():
        torch.manual_seed(0)
        vq = VQConfig(codebook_size=16, code_dim=8, channels=8, res_blocks=1)
        config = MedVLConfig(vision_hidden=16, vision_heads=2, vision_intermediate=32, lm_hidden=32, lm_heads=2,
                             lm_intermediate=64, lm_layers=2, vision_layers=2, vq=vq)  # fmt: skip
        return MedVL(config, words).double().eval()

    def batches(model):
        return (model.encode_batch(images, ["is there a lesion?"] * 2, ["yes", "no"], kind="comprehension"),
                model.encode_batch(images, ["reconstruct the image."] * 2, targets, kind="generation"))  # fmt: skip

    def outputs(model):
        comprehension, generation = batches(model)
        return {"logits": torch.cat([model(**comprehension).logits, model(**generation).logits], dim=1)}

    def loss(model):
        return sum(model(**batch).loss for batch in batches(model))

    return build, outputs, loss


HLORA_SMALL = {"rank": 4, "alpha": 8.0, "generation_rank": 4, "generation_alpha": 8.0, "experts": 2}
#: method -> (options, case: the kind of base model it fits)
CASES = {
    "elora": ({"rank": 4, "alpha": 4.0}, mace_case),
    "full": ({}, mace_case),
    "readout": ({}, mace_case),
    "mace-lora": ({"rank": 2}, mace_case),
    "feature-lora": ({"rank": 2, "alpha": 2.0}, mace_case),
    "warmpot": ({}, mlp_case),
    "pada": ({}, mlp_case),
    "oracle": ({}, mlp_case),
    "dre-pp": ({}, mlp_case),
    "dre-ulsif": ({}, mlp_case),
    "dre-kliep": ({}, mlp_case),
    "dre-logistic": ({}, mlp_case),
    "homophily": ({}, graph_case("mixed")),
    "mixed-filters": ({}, graph_case("mixed")),
    "udagcn": ({}, graph_case("gcn")),
    "lora": ({"rank": 2, "alpha": 2.0}, ecg_case),
    "lift": ({"rank": 2, "budget_rank": 1}, ecg_case),
    "htuning": ({"rank": 2, "alpha": 2.0}, ecg_case),
    "distill": ({"n_leads": 3}, ecg_case),
    "physiopfm": ({}, patch_gpt_case),
    "physiopfm-none": ({}, patch_gpt_case),
    "physiopfm-mean": ({}, patch_gpt_case),
    "physiopfm-nearest": ({}, patch_gpt_case),
    "physiopfm-local": ({}, patch_gpt_case),
    "hlora": (HLORA_SMALL, medvl_case),
    "moelora": (HLORA_SMALL, medvl_case),
    "hlora-lora": (HLORA_SMALL, medvl_case),
    "hlora-mixed": (HLORA_SMALL, medvl_case),
}
#: Methods whose ``prepare`` builds a new model (a student) from the base.
NEW_MODEL = {"distill"}
#: Methods that replace the model's head (identity at start is of the backbone's features).
REPLACES_HEAD = {"physiopfm", "physiopfm-none", "physiopfm-mean", "physiopfm-nearest", "physiopfm-local"}


def test_every_method_has_a_case():
    assert set(methods.names()) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_method_contract(name, ethanol, tmp_path):
    options, case = CASES[name]
    build, outputs, loss = case(ethanol)
    method = methods.get(name)(**options)
    base = build()
    if name in NEW_MODEL:
        prepared = method.prepare(copy.deepcopy(base))  # a new model (a student): nothing to be identical to
    elif name in REPLACES_HEAD:
        prepared = method.prepare(copy.deepcopy(base))
        torch.testing.assert_close(outputs(prepared)["features"], outputs(base)["features"], rtol=0, atol=1e-12)
    else:
        prepared = assert_identity_at_init(base, method, outputs)
    optimizer = torch.optim.Adam([p for p in prepared.parameters() if p.requires_grad] or [torch.zeros(1)], lr=1e-2)

    def step(model):
        optimizer.zero_grad()
        loss(model).backward()
        optimizer.step()

    trains = any(p.requires_grad for p in prepared.parameters())  # methods that generate weights train nothing
    if trains:
        step(prepared)  # low-rank methods start with B = 0: the first step moves B only
        assert_only_trainable_change(prepared, step)
    else:  # weights made, not trained: stand-in values for what the method would write
        owned = set(method.trainable_state(prepared))
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for parameter_name, p in prepared.named_parameters():
                if parameter_name in owned:
                    p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.05)

    save_tensors(tmp_path / "state.safetensors", method.trainable_state(prepared))
    torch.manual_seed(123)
    reloaded = method.prepare(copy.deepcopy(base))
    method.load_trainable_state(reloaded, load_tensors(tmp_path / "state.safetensors"))
    name_of_output = next(iter(outputs(prepared)))
    torch.testing.assert_close(outputs(reloaded)[name_of_output], outputs(prepared)[name_of_output], rtol=0, atol=0)

    if trains:
        randomize_trainable(prepared, scale=0.05)
    assert_merge_equivalent(prepared, method, outputs, tol=1e-10)
