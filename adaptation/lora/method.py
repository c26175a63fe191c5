"""Plain LoRA as a workbench method, for every model that declares LoRA target groups."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch
from torch import nn
from workbench.adaptation.lora.config import COMPUTES, CONV_RANKS, INITS, SCALINGS
from workbench.adaptation.lora.model import adapter_state, apply, init_lora_one, load_state, merge, target_names

from workbench.method import Method
from workbench.model import require
from workbench.options import Option
from workbench.registry import methods

HEAD_CHOICES = ("train", "frozen")


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

    ``--init pissa``, ``--scaling rslora`` and ``--dora`` are PEFT's PiSSA, rsLoRA and DoRA (see
    `workbench.adaptation.lora.config`). ``--init lora-one`` sets the adapters in `setup`, before training, from the
    gradient of the task's loss over every training sample (`workbench.adaptation.lora.init_lora_one`, ``--gamma``).
    """

    name = "lora"
    description = "LoRA on the model's declared target groups (conv, qkv, ...), head trained in full (Hu et al., 2022)"
    needs_model = ("adapter_target_groups",)
    learning_rate = 2e-3  # H-Tuning's AdamW rate for its LoRA runs
    options = (
        Option("rank", int, 16, "LoRA rank r of every update"),
        Option("alpha", float, 16.0, "LoRA scale alpha (updates are multiplied by alpha / rank)"),
        Option("dropout", float, 0.0, "dropout probability on each adapter's input"),
        Option(
            "targets",
            str,
            "",
            "comma-separated target group names of the model or fnmatch patterns over module names "
            "(default: every group the model declares)",
        ),
        Option("head", str, "train", "train the model's head in full, or keep it frozen", choices=HEAD_CHOICES),
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
        Option(
            "init",
            str,
            "kaiming",
            "adapter init: 'kaiming' (A Kaiming-uniform, B = 0, PEFT's default), 'pissa' (top-r singular triplets of "
            "each weight, which keeps the residual) or 'lora-one' (top-r singular triplets of one full-batch gradient "
            "over the training samples)",
            choices=INITS,
        ),
        Option(
            "scaling",
            str,
            "standard",
            "update scale: 'standard' (alpha / rank) or 'rslora' (alpha / sqrt(rank))",
            choices=SCALINGS,
        ),
        Option("dora", bool, False, "DoRA: a trained magnitude per output unit times the normalised adapted weight"),
        Option("gamma", float, 128.0, "LoRA-One's gamma: its factors are divided by sqrt(gamma) (--init lora-one)"),
    )
    #: Samples per forward pass while LoRA-One takes its full-batch gradient (the mean is over all of them).
    gradient_chunk = 32

    def check(self, task, data, model: nn.Module) -> None:
        """The model declares LoRA target groups (and a head when ``--head train``); the targets exist."""
        super().check(task, data, model)
        if self.config["head"] == "train":
            require(model, self.name, "head")
        target_names(model, self._targets())

    def _targets(self) -> list[str] | None:
        return [entry.strip() for entry in self.config["targets"].split(",") if entry.strip()] or None

    def prepare(self, model: nn.Module) -> nn.Module:
        train = ()
        if self.config["head"] == "train":
            train = (f"{require(model, self.name, 'head').head}.*",)
        return apply(
            model,
            targets=self._targets(),
            rank=self.config["rank"],
            alpha=self.config["alpha"],
            dropout=self.config["dropout"],
            conv_rank=self.config["conv_rank"],
            train=train,
            compute=self.config["compute"],
            init=self.config["init"],
            scaling=self.config["scaling"],
            dora=self.config["dora"],
        )

    def setup(self, task, model: nn.Module, data, seed: int) -> None:
        """LoRA-One (``--init lora-one``): the adapters from the full-batch gradient of the task's loss (its eval
        form) over the training samples, ``gradient_chunk`` samples per forward pass."""
        if self.config["init"] != "lora-one":
            return
        device = next(model.parameters()).device
        chunks = [data.train[i : i + self.gradient_chunk] for i in range(0, len(data.train), self.gradient_chunk)]
        batches = ((task.collate(chunk, device), len(chunk)) for chunk in chunks)
        init_lora_one(model, lambda m, batch: task.loss(m, batch, False), batches, gamma=self.config["gamma"])

    def trainable_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The adapter and the parameters trained in full by their file names (`adapter_state`: PEFT's, without the
        adapter name), so a run's ``adapter.safetensors`` keeps its names whatever the adapter is called."""
        return {name: p.detach().clone() for name, p in adapter_state(model).items()}

    def load_trainable_state(
        self, model: nn.Module, state: Mapping[str, torch.Tensor], source: str | Path = "<state>"
    ) -> None:
        load_state(model, state, source)

    def merge(self, model: nn.Module) -> nn.Module:
        return merge(model)
