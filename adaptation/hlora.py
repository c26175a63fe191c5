"""H-LoRA (HealthGPT's heterogeneous low-rank adaptation) and its baselines, as workbench methods.

Paper: Lin et al., "HealthGPT: A Medical Large Vision-Language Model for Unifying Comprehension and Generation via
Heterogeneous Knowledge Adaptation" (seed 000; METHODS.md "H-LoRA"). A vision-language model gets two plug-ins of
token-routed low-rank experts on every linear layer of its language model except the output head — one for
comprehension (VQA, reports), one for generation (image tokens) — chosen by the task kind of the batch
(`workbench.adaptation.lora.plugins`; the model activates the plug-in named by the kind of its input). Three
training stages (its `Method.plan`), each ``--epochs`` long:

1. ``align``: the vision adapters (the model's ``projectors`` target group) and the generation plug-in, on the
   alignment sub-tasks (``--alignment-tasks``; by default, "auto", the findings report and reconstruction where the
   training data hold them — HealthGPT aligns on captions and on reconstruction — else every sub-task they hold:
   on question-answering-only data such as VQA-RAD, SLAKE or PathVQA, the vision adapters align on the questions),
   at ``--align-learning-rate``;
2. ``embed``: only the word embeddings and the LM head (whose image-token rows are new), on every sub-task, at
   ``--embed-learning-rate``;
3. ``adapt``: both plug-ins and the vision adapters on every sub-task, at the run's learning rate.

Methods here (the same model, targets and stages; only what differs is named):

- ``hlora``: H-LoRA plug-ins (``k`` experts of ``r / k`` ranks fused in one matmul pair, ``scale = alpha / r · k``);
- ``moelora``: the same experts as ``k`` separate LoRAs computed in a loop (MoELoRA) — the same function and
  parameter count, ``k`` matmul pairs per layer;
- ``hlora-lora``: plain LoRA plug-ins of the same total rank (no router);
- ``hlora-mixed``: H-LoRA trained in one stage with everything the three stages train (HealthGPT's "mixed
  training" comparison), as long as ``--updates`` says (`HLoRAMixed`).

The learning rate of stage 3 (and of the mixed stage) is the run's, 1e-3 by default: HealthGPT trains H-LoRA at
2e-4 on a 3.8B-parameter LM for whole epochs of VL-Health; the tiny model here gets a few epochs per stage.
Ranks are the authors' shape at this model's size: comprehension ``r = 16, alpha = 32``, generation
``r = 32, alpha = 64`` (HealthGPT: 64 / 128 and 256 / 512 on a 3.8B-parameter LM), ``k = 4`` experts.

Data without a generation sub-task (question answering only): a model that names the kinds it serves (``kinds``,
`workbench.models.medvl.MedVL.kinds`, set by the task from the data) gets plug-ins for those kinds only — the
comprehension plug-in alone — and the vision adapters named after an absent kind (``projector_generation``) do not
train; nothing is trained, counted or saved for generation.

The adapter file holds every parameter any stage trained (plug-ins, vision adapters, word embeddings, LM head);
``<run>/<method>/comprehension.safetensors`` and ``generation.safetensors`` hold each plug-in alone, in PEFT's
tensor names (`workbench.adaptation.lora.save_plugin` / ``load_plugin``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

import torch
from torch import nn
from workbench.adaptation.lora import PluginConfig, apply_plugins, save_plugin
from workbench.adaptation.lora.model import target_names
from workbench.adaptation.lora.plugins import plugin_names, plugin_parameters, plugin_state

from workbench.core.checkpoint import check_state_fits
from workbench.core.errors import UserError
from workbench.core.method import Method, PlanInputs, Stage
from workbench.core.model import require
from workbench.core.options import Option
from workbench.core.registry import methods

log = logging.getLogger(__name__)

#: The task kinds the two plug-ins serve.
PLUGINS = ("comprehension", "generation")
STAGES = ("align", "embed", "adapt")
#: The parameter groups the stages train: vision adapters, word embeddings and LM head, and the two plug-ins.
GROUPS = ("vision", "embed", *PLUGINS)
#: How long the mixed stage of `HLoRAMixed` trains (``--updates``).
MIXED_UPDATES = ("generation-matched", "comprehension-matched", "three-times")
#: HealthGPT's alignment sub-tasks (captions, reconstruction): what ``--alignment-tasks auto`` takes where present.
ALIGNMENT_TASKS = ("report", "reconstruct")


@runtime_checkable
class SubTasks(Protocol):
    """A task that names the sub-task of each sample (closed or open VQA, report, reconstruction)."""

    def sample_tasks(self, samples: Sequence[Any]) -> list[str]:
        """The sub-task of each sample, e.g. ``"vqa-closed"``, ``"reconstruct"``."""


class _HeterogeneousLoRA(Method):
    """The shared recipe; subclasses set the plug-ins' adapter kind ``adapter_kind`` and the ``stages``."""

    adapter_kind: ClassVar[str] = "hlora"
    stage_names: ClassVar[tuple[str, ...]] = STAGES
    needs_model = ("adapter_target_groups", "head")
    needs_task = (SubTasks,)
    learning_rate = 1e-3
    options = (
        Option("rank", int, 16, "total rank r of the comprehension plug-in (its experts hold r / k ranks each)"),
        Option("alpha", float, 32.0, "scale numerator of the comprehension plug-in"),
        Option("generation_rank", int, 32, "total rank of the generation plug-in"),
        Option("generation_alpha", float, 64.0, "scale numerator of the generation plug-in"),
        Option("experts", int, 4, "experts k per plug-in (H-LoRA, MoELoRA); unused by plain LoRA"),
        Option("targets", str, "language", "target groups / fnmatch patterns of the plug-ins, comma-separated"),
        Option("vision_adapters", str, "projectors", "target group of the vision adapters (trained in stages 1, 3)"),
        Option(
            "alignment_tasks",
            str,
            "auto",
            "the sub-tasks of the alignment stage, comma-separated; 'auto': report and reconstruct where the data hold "
            "them, else every sub-task they hold",
        ),
        Option("align_learning_rate", float, 1e-3, "learning rate of the alignment stage"),
        Option("embed_learning_rate", float, 1e-3, "learning rate of the embedding stage"),
    )

    def _targets(self) -> list[str]:
        return [entry.strip() for entry in self.config["targets"].split(",") if entry.strip()]

    def _plugins(self, kinds: Sequence[str] = PLUGINS) -> dict[str, PluginConfig]:
        """The plug-in of each of ``kinds``."""
        experts = None if self.adapter_kind == "lora" else self.config["experts"]
        ranks = {
            "comprehension": (self.config["rank"], self.config["alpha"]),
            "generation": (self.config["generation_rank"], self.config["generation_alpha"]),
        }
        ranks = {name: ranks[name] for name in PLUGINS if name in kinds}
        try:
            kind = self.adapter_kind
            return {name: PluginConfig(rank, alpha, experts, kind) for name, (rank, alpha) in ranks.items()}
        except UserError as error:
            raise UserError(f"method '{self.name}': {error}") from None

    def check(self, task, data, model: nn.Module) -> None:
        """The model declares the plug-in targets, the vision adapters, a head and input embeddings; the
        alignment sub-tasks exist in the training data; the plug-in ranks fit their experts."""
        super().check(task, data, model)
        self._plugins(tuple(getattr(model, "kinds", PLUGINS)))
        target_names(model, self._targets())
        target_names(model, [self.config["vision_adapters"]])
        if not callable(getattr(model, "get_input_embeddings", None)):
            raise UserError(f"method '{self.name}' needs a model with word embeddings (get_input_embeddings)")
        if "align" in self.stage_names and self.config["alignment_tasks"] != "auto":
            wanted = self._alignment_tasks(task.sample_tasks(data.train))
            present = set(task.sample_tasks(data.train))
            missing = sorted(set(wanted) - present)
            if missing:
                raise UserError(
                    f"method '{self.name}': the alignment sub-tasks {missing} are not in the training data (it holds "
                    f"{sorted(present)}); choose others with --alignment-tasks, or leave it at 'auto'"
                )

    def _alignment_tasks(self, present: Sequence[str]) -> list[str]:
        """The alignment sub-tasks: the option's list, or for "auto" `ALIGNMENT_TASKS` among ``present``, else every
        sub-task ``present`` (in order of first appearance)."""
        if self.config["alignment_tasks"] != "auto":
            return [entry.strip() for entry in self.config["alignment_tasks"].split(",") if entry.strip()]
        held = list(dict.fromkeys(present))
        return [t for t in ALIGNMENT_TASKS if t in held] or held

    def prepare(self, model: nn.Module) -> nn.Module:
        head = require(model, self.name, "head").head
        kinds = tuple(getattr(model, "kinds", PLUGINS))
        absent = [kind for kind in PLUGINS if kind not in kinds]
        vision = {n for n in target_names(model, [self.config["vision_adapters"]]) if not any(a in n for a in absent)}
        model = apply_plugins(model, self._targets(), self._plugins(kinds))
        self._groups = {
            "vision": [p for name, m in model.named_modules() if name in vision for p in m.parameters()],
            "embed": [model.get_input_embeddings().weight, model.get_submodule(head).weight],
            **{kind: [] for kind in PLUGINS},
            **{name: list(plugin_parameters(model, name).values()) for name in plugin_names(model)},
        }
        self._train_only(model, *self._groups)  # every parameter any stage trains (counted, saved)
        self._model = model
        return model

    def _state(self, model: nn.Module) -> dict[str, nn.Parameter]:
        """The trainable parameters by their names in a run's ``adapter.safetensors`` (the plug-ins' by
        `workbench.adaptation.lora.plugin_state`, the same names as before plug-ins were named adapters)."""
        plugins = plugin_state(model)
        own = {id(p) for p in plugins.values()}
        rest = {name: p for name, p in model.named_parameters() if id(p) not in own}
        return {name: p for name, p in {**rest, **plugins}.items() if p.requires_grad}

    def trainable_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self._state(model).items()}

    def load_trainable_state(self, model: nn.Module, state, source: str | Path = "<state>") -> None:
        params = self._state(model)
        check_state_fits(params, state, source, f"adapter state does not fit this model and method '{self.name}'")
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)

    def _train_only(self, model: nn.Module, *groups: str) -> None:
        model.requires_grad_(False)
        for group in groups:
            for p in self._groups[group]:
                p.requires_grad_(True)

    def _names_of(self, model: nn.Module, *groups: str) -> frozenset[str]:
        """The parameter names of ``groups``."""
        chosen = {id(p) for group in groups for p in self._groups[group]}
        return frozenset(name for name, p in model.named_parameters() if id(p) in chosen)

    def plan(self, task, model: nn.Module, data, inputs: PlanInputs) -> list[Stage]:
        """The stages of ``stage_names``; the last writes each plug-in into ``inputs.outputs`` (`save_plugins`)."""
        loss = partial(self.loss, task)
        settings = inputs.settings
        stages = {
            "embed": lambda: Stage("embed", data.train, data.val,
                                   replace(settings, learning_rate=self.config["embed_learning_rate"]), loss,
                                   self._names_of(model, "embed")),  # fmt: skip
            "adapt": lambda: Stage("adapt", data.train, data.val, settings, loss,
                                   self._names_of(model, "vision", "comprehension", "generation")),  # fmt: skip
            "mixed": lambda: self._mixed_stage(task, model, data, settings),
            "align": lambda: self._align_stage(task, model, data, settings),
        }
        plan = [stages[name]() for name in self.stage_names]
        if inputs.outputs is not None:
            plan[-1] = replace(plan[-1], on_end=partial(self.save_plugins, inputs.outputs))
        self._plan = [(stage, self._groups_in(model, stage)) for stage in plan]
        return plan

    def _groups_in(self, model: nn.Module, stage: Stage) -> tuple[str, ...]:
        """The groups of `GROUPS` the model carries that ``stage`` trains."""
        trainable = set(stage.trainable)
        return tuple(g for g in GROUPS if self._groups[g] and self._names_of(model, g) <= trainable)

    def updates(self, steps: Sequence[tuple[str, int]] | None = None) -> dict[str, int]:
        """Optimizer updates each parameter group (`GROUPS`) takes in the last plan: from ``steps``, the
        ``(stage name, optimizer steps)`` of each epoch a trainer ran (its history), or else as planned (every epoch
        of every stage: ``ceil(records / batch size)`` steps, as `workbench.core.trainer.Trainer` takes them). These are
        the steps a group trains in; a plug-in whose kind a batch lacks has no gradient there and Adam skips it, in
        the three stages as in the mixed one."""
        if steps is None:
            steps = [(stage.name, math.ceil(len(stage.train) / stage.settings.batch_size))
                     for stage, _ in self._plan for _ in range(stage.settings.epochs)]  # fmt: skip
        trained = {stage.name: groups for stage, groups in self._plan}
        counts = dict.fromkeys([g for g in GROUPS if self._groups[g]], 0)
        for name, taken in steps:
            for group in trained[name]:
                counts[group] += taken
        return counts

    def _align_stage(self, task, model: nn.Module, data, settings) -> Stage:
        """Stage 1: the vision adapters and the generation plug-in on the alignment sub-tasks."""
        train, val = self._alignment_records(task, data)
        settings = replace(settings, learning_rate=self.config["align_learning_rate"],
                           batch_size=min(settings.batch_size, len(train)))  # fmt: skip
        trained = self._names_of(model, "vision", "generation")
        return Stage("align", train, val, settings, partial(self.loss, task), trained)

    def _mixed_stage(self, task, model: nn.Module, data, settings) -> Stage:
        """One stage of every group at the run's learning rate, on the records and for the epochs ``--updates``
        names (`HLoRAMixed`)."""
        updates = self.config["updates"]
        train = data.train
        if updates == "generation-matched":
            train = [*self._alignment_records(task, data)[0], *data.train]
        epochs = 3 * settings.epochs if updates == "three-times" else settings.epochs
        trained = self._names_of(model, *GROUPS)
        return Stage("mixed", train, data.val, replace(settings, epochs=epochs), partial(self.loss, task), trained)

    def _alignment_records(self, task, data) -> tuple[list, list]:
        """(training, validation) records of the alignment sub-tasks (validation: all of it where it holds none)."""
        present = task.sample_tasks(data.train)
        wanted = set(self._alignment_tasks(present))
        if self.config["alignment_tasks"] == "auto" and not wanted & set(ALIGNMENT_TASKS):
            log.warning(
                "%s: the training data hold no %s sub-task (alignment 'auto'): stage 1 aligns the vision adapters "
                "on %s instead",
                self.name,
                " or ".join(ALIGNMENT_TASKS),
                ", ".join(sorted(wanted)),
            )
        train = [s for s, t in zip(data.train, present) if t in wanted]
        val = [s for s, t in zip(data.val, task.sample_tasks(data.val)) if t in wanted] or data.val
        return train, val

    def save_plugins(self, folder: Path) -> None:
        """Each plug-in as its own file, ``<run>/<method>/<plug-in>.safetensors`` (`workbench.adaptation.lora.
        load_plugin` reads it into a model carrying the same plug-ins: HealthGPT's swappable plug-ins)."""
        folder.mkdir(parents=True, exist_ok=True)
        for name in plugin_names(self._model):
            save_plugin(self._model, name, folder / f"{name}.safetensors")

    def diagnostics(self, task, model: nn.Module, data) -> dict[str, float]:
        """Each plug-in's parameter count and each group's planned optimizer updates (`updates`; a stage stopped
        early takes fewer)."""
        sizes = {f"plugin_parameters_{name}": float(sum(p.numel() for p in self._groups[name]))
                 for name in plugin_names(self._model)}  # fmt: skip
        return {**sizes, **{f"updates_{group}": float(count) for group, count in self.updates().items()}}


@methods.register
class HLoRA(_HeterogeneousLoRA):
    name = "hlora"
    description = "H-LoRA: comprehension and generation plug-ins of fused routed experts, three stages (HealthGPT)"


@methods.register
class MoELoRA(_HeterogeneousLoRA):
    name = "moelora"
    description = "MoELoRA plug-ins: the same experts as separate LoRAs in a loop, three stages"
    adapter_kind = "moelora"


@methods.register
class HLoRAPlainLoRA(_HeterogeneousLoRA):
    name = "hlora-lora"
    description = "plain LoRA plug-ins of the same total rank as H-LoRA's, three stages"
    adapter_kind = "lora"


@methods.register
class HLoRAMixed(_HeterogeneousLoRA):
    """H-LoRA trained in one mixed stage: the vision adapters, word embeddings, LM head and both plug-ins at once,
    at the run's learning rate (HealthGPT's "mixed training" beside its three stages).

    In one stage every trained group takes every optimizer step, while the three stages (``E = --epochs`` each,
    ``S`` steps per epoch on every training record, ``A`` on the alignment records) give the vision adapters and
    the generation plug-in ``E·(A + S)`` updates but the comprehension plug-in and the embeddings ``E·S``: one
    stage can match one of the two counts, never both. ``--updates`` says which (`updates` counts them):

    - ``generation-matched`` (default): the records of stages 1 and 3 together (every record, plus the alignment
      records once more), shuffled into one stage of ``E`` epochs: the vision adapters and the generation plug-in
      take the three stages' updates (to one step per epoch, from the batch rounding), the comprehension plug-in
      and the embeddings ``(A + S) / S`` times theirs. No group takes fewer updates than in the three stages.
    - ``comprehension-matched``: every record, ``E`` epochs: the comprehension plug-in and the embeddings take the
      three stages' updates, the vision adapters and the generation plug-in ``S / (A + S)`` of theirs. No group
      takes more.
    - ``three-times``: every record, ``3·E`` epochs (the comparison before issue 26): every group takes ``3·E·S``,
      ``3·S / (A + S)`` to 3 times the three stages' updates (2.4–3 on the embedded data, where ``A ≈ S / 4``).

    Not equal in any of them: the total optimizer steps (the three stages take ``E·(A + 2·S)``, the mixed stage
    ``E·(A + S)``, ``E·S`` or ``3·E·S``) and the learning rates (the mixed stage takes the run's throughout).
    """

    name = "hlora-mixed"
    description = "H-LoRA trained in one mixed stage (everything at once; --updates: how long)"
    stage_names = ("mixed",)
    options = (
        *_HeterogeneousLoRA.options,
        Option(
            "updates",
            str,
            MIXED_UPDATES[0],
            "length of the mixed stage: generation-matched (the vision adapters and generation plug-in take the "
            "three stages' optimizer updates, the rest more), comprehension-matched (the comprehension plug-in and "
            "embeddings take theirs, the rest fewer), three-times (every record for 3 x --epochs)",
            choices=MIXED_UPDATES,
        ),
    )
