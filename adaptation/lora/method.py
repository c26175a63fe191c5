"""Plain LoRA as a workbench method, for every model that declares LoRA target groups."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn
from workbench.adaptation.lora import variants
from workbench.adaptation.lora.config import (
    COMPUTES,
    CONV_RANKS,
    INITS,
    OBJECTIVES,
    REPARAMS,
    SCALINGS,
    LoraConfig,
)
from workbench.adaptation.lora.flat import flat_stage
from workbench.adaptation.lora.model import (
    adapter_state,
    apply_config,
    check_config,
    init_lora_one,
    load_state,
    lora_layers,
    merge,
    target_names,
)

from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.method import Method, PlanInputs, Stage
from workbench.core.model import require
from workbench.core.options import Option
from workbench.core.registry import methods

HEAD_CHOICES = ("train", "frozen")
#: The options every method that adapts the model's declared target groups shares (LoRA, LIFT).
TARGETS_OPTION = Option(
    "targets",
    str,
    "",
    "comma-separated target group names of the model or fnmatch patterns over module names "
    "(default: every group the model declares)",
)
HEAD_OPTION = Option("head", str, "train", "train the model's head in full, or keep it frozen", choices=HEAD_CHOICES)
#: The inits and scales of plain LoRA adapters: every one but GOAT's, which needs its routed experts (``--init goat``
#: of the ``lora`` method).
PLAIN_INITS = tuple(init for init in INITS if init != "goat")
PLAIN_SCALINGS = tuple(scaling for scaling in SCALINGS if scaling != "goat")
#: The refinements of plain LoRA every method built on this package takes (`workbench.adaptation.lora.config`);
#: GOAT's init and scale are the ``lora`` method's alone (`GOAT_INIT`, `GOAT_SCALING`).
REFINEMENT_OPTIONS = (
    Option(
        "init",
        str,
        "kaiming",
        "adapter init: 'kaiming' (A Kaiming-uniform, B = 0, PEFT's default), 'pissa' (top-r singular triplets of "
        "each weight, which keeps the residual) or 'lora-one' (top-r singular triplets of one full-batch gradient "
        "over the training samples)",
        choices=PLAIN_INITS,
        refused={"goat": "GOAT's routed experts are method lora's (--method lora --init goat)"},
    ),
    Option(
        "lora_scaling",
        str,
        "standard",
        "update scale: 'standard' (alpha / rank) or 'rslora' (alpha / sqrt(rank)); named apart from the tasks' "
        "input --scaling",
        choices=PLAIN_SCALINGS,
        refused={"goat": "GOAT's scale belongs to its routed experts (--method lora --init goat --lora-scaling goat)"},
        renamed_from=("scaling", "0.1"),
    ),
    Option(
        "dora",
        bool,
        False,
        "DoRA: a trained magnitude per output unit times the normalised adapted weight",
        requires={True: {"init": PLAIN_INITS}},
    ),
    Option("gamma", float, 128.0, "LoRA-One's gamma: its factors are divided by sqrt(gamma) (--init lora-one)"),
    Option(
        "reparam",
        str,
        "none",
        "'replora': the factors come out of a light MLP shared by A and B (RepLoRA); 'none': as they are",
        choices=REPARAMS,
        requires={"replora": {"init": ("kaiming",), "dora": (False,)}},
    ),
)
#: The ``lora`` method's ``--init`` and ``--lora-scaling``: plain LoRA's and GOAT's (``--lora-scaling goat`` with
#: ``--init goat`` only).
GOAT_INIT = dataclasses.replace(
    REFINEMENT_OPTIONS[0],
    help="adapter init: 'kaiming' (A Kaiming-uniform, B = 0, PEFT's default), 'pissa' (top-r singular triplets of "
    "each weight, which keeps the residual), 'lora-one' (top-r singular triplets of one full-batch gradient over the "
    "training samples) or 'goat' (GOAT: top-k routed experts from segments of each weight's SVD)",
    choices=INITS,
    refused={},
)
GOAT_SCALING = dataclasses.replace(
    REFINEMENT_OPTIONS[1],
    help="update scale: 'standard' (alpha / rank), 'rslora' (alpha / sqrt(rank)) or 'goat' (GOAT's sqrt(3 n_in / "
    "expert rank)); named apart from the tasks' input --scaling",
    choices=SCALINGS,
    refused={},
    requires={"goat": {"init": ("goat",)}},
)
#: Samples per forward pass while LoRA-One takes its full-batch gradient (the mean is over all of them).
GRADIENT_CHUNK = 32


#: GOAT's options (``--init goat``), the authors' values: 8 experts, 2 per token, load-balancing weight 1e-3.
GOAT_OPTIONS = (
    Option("experts", int, 8, "GOAT's experts per layer (--init goat; rank must be a multiple)"),
    Option("top_k", int, 2, "GOAT's experts each token is sent to (--init goat)"),
    Option("goat_aux", float, 1e-3, "weight of GOAT's load-balancing loss added to the task's loss (--init goat)"),
)


def refinements(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `apply` keywords of a method's `REFINEMENT_OPTIONS`."""
    return {"scaling": config["lora_scaling"], **{name: config[name] for name in ("init", "dora", "reparam")}}


def checked_config(method: str, config: Mapping[str, Any], **arguments: Any) -> LoraConfig:
    """The `LoraConfig` of a method's options (``config``: its `REFINEMENT_OPTIONS` among them; ``arguments``: the
    other `LoraConfig` fields), refused as one of ``method`` when it is not one — before any model is seen."""
    if config["gamma"] <= 0:
        raise UserError(f"method '{method}': --gamma must be positive (LoRA-One divides by sqrt(gamma)), got "
                        f"{config['gamma']}")  # fmt: skip
    try:
        return LoraConfig(**refinements(config), **arguments)
    except UserError as error:
        raise UserError(f"method '{method}': {error}") from None


def init_from_task_gradient(task, model: nn.Module, data, gamma: float) -> None:
    """LoRA-One's factors (`init_lora_one`) from the full-batch gradient of the task's loss (its eval form) over the
    training samples, `GRADIENT_CHUNK` samples per forward pass."""
    device = device_of(model)
    chunks = [data.train[i : i + GRADIENT_CHUNK] for i in range(0, len(data.train), GRADIENT_CHUNK)]
    batches = ((task.collate(chunk, device), len(chunk)) for chunk in chunks)
    init_lora_one(model, lambda m, batch: task.loss(m, batch, False), batches, gamma=gamma)


@methods.register
class LoRA(Method):
    """LoRA (Hu et al., ICLR 2022) on the model's declared target groups; the model's head trains in full.

    `prepare`: `workbench.adaptation.lora.apply` with ``rank`` 16 and ``alpha`` 16 (scale 1, H-Tuning's setting
    for its ECG runs) on every group of the model's ``adapter_target_groups`` (or the ``targets`` given: group names or
    fnmatch patterns over module names, comma-separated), dropout on the adapters' input, and — with ``head``
    ``train`` (default) — the model's declared head trained in full; everything else frozen. `merge` folds the
    adapters into the weights and returns a model of the original classes.

    ``compute`` defaults to ``weight`` (``(W + ΔW) x`` in one op, loralib's conv LoRA, as the ``htuning`` method): the
    workbench's signal models are small convolutions over long signals, where the input way (PEFT's, ``--compute
    input``) costs more. Measured on the shipped ECG teacher (``benchmarks/ecg_htuning.py``, one training step of 32
    records, one CPU thread): 37.8 MiB and 1.0× full fine-tuning's step time (weight) vs 41.5 MiB and 1.6× (input).
    The function is the same either way; with ``--dropout`` > 0 training runs the input way (dropout acts on the
    adapter's input).

    ``--init pissa``, ``--lora-scaling rslora`` and ``--dora`` are PEFT's PiSSA, rsLoRA and DoRA (see
    `workbench.adaptation.lora.config`). ``--init lora-one`` sets the adapters in `setup`, before training, from the
    gradient of the task's loss over every training sample (`workbench.adaptation.lora.init_lora_one`, ``--gamma``).

    ``--init goat`` is GOAT (`workbench.adaptation.lora.layer`): ``--experts`` experts of ``rank / experts`` ranks on
    every linear layer of the targets (its router works token by token, so convolutions are left out when no
    ``--targets`` are given; naming one is refused), each token sent to ``--top-k`` of them, the experts set from
    segments of each weight's SVD; its step adds ``--goat-aux`` times the layers' load-balancing loss to the task's
    loss. ``--lora-scaling goat`` is GOAT's derived scale. GOAT's update depends on the input: `merge` leaves it
    unmerged (the adapted model runs as it is).

    ``--reparam replora`` computes with RepLoRA's MLP of the factors (`workbench.adaptation.lora.layer`).
    ``--objective flat-lora`` trains on Flat-LoRA's loss (`workbench.adaptation.lora.flat`): each step's forward and
    backward run at the merged weights perturbed by noise drawn from ``seed · 1_000_003 + step`` with
    ``σ_t = flat_sigma (1 − cos(π t / T)) / 2`` over the run's ``T`` steps; validation and evaluation see the
    unperturbed model. Its step fills the gradients itself, so fp16 loss scaling does not apply to it.
    """

    name = "lora"
    description = "LoRA on the model's declared target groups (conv, qkv, ...), head trained in full (Hu et al., 2022)"
    needs_model = ("adapter_target_groups",)
    learning_rate = 2e-3  # H-Tuning's AdamW rate for its LoRA runs
    options = (
        Option("rank", int, 16, "LoRA rank r of every update"),
        Option("alpha", float, 16.0, "LoRA scale alpha (updates are multiplied by alpha / rank)"),
        Option("dropout", float, 0.0, "dropout probability on each adapter's input"),
        TARGETS_OPTION,
        HEAD_OPTION,
        Option(
            "conv_rank",
            str,
            "peft",
            "rank of convolutions: 'peft' (= rank) or 'rule' (largest power of 2 whose adapter is not larger than "
            "the weight)",
            choices=CONV_RANKS,
        ),
        Option(
            "compute",
            str,
            "weight",
            "'weight': (W + BA) x in one op (less memory and time on convolutions over long signals); 'input': "
            "W x + B A x, as PEFT (less for large linear layers); the same function",
            choices=COMPUTES,
        ),
        GOAT_INIT,
        GOAT_SCALING,
        *REFINEMENT_OPTIONS[2:],
        Option(
            "objective",
            str,
            "plain",
            "'flat-lora': the loss at the merged weights perturbed by seeded noise (Flat-LoRA); 'plain': the loss",
            choices=OBJECTIVES,
            requires={"flat-lora": {"init": PLAIN_INITS}},
        ),
        Option("flat_sigma", float, 0.05, "Flat-LoRA's relative noise size sigma (the authors' rho)"),
        *GOAT_OPTIONS,
    )

    def __init__(self, **options: Any):
        """The options, checked before any model is seen (the variants' share, e.g. GOAT's experts, and the adapters'
        configuration); whether the adapters are routed (input-dependent: linear targets only, no merged form)."""
        super().__init__(**options)
        self._routed = self._config(targets=None, train=()).adapter(self.config["rank"]).routed

    def _config(self, targets: list[str] | None, train: tuple[str, ...]) -> LoraConfig:
        """What `prepare` applies (`checked_config`; the variants' `method_arguments` over the plain defaults)."""
        arguments = {"compute": self.config["compute"], "kind": None, "experts": None}
        arguments.update(variants.method_arguments(self.config))
        return checked_config(
            self.name,
            self.config,
            targets=targets,
            rank=self.config["rank"],
            alpha=self.config["alpha"],
            dropout=self.config["dropout"],
            conv_rank=self.config["conv_rank"],
            train=train,
            objective=self.config["objective"],
            flat_sigma=self.config["flat_sigma"],
            top_k=self.config["top_k"],
            **arguments,
        )

    def check(self, task, data, model: nn.Module) -> None:
        """The model declares LoRA target groups (and a head when ``--head train``); the adapters fit the targets."""
        super().check(task, data, model)
        if self.config["head"] == "train":
            require(model, self.name, "head")
        check_config(model, self._config(self._targets(model), ()))

    def _targets(self, model: nn.Module) -> list[str] | None:
        """The ``targets`` option's entries (None: every declared group); routed adapters (GOAT) without ``targets``:
        the linear layers of every declared group."""
        chosen = [entry.strip() for entry in self.config["targets"].split(",") if entry.strip()] or None
        if chosen is None and self._routed:
            modules = dict(model.named_modules())
            return [name for name in target_names(model, None) if isinstance(modules[name], nn.Linear)]
        return chosen

    def prepare(self, model: nn.Module) -> nn.Module:
        train = ()
        if self.config["head"] == "train":
            train = (f"{require(model, self.name, 'head').head}.*",)
        return apply_config(model, self._config(self._targets(model), train))

    def setup(self, task, model: nn.Module, data, seed: int) -> None:
        """LoRA-One (``--init lora-one``): the adapters from the task's full-batch gradient
        (`init_from_task_gradient`). Keeps ``seed`` for Flat-LoRA's noise."""
        self._seed = seed
        if self.config["init"] == "lora-one":
            init_from_task_gradient(task, model, data, self.config["gamma"])

    def plan(self, task, model: nn.Module, data, inputs: PlanInputs) -> list[Stage]:
        """One stage; with ``--objective flat-lora`` its step is Flat-LoRA's (`flat.flat_stage`), with a variant that
        keeps an auxiliary loss (``--init goat``) `aux_step`."""
        stages = super().plan(task, model, data, inputs)
        aux_weight = variants.aux_loss_weight(self.config)
        if aux_weight is not None:
            return [dataclasses.replace(stages[0], gradients=functools.partial(self.aux_step, task, aux_weight))]
        if self.config["objective"] != "flat-lora":
            return stages
        seed = getattr(self, "_seed", inputs.settings.seed)
        return [flat_stage(stages[0], task, len(data.train), inputs.settings, self.config["flat_sigma"], seed)]

    def aux_step(self, task, weight: float, model: nn.Module, batch: Any, step: int) -> torch.Tensor:
        """The task's training loss plus ``weight`` times the sum of the layers' auxiliary losses of this forward
        (GOAT's load balancing, ``goat_aux``: the authors' trainer), backpropagated; returns the detached task loss."""
        loss = task.loss(model, batch, True)
        balance = sum(layer.take_balance_loss() for layer in lora_layers(model).values())
        (loss + weight * balance).backward()
        return loss.detach()

    def trainable_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The adapter and the parameters trained in full by their file names (`adapter_state`: PEFT's, without the
        adapter name), so a run's ``adapter.safetensors`` keeps its names whatever the adapter is called."""
        return {name: p.detach().clone() for name, p in adapter_state(model).items()}

    def load_trainable_state(
        self, model: nn.Module, state: Mapping[str, torch.Tensor], source: str | Path = "<state>"
    ) -> None:
        load_state(model, state, source)

    def merge(self, model: nn.Module) -> nn.Module:
        """The adapters folded into the weights; routed experts (GOAT's) have no merged form: the model as it is."""
        return model if self._routed else merge(model)
