"""PhysioPFM's bank: LoRA adaptations fitted on source sub-tasks, kept with what they were fitted on.

Stage (a) of the method. Every entry is one sub-task (a source site × a class subset × a group of its subjects):
the rank-4 LoRA factors fitted on it by backprop with the fixed simplex-ETF head (`attach`, `fit_entry`), the
class prototypes its descriptor is computed from (`workbench.adaptation.physiopfm.descriptors`), and its
provenance (site, classes, subjects, seed, steps, sha256 of the series and of the record files, the fit's own
balanced accuracy).

The file is one safetensors (`save_bank` / `load_bank`): tensors ``{i}.A.{layer}``, ``{i}.B.{layer}``,
``{i}.prototypes``, ``{i}.counts``; metadata ``bank`` (JSON: the LoRA and head settings every entry shares, the
backbone fingerprint, the class names) and ``entries`` (JSON: one provenance record per entry).

Shapes:
    factors {layer: (A (r, in), B (out, r))}; vector (P,) = every layer's A then B, flattened, layers in order;
    prototypes (K, T); counts (K,)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn
from workbench.adaptation import lora
from workbench.adaptation.lora.model import target_names
from workbench.adaptation.physiopfm.etf import EtfHead

from workbench.core.checkpoint import load_tensors, save_tensors
from workbench.core.errors import UserError
from workbench.core.metrics import balanced_accuracy
from workbench.core.model import require

#: The LoRA every entry and every site shares (PhysioPFM's rank 4; targets and scale are *unverified* choices).
LORA_SETTINGS = {"targets": ["qkv"], "rank": 4, "alpha": 4.0, "init_seed": 0}
#: The fixed head every entry and every site shares (`workbench.adaptation.physiopfm.etf`).
HEAD_SETTINGS = {"temperature": 10.0, "frame_seed": 0}


@dataclass
class BankEntry:
    """One fitted sub-task: LoRA factors by layer, class prototypes (K, T) and counts (K,), provenance."""

    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]
    prototypes: np.ndarray
    counts: np.ndarray
    provenance: dict[str, Any]

    def vector(self) -> torch.Tensor:
        """The factors flattened (P,): each layer's A then B, layers in the stored order."""
        return torch.cat([t.flatten() for a, b in self.factors.values() for t in (a, b)])

    def delta(self, scale: float) -> torch.Tensor:
        """Every layer's update ``scale · B A`` flattened and concatenated."""
        return delta_of(self.factors, scale)


def delta_of(factors: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scale: float) -> torch.Tensor:
    """The updates ``scale · B A`` of factors ``{layer: (A, B)}``, flattened and concatenated, layers in order."""
    return torch.cat([(scale * b @ a).flatten() for a, b in factors.values()])


@dataclass
class Bank:
    """Entries and the settings they share (``lora``, ``head``, ``classes``, ``n_times``, ``backbone``)."""

    entries: list[BankEntry]
    settings: dict[str, Any]
    source: str = "<bank>"
    layers: list[str] = field(default_factory=list)

    def sites(self) -> list[str]:
        return sorted({entry.provenance["site"] for entry in self.entries})

    def select(self, keep: Sequence[int]) -> "Bank":
        return Bank([self.entries[i] for i in keep], self.settings, self.source, self.layers)

    def factors_of(self, vector: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Split a vector (P,) back into factors shaped as the entries' (the inverse of `BankEntry.vector`)."""
        shapes = self.entries[0].factors
        out, start = {}, 0
        for name in self.layers:
            pair = []
            for template in shapes[name]:
                pair.append(vector[start : start + template.numel()].reshape(template.shape))
                start += template.numel()
            out[name] = (pair[0], pair[1])
        return out


def backbone_fingerprint(model: nn.Module, targets: Sequence[str]) -> str:
    """sha256 (16 hex digits) of the base weights of the LoRA targets: which backbone a bank was fitted on."""
    digest = hashlib.sha256()
    for name in target_names(model, list(targets)):
        for tensor in model.get_submodule(name).state_dict().values():
            digest.update(tensor.detach().cpu().float().numpy().tobytes())
    return digest.hexdigest()[:16]


def attach(model: nn.Module, n_classes: int, method: str = "physiopfm") -> nn.Module:
    """Replace the model's head with the shared ETF head and wrap its targets in the shared LoRA (every parameter
    frozen, adapters at the shared initialisation: A seeded, B zero), in place.

    Raises:
        UserError: the model has no linear head, or its head has another class count than ``n_classes``.
    """
    head_name = require(model, method, "head", "adapter_target_groups").head
    head = model.get_submodule(head_name)
    if not isinstance(head, nn.Linear):
        raise UserError(f"method '{method}' replaces a linear head with its ETF head; '{head_name}' is a {type(head)}")
    if head.out_features != n_classes:
        raise UserError(
            f"method '{method}': the bank's head has {n_classes} classes, the model's head '{head_name}' has "
            f"{head.out_features}; fit a bank for these classes"
        )
    model.set_submodule(head_name, EtfHead(head.in_features, n_classes, HEAD_SETTINGS["temperature"],
                                           HEAD_SETTINGS["frame_seed"]))  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(LORA_SETTINGS["init_seed"])
        lora.apply(model, targets=LORA_SETTINGS["targets"], rank=LORA_SETTINGS["rank"], alpha=LORA_SETTINGS["alpha"])
    return model.requires_grad_(False)


def lora_scale() -> float:
    return LORA_SETTINGS["alpha"] / LORA_SETTINGS["rank"]


def class_weights(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """Inverse class frequency, mean 1 over the series (0 for an absent class)."""
    counts = np.bincount(labels, minlength=n_classes).astype(float)
    return np.where(counts > 0, counts.sum() / np.maximum(counts, 1) / max((counts > 0).sum(), 1), 0.0)


def fit_entry(
    model: nn.Module,
    series: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    steps: int = 200,
    batch_size: int = 64,
    learning_rate: float = 5e-3,
    seed: int = 0,
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], float]:
    """Fit the adapters of an `attach` ed model on one sub-task by class-weighted cross-entropy (Adam, batches
    drawn with replacement); returns the factors and the fit's balanced accuracy on its own series."""
    layers = lora.lora_layers(model)
    params = lora.adapter_parameters(model)
    for p in params:
        p.requires_grad_(True)
    x, y = torch.as_tensor(series, dtype=torch.float32), torch.as_tensor(labels, dtype=torch.int64)
    weight = torch.as_tensor(class_weights(labels, n_classes), dtype=torch.float32)
    optimizer = torch.optim.Adam(params, lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        index = torch.randint(len(x), (batch_size,), generator=generator)
        loss = F.cross_entropy(model(x[index]), y[index], weight=weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().requires_grad_(False)
    with torch.no_grad():
        predicted = torch.cat([model(x[i : i + 512]).argmax(1) for i in range(0, len(x), 512)]).numpy()
    factors = {name: (layer.lora_A.weight.detach().clone(), layer.lora_B.weight.detach().clone())
               for name, layer in layers.items()}  # fmt: skip
    return factors, balanced_accuracy(labels, predicted)


def series_sha256(series: np.ndarray, labels: np.ndarray) -> str:
    digest = hashlib.sha256(np.ascontiguousarray(series, np.float32).tobytes())
    digest.update(np.ascontiguousarray(labels, np.int64).tobytes())
    return digest.hexdigest()


def save_bank(bank: Bank, path: str | Path, dtype: torch.dtype = torch.float32) -> None:
    """Write the bank as one safetensors file (atomically; see the module docstring), its factors as ``dtype``
    (float16 halves the file; `load_bank` reads them back as float32)."""
    tensors: dict[str, torch.Tensor] = {}
    for i, entry in enumerate(bank.entries):
        for name, (a, b) in entry.factors.items():
            tensors[f"{i}.A.{name}"], tensors[f"{i}.B.{name}"] = a.to(dtype), b.to(dtype)
        tensors[f"{i}.prototypes"] = torch.as_tensor(entry.prototypes, dtype=torch.float32)
        tensors[f"{i}.counts"] = torch.as_tensor(entry.counts, dtype=torch.int64)
    metadata = {"bank": json.dumps({**bank.settings, "layers": bank.layers}),
                "entries": json.dumps([entry.provenance for entry in bank.entries])}  # fmt: skip
    save_tensors(path, tensors, metadata=metadata)


def load_bank(path: str | Path) -> Bank:
    """Read a bank written by `save_bank`; a file that is not one is a `UserError` naming it."""
    path = Path(path)
    tensors = load_tensors(path)
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata() or {}
    if "bank" not in metadata or "entries" not in metadata:
        raise UserError(f"{path}: not a PhysioPFM bank (no 'bank' and 'entries' in its metadata)")
    settings, provenance = json.loads(metadata["bank"]), json.loads(metadata["entries"])
    layers = settings.pop("layers")
    entries = []
    for i, record in enumerate(provenance):
        try:
            factors = {name: (tensors[f"{i}.A.{name}"].float(), tensors[f"{i}.B.{name}"].float()) for name in layers}
            entries.append(BankEntry(factors, tensors[f"{i}.prototypes"].numpy(), tensors[f"{i}.counts"].numpy(),
                                     record))  # fmt: skip
        except KeyError as missing:
            raise UserError(f"{path}: entry {i} lacks the tensor {missing}") from None
    if not entries:
        raise UserError(f"{path}: the bank holds no entry")
    return Bank(entries, settings, str(path), list(layers))


def check_bank_fits(bank: Bank, model_fingerprint: str, n_classes: int, n_times: int) -> None:
    """The bank was fitted for this backbone, these classes and series of this length, with today's settings."""
    expected: Mapping[str, Any] = {"lora": LORA_SETTINGS, "head": HEAD_SETTINGS, "backbone": model_fingerprint,
                                   "n_classes": n_classes, "n_times": n_times}  # fmt: skip
    for key, value in expected.items():
        if bank.settings.get(key) != value:
            raise UserError(
                f"{bank.source}: the bank's '{key}' is {bank.settings.get(key)!r}, this run needs {value!r} "
                "(fit a bank for this backbone and task: workbench pretrain --stage bank)"
            )
