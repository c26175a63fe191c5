"""PhysioPFM as workbench methods: the generated LoRA (``physiopfm``) and the baselines it is measured against.

Stages (the chosen method writes each one's output to ``<run>/physiopfm/``):

(a) the bank (`workbench.adaptation.physiopfm.bank`): rank-4 LoRAs fitted on source sub-tasks with the fixed ETF
    head — read from the task's shipped bank (``--bank`` for another), every entry of the target's own site left
    out, and refused when one was fitted on the target's own records (same sha256);
(b) descriptors (`workbench.adaptation.physiopfm.descriptors`): per-class PIP shapelets of each sub-task and of the
    site's labelled examples (train and validation patients);
(c) the generator (`workbench.adaptation.physiopfm.generator`): a conditional diffusion transformer over the
    flattened factors, or the plain conditional regressor (``--generator regressor``), fitted on the bank — some
    entries held out to measure how close generated updates come to fitted ones (``delta_cosine_held_out``);
(d) the site: its descriptor → generated factors → written into the adapters → merged → predict. No gradient
    step runs on the site's data (everything in `PhysioPFM.adapt_site` runs under ``torch.no_grad``; tested).

Baselines (same head, same adapters): ``physiopfm-none`` (the frozen backbone with the ETF head),
``physiopfm-mean`` (the mean of the bank's factors), ``physiopfm-nearest`` (the bank entry with the nearest
descriptor, or with ``--choose-by labelled_accuracy`` the entry whose forward passes score best on the site's
labelled beats: the backprop-free selection baseline) — all choosing from the entries the generator is fitted on
(``--held-out`` leaves the same entries, drawn with the seed, out of every variant) — and ``physiopfm-local`` (the
same LoRA trained by backprop on the site's labelled examples: the upper bound). Metrics of the site's adaptation
itself: ``site_adaptation_seconds`` and ``site_adaptation_memory_bytes`` (what the stage added to the process at its
peak), beside ``generator_fit_seconds`` and ``generator_fit_memory_bytes``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn
from workbench.adaptation import lora
from workbench.adaptation.physiopfm.bank import (
    LORA_SETTINGS,
    Bank,
    attach,
    backbone_fingerprint,
    check_bank_fits,
    delta_of,
    load_bank,
    lora_scale,
)
from workbench.adaptation.physiopfm.descriptors import DESCRIPTOR_KINDS, class_prototypes, task_descriptor
from workbench.adaptation.physiopfm.etf import EtfHead
from workbench.adaptation.task_needs import ClassLabels, InputVectors

from workbench.core import reuse
from workbench.core.checkpoint import save_tensors, write_json
from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.memory import PeakMemory
from workbench.core.method import Method, PlanInputs, Stage
from workbench.core.model import require
from workbench.core.options import Option
from workbench.core.registry import methods

if TYPE_CHECKING:
    from workbench.core.task import Task, TaskData

log = logging.getLogger(__name__)
GENERATORS = ("diffusion", "regressor")


@runtime_checkable
class LoraBank(Protocol):
    """A task that ships a bank of LoRA adaptations of its default model to source sub-tasks."""

    def lora_bank(self) -> Path:
        """The bank file (`workbench.adaptation.physiopfm.bank`)."""


class _BankMethod(Method):
    """What every PhysioPFM variant shares: the ETF head and the bank's LoRA on the model, the bank, the site's
    descriptor. Subclasses choose the factors (`choose_factors`)."""

    model_families = ()
    needs_model = ("head", "adapter_target_groups")
    needs_task = (InputVectors, ClassLabels, LoraBank)
    options = (
        Option("bank", str, "", "a bank file (default: the task's shipped bank)"),
        Option("bank_sites", str, "", "comma-separated bank sites to use (default: every site but the target's)"),
        Option(
            "descriptor",
            str,
            "shapelet",
            "what describes a task: PIP shapelets or the raw class series",
            choices=DESCRIPTOR_KINDS,
        ),  # fmt: skip
        Option("shapelet_points", int, 12, "perceptually important points per class shapelet"),
        Option("shapelet_length", int, 32, "samples of each class shapelet"),
        Option(
            "held_out",
            float,
            0.1,
            "share of the bank left out of every variant (drawn with the seed), to score the generated updates on",
        ),  # fmt: skip
    )

    def __init__(self, **options):
        """The options, checked before any model or bank is seen."""
        super().__init__(**options)
        if not 0 <= self.config.get("held_out", 0) < 1:  # every variant that leaves a share of the bank out
            raise UserError(f"method '{self.name}': --held-out must be in [0, 1), got {self.config['held_out']}")

    def check(self, task: "Task", data: "TaskData", model: nn.Module) -> None:
        super().check(task, data, model)
        spec = require(model, self.name, *self.needs_model)
        n_classes = model.get_submodule(spec.head).out_features
        bank = self._bank(task)
        n_times = task.sample_inputs(data.train[:1]).shape[1]
        check_bank_fits(bank, backbone_fingerprint(model, LORA_SETTINGS["targets"]), n_classes, n_times)
        self._usable(bank, data)
        self.descriptor(*self.site_prototypes(task, data, n_classes))  # series shorter than a shapelet, NaN

    def _bank(self, task: "Task") -> Bank:
        return load_bank(self.config["bank"] or task.lora_bank())

    def _usable(self, bank: Bank, data: "TaskData") -> Bank:
        """The entries of the chosen sites; refused when one was fitted on the target's own records."""
        target = data.summary.get("site")
        chosen = [s.strip() for s in self.config["bank_sites"].split(",") if s.strip()]
        unknown = sorted(set(chosen) - set(bank.sites()))
        if unknown:
            raise UserError(f"--bank-sites: {unknown} are not in the bank {bank.source} (its sites: {bank.sites()})")
        sites = chosen or [s for s in bank.sites() if s != target]
        usable = bank.select([i for i, e in enumerate(bank.entries) if e.provenance["site"] in sites])
        own = set(data.summary.get("record_sha256", {}).values())
        for entry in usable.entries:
            shared = own & set(entry.provenance.get("record_sha256", {}).values())
            if shared:
                raise UserError(
                    f"{bank.source}: the bank contains the target site: entry {entry.provenance['name']} (site "
                    f"{entry.provenance['site']}) was fitted on {len(shared)} of the target's own records; leave that "
                    "site out (--bank-sites)"
                )
        if len(usable.entries) < 2:
            raise UserError(f"{bank.source}: {len(usable.entries)} entries of sites {sites}; the method needs ≥ 2")
        return usable

    def prepare(self, model: nn.Module) -> nn.Module:
        head = model.get_submodule(require(model, self.name, "head").head)
        return attach(model, head.out_features, self.name)

    def descriptor(self, prototypes: np.ndarray, counts: np.ndarray) -> np.ndarray:
        c = self.config
        return task_descriptor(prototypes, counts, c["descriptor"], c["shapelet_points"], c["shapelet_length"])

    def site_prototypes(self, task: "Task", data: "TaskData", n_classes: int) -> tuple[np.ndarray, np.ndarray]:
        """Class prototypes and counts of the site's labelled examples (train and validation)."""
        labelled = list(data.train) + list(data.val)
        series = task.sample_inputs(labelled)
        labels = task.batch_labels(task.collate(labelled, torch.device("cpu"))).numpy()
        return class_prototypes(series, labels, n_classes)

    def setup(self, task: "Task", model: nn.Module, data: "TaskData", seed: int) -> None:
        """Stages (a)-(c) on the bank, then (d) at the site, each with its own time and peak memory (the run's
        ``training_memory_bytes`` of this method is then the site stage's: the last window measured)."""
        self.bank = self._usable(self._bank(task), data)
        self.held, self.fit_index = self.bank_split(len(self.bank.entries), seed)
        self.n_classes = next(m for m in model.modules() if isinstance(m, EtfHead)).n_classes
        self.diagnostics_ = {"bank_entries": float(len(self.fit_index))}
        device = device_of(model)
        with PeakMemory(device) as memory:
            self.fit(seed)
        self.diagnostics_["generator_fit_memory_bytes"] = float(memory.added_bytes or memory.peak_bytes)
        start = time.perf_counter()
        with PeakMemory(device) as memory, torch.no_grad():
            self.adapt_site(task, model, data, seed)
        self.diagnostics_["site_adaptation_seconds"] = time.perf_counter() - start
        self.diagnostics_["site_adaptation_memory_bytes"] = float(memory.added_bytes or memory.peak_bytes)

    def bank_split(self, n_entries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(held-out, used) entry indices: ``held_out`` of the ``n_entries`` (at least one when above 0), drawn with
        ``seed``; every variant with the same seed uses the same entries."""
        order = np.random.default_rng(seed).permutation(n_entries)
        n_held = max(1, round(self.config["held_out"] * n_entries)) if self.config["held_out"] > 0 else 0
        return order[:n_held], order[n_held:]

    def used_entries(self) -> list:
        """The bank entries this variant chooses from (the held-out ones left out)."""
        return [self.bank.entries[i] for i in self.fit_index]

    def fit(self, seed: int) -> None:
        """Whatever the variant learns from the bank before it meets the site (nothing by default)."""

    def adapt_site(self, task: "Task", model: nn.Module, data: "TaskData", seed: int) -> None:
        """The site's descriptor → factors → written into the model's adapters (no gradient)."""
        prototypes, counts = self.site_prototypes(task, data, self.n_classes)
        self.site = {"prototypes": prototypes, "counts": counts, "descriptor": self.descriptor(prototypes, counts)}
        vectors = self.choose_factors(self.site["descriptor"], seed)
        if vectors.ndim == 2:
            vectors = vectors[self.best_on_labelled(task, model, data, vectors)]
        if not torch.isfinite(vectors).all():
            raise UserError(f"method '{self.name}': the generated LoRA weights are not finite; not merged")
        lora.set_adapter_weights(model, self.bank.factors_of(vectors))

    def choose_factors(self, descriptor: np.ndarray, seed: int) -> torch.Tensor:
        """The factors (P,) for the site, or candidates (m, P) that `best_on_labelled` chooses from."""
        raise NotImplementedError

    def best_on_labelled(self, task: "Task", model: nn.Module, data: "TaskData", candidates: torch.Tensor) -> int:
        """Index of the candidate factors (m, P) whose model scores the highest balanced accuracy on the site's
        labelled examples (train and validation), by forward passes only (the first of equals); its score goes to
        ``selected_labelled_balanced_accuracy``."""
        from workbench.core.metrics import balanced_accuracy

        labelled = list(data.train) + list(data.val)
        parameter = next(model.parameters())
        series = torch.as_tensor(task.sample_inputs(labelled), dtype=parameter.dtype, device=parameter.device)
        labels = task.batch_labels(task.collate(labelled, torch.device("cpu"))).numpy()
        model.eval()
        scores = []
        with torch.no_grad():
            for vector in candidates:
                lora.set_adapter_weights(model, self.bank.factors_of(vector))
                predicted = torch.cat([model(series[i : i + 512]).argmax(1) for i in range(0, len(series), 512)])
                scores.append(balanced_accuracy(labels, predicted.cpu().numpy()))
        best = int(np.argmax(scores))
        self.diagnostics_.update({"selected_candidate": float(best), "candidates": float(len(scores)),
                                  "selected_labelled_balanced_accuracy": float(scores[best])})  # fmt: skip
        return best

    def plan(self, task: "Task", model: nn.Module, data: "TaskData", inputs: PlanInputs) -> list[Stage]:
        """No training stage: the factors were chosen in ``setup``."""
        return []

    def diagnostics(self, task: "Task", model: nn.Module, data: "TaskData") -> dict[str, float]:
        return dict(self.diagnostics_)

    def trainable_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The adapters' factors (nothing trains, but they are what the method made)."""
        return {name: p.detach().clone() for name, p in lora.adapter_state(model).items()}

    def load_trainable_state(self, model: nn.Module, state: Mapping[str, torch.Tensor], source="<state>") -> None:
        own = lora.adapter_state(model)
        if set(own) != set(state):
            raise UserError(f"{source}: its tensors are not this model's adapters (method '{self.name}')")
        with torch.no_grad():
            for name, value in state.items():
                own[name].copy_(value)

    def merge(self, model: nn.Module) -> nn.Module:
        return lora.merge(model)


@methods.register
class FrozenEtf(_BankMethod):
    name = "physiopfm-none"
    description = "PhysioPFM's no-LoRA baseline: the frozen backbone read by the fixed simplex-ETF head"

    def choose_factors(self, descriptor: np.ndarray, seed: int) -> torch.Tensor:
        return torch.zeros_like(self.bank.entries[0].vector())


@methods.register
class BankMean(_BankMethod):
    name = "physiopfm-mean"
    description = "PhysioPFM's mean-of-bank baseline: the mean of the bank's LoRA factors, ETF head"

    def choose_factors(self, descriptor: np.ndarray, seed: int) -> torch.Tensor:
        return torch.stack([entry.vector() for entry in self.used_entries()]).mean(0)


@methods.register
class BankNearest(_BankMethod):
    """One bank entry, chosen by its descriptor's distance to the site's (default) or, with ``--choose-by
    labelled_accuracy``, by forward passes (`best_on_labelled`): the backprop-free selection baseline."""

    name = "physiopfm-nearest"
    description = "PhysioPFM's bank-entry baselines: the entry of the nearest descriptor, or the best on labelled beats"
    options = _BankMethod.options + (
        Option(
            "choose_by",
            str,
            "descriptor",
            "how the bank entry is chosen: nearest descriptor, or the best "
            "balanced accuracy on the site's labelled beats (forward passes only)",
            choices=("descriptor", "labelled_accuracy"),
        ),  # fmt: skip
    )

    def choose_factors(self, descriptor: np.ndarray, seed: int) -> torch.Tensor:
        entries = self.used_entries()
        if self.config["choose_by"] == "labelled_accuracy":
            return torch.stack([entry.vector() for entry in entries])
        bank = np.stack([self.descriptor(e.prototypes, e.counts) for e in entries])
        nearest = int(np.argmin(((bank - descriptor) ** 2).sum(1)))
        self.diagnostics_["nearest_entry"] = float(self.fit_index[nearest])
        log.info("%s: nearest bank entry %s", self.name, entries[nearest].provenance["name"])
        return entries[nearest].vector()


@methods.register
class PhysioPFM(_BankMethod):
    """PhysioPFM (see the module docstring): LoRA factors generated from the site's descriptor, no backprop."""

    name = "physiopfm"
    description = "PhysioPFM: the site's LoRA generated from its class shapelets by a model of a LoRA bank, no backprop"
    options = _BankMethod.options + (
        Option("generator", str, "diffusion", "the conditional weight generator", choices=GENERATORS),
        Option("iterations", int, 2000, "training iterations of the generator (batch 64, lr 4e-4)"),
        Option("width", int, 64, "token width of the diffusion transformer"),
        Option("depth", int, 2, "transformer blocks of the diffusion transformer (the paper's: 12, GPT-2)"),
        Option("sampling_steps", int, 50, "DDIM steps when sampling the diffusion generator (1000 trained)"),
        Option("bank_size", int, 0, "fit the generator on this many of the used entries (0: all; an ablation)"),
        Option("draws", int, 1, "DDIM draws (seeds seed·1000 + k) from which the site's LoRA is made"),
        Option(
            "draw_choice",
            str,
            "mean",
            "the site's LoRA: the mean of the draws' factors, or the draw with the "
            "best balanced accuracy on the site's labelled beats (forward passes only)",
            choices=("mean", "select"),
        ),  # fmt: skip
        Option(
            "generator_cache",
            str,
            "",
            "a folder keeping fitted generators by (bank file, entries, settings, "
            "seed): a run that would fit the same generator loads it (empty: always fit)",
        ),  # fmt: skip
    )

    def __init__(self, **options):
        """The generator's options, checked before any model or bank is seen."""
        super().__init__(**options)
        for name in ("iterations", "sampling_steps", "draws"):
            if self.config[name] < 1:
                raise UserError(f"method '{self.name}': --{name.replace('_', '-')} must be at least 1, got "
                                f"{self.config[name]}")  # fmt: skip
        if self.config["bank_size"] == 1 or self.config["bank_size"] < 0:
            raise UserError(f"method '{self.name}': --bank-size must be 0 (every used entry) or at least 2 (the "
                            f"generator needs 2), got {self.config['bank_size']}")  # fmt: skip

    def _generator_key(self, fit: np.ndarray, seed: int) -> str:
        """sha256 (hex) of what the generator fitted on entries ``fit`` with ``seed`` depends on: the bank file's
        bytes, the entries, the seed and the generator's settings (not the site's data: it never sees them)."""
        import hashlib

        keys = ("generator", "iterations", "width", "depth", "descriptor", "shapelet_points", "shapelet_length")
        digest = hashlib.sha256(Path(self.bank.source).read_bytes())
        digest.update(json.dumps([[int(i) for i in fit], seed, {k: self.config[k] for k in keys}]).encode())
        return digest.hexdigest()

    def _cache_path(self, key: str) -> Path | None:
        """Where the generator of `_generator_key` ``key`` is kept (None: no ``generator_cache``)."""
        if not self.config["generator_cache"]:
            return None
        return Path(self.config["generator_cache"]) / f"generator-{key[:24]}.safetensors"

    def fit(self, seed: int) -> None:
        from workbench.adaptation.physiopfm.generator import fit_weight_generator, load_generator, save_generator

        entries = self.bank.entries
        held, fit = self.held, self.fit_index
        n_held = len(held)
        if self.config["bank_size"]:
            fit = fit[: self.config["bank_size"]]
        if len(fit) < 2:
            raise UserError(f"method '{self.name}': {len(fit)} bank entries left to fit the generator; it needs ≥ 2")
        vectors = torch.stack([entries[i].vector() for i in range(len(entries))])
        conditions = torch.as_tensor(np.stack([self.descriptor(e.prototypes, e.counts) for e in entries]))
        start = time.perf_counter()
        key = self._generator_key(fit, seed)
        cached = self._cache_path(key)
        if cached is not None and cached.is_file():
            self.generator = load_generator(cached)
            self.diagnostics_["generator_loaded_from_cache"] = 1.0
        else:
            self.generator = reuse.shared("physiopfm-generator", key, lambda: fit_weight_generator(
                self.config["generator"], vectors[fit], conditions[fit], iterations=self.config["iterations"],
                seed=seed, progress=self.progress, **self._architecture(),
            ))  # fmt: skip  (a comparison fits it once per seed: it does not depend on the fold)
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                save_generator(self.generator, cached)
        self.diagnostics_["generator_fit_seconds"] = time.perf_counter() - start
        self.diagnostics_["bank_entries"] = float(len(fit))
        self.fitted_on = [entries[i].provenance["name"] for i in fit]
        if n_held:
            generated = self._generate(conditions[held], seed)
            scale = lora_scale()
            cosines, errors, mean_cosines = [], [], []
            mean_delta = delta_of(self.bank.factors_of(vectors[fit].mean(0)), scale)
            for row, i in zip(generated, held):
                fitted, made = entries[i].delta(scale), delta_of(self.bank.factors_of(row), scale)
                cosines.append(float(torch.nn.functional.cosine_similarity(made, fitted, dim=0)))
                errors.append(float((made - fitted).norm() / fitted.norm().clamp_min(1e-12)))
                mean_cosines.append(float(torch.nn.functional.cosine_similarity(mean_delta, fitted, dim=0)))
            self.diagnostics_.update({"delta_cosine_held_out": float(np.mean(cosines)),
                                      "delta_relative_error_held_out": float(np.mean(errors)),
                                      "mean_of_bank_delta_cosine_held_out": float(np.mean(mean_cosines)),
                                      "held_out_entries": float(n_held)})  # fmt: skip

    def _architecture(self) -> dict[str, int]:
        if self.config["generator"] == "diffusion":
            return {"width": self.config["width"], "depth": self.config["depth"]}
        return {}

    def _draws(self, conditions: torch.Tensor, seed: int) -> torch.Tensor:
        """``draws`` samples (draws, m, P) for ``conditions (m, C)`` (the regressor: one, it is deterministic)."""
        if self.config["generator"] != "diffusion":
            return self.generator.generate(conditions, seed=seed)[None]
        steps = self.config["sampling_steps"]
        return torch.stack([self.generator.generate(conditions, sampling_steps=steps, seed=seed * 1000 + k)
                            for k in range(self.config["draws"])])  # fmt: skip

    def _generate(self, conditions: torch.Tensor, seed: int) -> torch.Tensor:
        """The mean of the draws' factors (m, P)."""
        return self._draws(conditions, seed).mean(0)

    def choose_factors(self, descriptor: np.ndarray, seed: int) -> torch.Tensor:
        draws = self._draws(torch.as_tensor(descriptor)[None], seed)[:, 0]
        return draws if self.config["draw_choice"] == "select" else draws.mean(0)

    def plan(self, task: "Task", model: nn.Module, data: "TaskData", inputs: PlanInputs) -> list[Stage]:
        """No training stage (the adapter was generated in ``setup``); the chosen method writes what it made."""
        if inputs.outputs is not None:
            self.write_outputs(inputs.outputs)
        return []

    def write_outputs(self, folder: Path) -> None:
        """Each stage's output: the bank entries used, the descriptors, the generator, the generated adapter."""
        from workbench.adaptation.physiopfm.generator import save_generator

        write_json(folder / "bank.json", {"bank": self.bank.source, "fitted_on": self.fitted_on,
                                          "entries": [e.provenance for e in self.bank.entries]})  # fmt: skip
        save_tensors(folder / "site_descriptor.safetensors",
                     {k: torch.as_tensor(v) for k, v in self.site.items()},
                     metadata={"descriptor": json.dumps({k: self.config[k] for k in
                               ("descriptor", "shapelet_points", "shapelet_length")})})  # fmt: skip
        save_generator(self.generator, folder / "generator.safetensors")


@methods.register
class LocalEtfLoRA(_BankMethod):
    """The upper bound: the same adapters and ETF head, trained by backprop on the site's labelled examples."""

    name = "physiopfm-local"
    description = "PhysioPFM's upper bound: the same rank-4 LoRA and ETF head trained by backprop at the site"
    learning_rate = 5e-3
    needs_task = (ClassLabels, LoraBank)  # measured where PhysioPFM is: tasks with a bank
    options = ()

    def check(self, task: "Task", data: "TaskData", model: nn.Module) -> None:
        Method.check(self, task, data, model)

    def prepare(self, model: nn.Module) -> nn.Module:
        model = super().prepare(model)
        for p in lora.adapter_parameters(model):
            p.requires_grad_(True)
        return model

    def plan(self, task: "Task", model: nn.Module, data: "TaskData", inputs: PlanInputs) -> list[Stage]:
        """One stage without weight averaging, as the bank's entries were fitted (EMA 0.99 lags a short fit by
        ~100 steps)."""
        settings = dataclasses.replace(inputs.settings, ema_decay=None)
        return Method.plan(self, task, model, data, dataclasses.replace(inputs, settings=settings))

    def setup(self, task: "Task", model: nn.Module, data: "TaskData", seed: int) -> None:
        """Nothing before training."""

    def diagnostics(self, task: "Task", model: nn.Module, data: "TaskData") -> dict[str, float]:
        return {}
