"""H-LoRA and its baselines as methods (`workbench.adaptation.hlora`) on a tiny medvl model in float64: identity at
start, H-LoRA equal to looped MoELoRA with the same weights, each task kind through its own plug-in, and what each
of the three stages trains (the generation plug-in's stage leaves comprehension bit-identical; stage 2 only the
word embeddings and the LM head)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from workbench.adaptation import lora
from workbench.adaptation.hlora import GROUPS, HLoRA, HLoRAMixed, HLoRAPlainLoRA, MoELoRA
from workbench.models.medvl import MedVL, MedVLConfig
from workbench.models.vq import VQConfig

from workbench.core.errors import UserError
from workbench.core.method import PlanInputs
from workbench.core.task import TaskData
from workbench.core.trainer import TrainSettings
from workbench.run.stages import train_stages

WORDS = "is there a lesion in the upper lower left right quadrant ? yes no . , what modality ct mr image".split()
QUESTIONS = ["is there a lesion?", "what modality is this image?", "is there a lesion in the upper left quadrant?"]
ANSWERS = ["yes.", "ct", "no, there is no lesion."]
METHODS = (HLoRA, MoELoRA, HLoRAPlainLoRA, HLoRAMixed)
SMALL = dict(rank=4, alpha=8.0, generation_rank=8, generation_alpha=16.0, experts=2)


def tiny(seed: int = 0) -> MedVL:
    torch.manual_seed(seed)
    vq = VQConfig(codebook_size=16, code_dim=8, channels=8, res_blocks=1)
    config = MedVLConfig(vision_hidden=16, vision_heads=2, vision_intermediate=32, lm_hidden=32, lm_heads=2,
                         lm_intermediate=64, vq=vq)  # fmt: skip
    return MedVL(config, WORDS).double().eval()


def images(n: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, 1, 64, 64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def logits(model: MedVL, kind: str) -> torch.Tensor:
    answers = ANSWERS if kind == "comprehension" else images(seed=2)
    return model(**model.encode_batch(images(), QUESTIONS, answers, kind=kind)).logits


def randomize_b(model: nn.Module, plugin: str | None = None, seed: int = 3) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name and (plugin is None or f".lora_B.{plugin}." in name):
                p.copy_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_every_method_starts_as_the_base_model(method):
    base = tiny()
    model = method(**SMALL).prepare(copy.deepcopy(base))
    for kind in ("comprehension", "generation"):
        assert torch.equal(logits(model, kind), logits(base, kind))


def test_hlora_and_looped_moelora_from_the_same_values_give_the_same_outputs_gradients_and_updates():
    """H-LoRA's values (B random, so that every A, B and router has a gradient) copied into MoELoRA's separate
    experts: the same outputs, gradients and Adam update (float64), so that a comparison of the two can only
    measure their time (the benchmark's note states it)."""
    base = tiny()
    fused, looped = HLoRA(**SMALL).prepare(copy.deepcopy(base)), MoELoRA(**SMALL).prepare(copy.deepcopy(base))
    randomize_b(fused)
    pairs = []  # (fused parameter, its rows / columns of one expert, the looped parameter)
    loop_layers = lora.lora_layers(looped)
    with torch.no_grad():
        for name, ours in lora.lora_layers(fused).items():
            theirs = loop_layers[name]
            for plugin in ("comprehension", "generation"):
                per = ours.adapters[plugin].rank // ours.adapters[plugin].experts
                theirs.lora_route[plugin].weight.copy_(ours.lora_route[plugin].weight)
                pairs.append((ours.lora_route[plugin].weight, (), theirs.lora_route[plugin].weight))
                for e in range(ours.adapters[plugin].experts):
                    rows, columns = slice(e * per, (e + 1) * per), (slice(None), slice(e * per, (e + 1) * per))
                    theirs.lora_A[plugin][e].weight.copy_(ours.lora_A[plugin].weight[rows])
                    theirs.lora_B[plugin][e].weight.copy_(ours.lora_B[plugin].weight[columns])
                    pairs.append((ours.lora_A[plugin].weight, rows, theirs.lora_A[plugin][e].weight))
                    pairs.append((ours.lora_B[plugin].weight, columns, theirs.lora_B[plugin][e].weight))
    assert len({id(theirs) for *_, theirs in pairs}) == len(lora.plugin_state(looped))  # every looped parameter
    inputs = {kind: base.encode_batch(images(), QUESTIONS, ANSWERS if kind == "comprehension" else images(seed=2),
                                      kind=kind) for kind in ("comprehension", "generation")}  # fmt: skip
    for batch in inputs.values():
        ours = fused(**batch)
        assert (ours.logits - base(**batch).logits).abs().max() > 1e-3
        assert (ours.logits - looped(**batch).logits).abs().max() <= 1e-10
    own = list({id(p): p for p, _, _ in pairs}.values())  # each fused A / B once (its experts' slices share it)
    optimizers = (torch.optim.Adam(own, 1e-2), torch.optim.Adam([p for _, _, p in pairs], 1e-2))
    for model in (fused, looped):
        sum(model(**batch).loss for batch in inputs.values()).backward()
    for ours, part, theirs in pairs:
        assert ours.grad[part].abs().max() > 0 and (ours.grad[part] - theirs.grad).abs().max() <= 1e-10
    for optimizer in optimizers:
        optimizer.step()
    for ours, part, theirs in pairs:
        assert (ours.detach()[part] - theirs.detach()).abs().max() <= 1e-10
    batch = inputs["generation"]
    assert (fused(**batch).logits - looped(**batch).logits).abs().max() <= 1e-10


def test_each_task_kind_runs_through_its_own_plugin():
    base = tiny()
    model = HLoRA(**SMALL).prepare(copy.deepcopy(base))
    randomize_b(model, "generation")
    assert torch.equal(logits(model, "comprehension"), logits(base, "comprehension"))
    assert (logits(model, "generation") - logits(base, "generation")).abs().max() > 1e-3
    randomize_b(model, "comprehension")
    assert (logits(model, "comprehension") - logits(base, "comprehension")).abs().max() > 1e-3


def test_rank_not_a_multiple_of_the_experts_is_refused_at_construction():
    with pytest.raises(UserError, match="rank 6 must be a multiple of experts 4"):
        HLoRA(rank=6, experts=4).prepare(tiny())
    HLoRAPlainLoRA(rank=6, experts=4).prepare(tiny())  # plain LoRA has no experts


@dataclass
class Item:
    task: str
    kind: str
    image: torch.Tensor
    question: str
    answer: object


class ToyTask:
    """A task of a few comprehension and generation records for the tiny model (the method's side of the contract)."""

    name = "toy"

    def __init__(self, model: MedVL):
        self.model = model

    def sample_tasks(self, samples):
        return [s.task for s in samples]

    def collate(self, samples, device):
        parts = []
        for kind in ("comprehension", "generation"):
            chosen = [s for s in samples if s.kind == kind]
            if chosen:
                answers = [s.answer for s in chosen]
                answers = answers if kind == "comprehension" else torch.stack(answers)
                batch = self.model.encode_batch(torch.stack([s.image for s in chosen]), [s.question for s in chosen],
                                                answers, kind=kind)  # fmt: skip
                parts.append((batch, len(chosen) / len(samples)))
        return parts

    def loss(self, model, batch, training):
        return sum(share * model(**inputs).loss for inputs, share in batch)


def toy_data(model: MedVL) -> TaskData:
    pictures = images(12, seed=5)
    items = []
    for i in range(12):
        task = ("vqa-closed", "report", "reconstruct", "super-resolution")[i % 4]
        if task in ("reconstruct", "super-resolution"):
            items.append(Item(task, "generation", pictures[i], "reconstruct the image.", pictures[i]))
        else:
            items.append(Item(task, "comprehension", pictures[i], QUESTIONS[i % 3], ANSWERS[i % 3]))
    return TaskData(train=items[:8], val=items[8:], test=[], source="toy")


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def changed(model: nn.Module, before: dict[str, torch.Tensor]) -> set[str]:
    return {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}


def test_the_three_stages_train_what_they_say(tmp_path):
    model = tiny()
    method = HLoRA(**SMALL)
    model = method.prepare(model)
    randomize_b(model)  # so that gradients reach the plug-ins' A and the routers too
    task, data = ToyTask(model), toy_data(model)
    settings = TrainSettings(epochs=1, batch_size=2, learning_rate=1e-2, ema_decay=None, patience=10)
    seen = {}
    before = snapshot(model)
    history = []
    for stage in method.plan(task, model, data, PlanInputs(settings)):  # one stage at a time, as the run does
        start = snapshot(model)
        history += train_stages([stage], task, model, tmp_path / f"{stage.name}.pt", "cpu", False, "hlora", False)
        seen[stage.name] = changed(model, start)
    assert [h["stage"] for h in history] == ["align", "embed", "adapt"]
    assert method.updates([(h["stage"], h["steps"]) for h in history]) == method.updates()  # the trainer's steps
    projectors = {n for n in before if n.startswith("projector_")}
    comprehension = set(lora.plugin_parameters(model, "comprehension"))
    generation = set(lora.plugin_parameters(model, "generation"))
    embed = {"lm.model.embed_tokens.weight", "lm.lm_head.weight"}
    assert seen["align"] and seen["align"] <= projectors | generation and seen["align"] & generation
    assert not seen["align"] & comprehension  # the generation plug-in's stage: comprehension bit-identical
    assert seen["embed"] == embed  # stage 2: only the word embeddings and the LM head
    assert seen["adapt"] & comprehension and seen["adapt"] & generation
    assert seen["adapt"] <= projectors | comprehension | generation
    assert not changed(model, before) & {n for n in before if n.startswith(("vision.", "vq."))}
    state = method.trainable_state(model)  # the plug-ins under the names runs have always saved them by
    assert set(state) == projectors | embed | set(lora.plugin_state(model))
    assert len(lora.plugin_state(model)) == len(comprehension | generation)
    assert "lm.model.layers.0.self_attn.q_proj.plugins.comprehension.lora_A.weight" in state
    fresh = HLoRA(**SMALL)
    rebuilt = fresh.prepare(tiny())
    fresh.load_trainable_state(rebuilt, state)
    for kind in ("comprehension", "generation"):
        assert torch.equal(logits(rebuilt.eval(), kind), logits(model.eval(), kind))


def test_mixed_training_is_one_stage_of_everything(tmp_path):
    method = HLoRAMixed(**SMALL)  # generation-matched: every record and the 4 alignment records again, 1 epoch
    model = method.prepare(tiny())
    settings = TrainSettings(epochs=1, batch_size=4, learning_rate=1e-2, ema_decay=None, patience=10)
    task = ToyTask(model)
    stages = method.plan(task, model, toy_data(model), PlanInputs(settings))
    history = train_stages(stages, task, model, tmp_path / "m.pt", "cpu", False, "x", False)
    assert [(h["stage"], h["steps"]) for h in history] == [("mixed", 3)]
    assert method.updates([(h["stage"], h["steps"]) for h in history]) == method.updates() == dict.fromkeys(GROUPS, 3)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    plugins = set(lora.plugin_parameters(model, "comprehension")) | set(lora.plugin_parameters(model, "generation"))
    state = set(method.trainable_state(model))
    assert trained - plugins == state - set(lora.plugin_state(model)) and len(trained) == len(state)


def test_one_shared_plugin_serves_both_kinds_and_an_unknown_one_is_refused():
    base = tiny()
    shared = lora.apply_plugins(copy.deepcopy(base), ["language"], {"shared": lora.PluginConfig(4, 8, 2)})
    randomize_b(shared)
    for kind in ("comprehension", "generation"):
        assert (logits(shared, kind) - logits(base, kind)).abs().max() > 1e-3
    other = lora.apply_plugins(copy.deepcopy(base), ["language"], {"vision": lora.PluginConfig(4, 8, 2)})
    with pytest.raises(UserError, match="no LoRA plug-in named 'comprehension'"):
        logits(other, "comprehension")


@pytest.mark.parametrize("method", (HLoRA, HLoRAPlainLoRA), ids=lambda m: m.name)
def test_question_answering_only_data_get_the_comprehension_plugin_alone_and_align_on_the_questions(tmp_path, method):
    """A model serving comprehension only (``kinds``, set by the task on QA-only data): no generation plug-in, the
    generation projector frozen, stage 1 ("auto") aligning the comprehension projector on the questions; an
    explicit alignment on sub-tasks the data lack is refused."""
    base = tiny()
    base.kinds = ("comprehension",)
    items = [item for item in toy_data(base).train + toy_data(base).val if item.task == "vqa-closed"]
    data = TaskData(train=items[:2] * 2, val=items[2:], test=[], source="toy")
    hlora = method(**SMALL)
    hlora.check(ToyTask(base), data, base)
    model = hlora.prepare(base)
    randomize_b(model)
    assert lora.plugin_names(model) == ("comprehension",)
    task = ToyTask(model)
    settings = TrainSettings(epochs=1, batch_size=2, learning_rate=1e-2, ema_decay=None, patience=10)
    before = snapshot(model)
    stages = hlora.plan(task, model, data, PlanInputs(settings))
    history = train_stages(stages, task, model, tmp_path / "m.pt", "cpu", False, "qa", False)
    assert [h["stage"] for h in history] == ["align", "embed", "adapt"]
    moved = changed(model, before)
    assert moved & {n for n in before if n.startswith("projector_comprehension.")}
    assert not moved & {n for n in before if n.startswith(("projector_generation.", "vision.", "vq."))}
    state = hlora.trainable_state(model)
    assert not any("generation" in name for name in state)
    count = float(sum(p.numel() for p in lora.plugin_parameters(model, "comprehension").values()))
    updates = {"updates_vision": 4.0, "updates_embed": 2.0, "updates_comprehension": 2.0}  # 2 steps per stage
    assert hlora.diagnostics(task, model, data) == {"plugin_parameters_comprehension": count, **updates}
    with pytest.raises(UserError, match=r"the alignment sub-tasks \['report'\] are not in the training data"):
        method(**SMALL, alignment_tasks="report").check(task, data, tiny())


def planned_updates(method, settings: TrainSettings) -> dict[str, int]:
    """Optimizer updates per parameter group of ``method``'s plan on the toy data, as planned."""
    model = method.prepare(tiny())
    method.plan(ToyTask(model), model, toy_data(model), PlanInputs(settings))
    return method.updates()


def test_the_mixed_stage_takes_the_three_stages_updates_per_parameter_group():
    """Toy data: 8 training records, 4 of them alignment sub-tasks (report, reconstruct), 2 per batch, so the three
    stages take S = 4 steps per epoch on every record and A = 2 on the alignment records (the count is the
    trainer's: `test_the_three_stages_train_what_they_say`, `test_mixed_training_is_one_stage_of_everything`)."""
    settings = TrainSettings(epochs=2, batch_size=2, learning_rate=1e-2, ema_decay=None, patience=10)
    staged = planned_updates(HLoRA(**SMALL), settings)
    assert staged == {"vision": 2 * (2 + 4), "generation": 2 * (2 + 4), "embed": 2 * 4, "comprehension": 2 * 4}
    mixed = planned_updates(HLoRAMixed(**SMALL), settings)  # generation-matched
    assert {g: mixed[g] for g in ("vision", "generation")} == {g: staged[g] for g in ("vision", "generation")}
    assert all(mixed[g] >= staged[g] for g in staged)
    fewer = planned_updates(HLoRAMixed(**SMALL, updates="comprehension-matched"), settings)
    assert {g: fewer[g] for g in ("embed", "comprehension")} == {g: staged[g] for g in ("embed", "comprehension")}
    assert all(fewer[g] <= staged[g] for g in staged)
    tripled = planned_updates(HLoRAMixed(**SMALL, updates="three-times"), settings)
    assert tripled == dict.fromkeys(staged, 3 * 2 * 4)
    with pytest.raises(UserError, match="--updates must be one of"):
        HLoRAMixed(updates="equal")
