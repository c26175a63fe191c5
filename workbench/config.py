"""A run's configuration: what the user asked for, resolved against the task's defaults by a pure function.

`resolve_config` never changes what the user asked for: it fills in what they left out (and says
which default it took in the resolved ``config.yaml``), stops with a `UserError` on what cannot be
done, and returns warnings for what it will do but the user may not expect.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import torch

from workbench.errors import UserError
from workbench.options import resolve_options
from workbench.registry import methods, tasks


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's numbers (plus where it writes them)."""

    task: str
    method: str
    baselines: tuple[str, ...]
    data: str | None
    model: str | None
    trust_checkpoint: bool
    out: str
    epochs: int
    train_size: int
    val_size: int
    batch_size: int
    #: Epochs without a better validation loss before a method's training stops.
    patience: int
    #: Decay of the moving average of the trained weights (0: no averaging).
    ema_decay: float
    #: None: each method's own default learning rate (unless the task sets one for all its methods).
    learning_rate: float | None
    seed: int
    device: str
    task_options: dict[str, Any] = field(default_factory=dict)
    method_options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        content = dataclasses.asdict(self)
        content["baselines"] = list(self.baselines)
        return content

    @classmethod
    def from_dict(cls, content: dict[str, Any]) -> "RunConfig":
        return cls(**{**content, "baselines": tuple(content["baselines"])})


def resolve_config(
    domain: str,
    method: str | None = None,
    baselines: list[str] | tuple[str, ...] | None = None,
    data: str | None = None,
    model: str | None = None,
    trust_checkpoint: bool = False,
    out: str | None = None,
    epochs: int | None = None,
    train_size: int | None = None,
    val_size: int | None = None,
    batch_size: int | None = None,
    patience: int | None = None,
    ema_decay: float = 0.99,
    learning_rate: float | None = None,
    seed: int = 0,
    device: str = "auto",
    task_options: dict[str, Any] | None = None,
    method_options: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> tuple[RunConfig, list[str]]:
    """Fill the task's defaults into the user's choices; returns the frozen config and warnings."""
    task_cls = tasks.get(domain)
    method = method or task_cls.default_method
    method_cls = methods.get(method)
    warnings = []
    profile = task_cls.profile(method)
    chosen_baselines = tuple(profile.get("baselines", task_cls.baselines) if baselines is None else baselines)
    for name in chosen_baselines:
        methods.get(name)
    if method in chosen_baselines:
        warnings.append(f"'{method}' is the chosen method and a baseline: it runs once, as the chosen method")
        chosen_baselines = tuple(name for name in chosen_baselines if name != method)
    defaults = task_cls.defaults
    epochs = defaults.get("epochs", 40) if epochs is None else epochs
    train_size = defaults.get("train_size", 100) if train_size is None else train_size
    val_size = defaults.get("val_size", max(10, train_size // 5)) if val_size is None else val_size
    batch_size = defaults.get("batch_size", 8) if batch_size is None else batch_size
    patience = defaults.get("patience", 15) if patience is None else patience
    for flag, value, low in (
        ("--epochs", epochs, 1),
        ("--train-size", train_size, 1),
        ("--val-size", val_size, 1),
        ("--batch-size", batch_size, 1),
        ("--patience", patience, 1),
    ):
        if value < low:
            raise UserError(f"{flag} must be at least {low}, got {value}")
    if batch_size > train_size:
        raise UserError(f"--batch-size {batch_size} is larger than --train-size {train_size}")
    if not 0 <= ema_decay < 1:
        raise UserError(f"--ema-decay must be in [0, 1) (0 turns averaging off), got {ema_decay}")
    learning_rate = defaults.get("learning_rate") if learning_rate is None else learning_rate
    if learning_rate is not None and learning_rate <= 0:
        raise UserError(f"--lr must be positive, got {learning_rate}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible to torch (use --device cpu or auto)")
    elif device not in ("cpu", "cuda"):
        raise UserError(f"--device must be auto, cpu or cuda, got {device!r}")
    if model is not None and str(model).endswith(".model") and not trust_checkpoint:
        raise UserError(
            f"{model}: a MACE .model file is a full pickle that can run code when loaded; "
            "pass --trust-checkpoint if you trust its origin"
        )
    task_options = {**profile.get("options", {}), **(task_options or {})}
    task_options = resolve_options(f"task '{domain}'", task_cls.options, task_options)
    method_options = resolve_options(f"method '{method}'", method_cls.options, dict(method_options or {}))
    method_cls(**method_options)  # a method checks its options when built: fail before anything is written
    if out is None:
        out = f"runs/{domain}-{method}-{(now or datetime.now()).strftime('%Y%m%d-%H%M%S')}"
    config = RunConfig(
        task=domain,
        method=method,
        baselines=chosen_baselines,
        data=None if data is None else str(data),
        model=None if model is None else str(model),
        trust_checkpoint=trust_checkpoint,
        out=str(out),
        epochs=epochs,
        train_size=train_size,
        val_size=val_size,
        batch_size=batch_size,
        patience=patience,
        ema_decay=ema_decay,
        learning_rate=learning_rate,
        seed=seed,
        device=device,
        task_options=task_options,
        method_options=method_options,
    )
    return config, warnings
