"""A finished run read back: its configuration, metrics and adapted model (`Run.load`).

What plug-ins may use of a finished run (a teacher, a served model) lives here, below every application: the run
folder's layout is written by `workbench.run.adapting`, verified by `workbench.core.seal` (`Run.load` verifies before
it reads anything but the configuration).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from workbench.core import device as placement
from workbench.core import randomness
from workbench.core.checkpoint import load_tensors
from workbench.core.config import RunConfig
from workbench.core.errors import UserError
from workbench.core.registry import methods, tasks
from workbench.core.seal import check_run


@dataclass
class Run:
    """A finished run: its directory, configuration, metrics and adapted (merged) model."""

    path: Path
    config: RunConfig
    metrics: dict[str, Any]
    model: nn.Module | None = field(default=None, repr=False)
    #: What `workbench.core.seal.check_run` said of the run's seal when it was loaded (None: not checked).
    sealed: dict[str, Any] | None = None

    @property
    def paths(self) -> dict[str, Path]:
        names = ["config.yaml", "metrics.json", "adapter.safetensors", "adapter.json", "report.md", "log.txt"]
        return {name: self.path / name for name in names if (self.path / name).exists()}

    @staticmethod
    def read_config(path: str | Path) -> RunConfig:
        """The configuration of the finished run in ``path``; a `UserError` when it is not one."""
        path = Path(path)
        for name in ("config.yaml", "metrics.json", "adapter.safetensors", "adapter.json"):
            if not (path / name).is_file():
                raise UserError(f"{path}: not a finished run ({name} is missing)")
        return Run.read_config_file(path)

    @staticmethod
    def read_config_file(path: str | Path) -> RunConfig:
        """The ``config.yaml`` of a run directory, finished or not."""
        return RunConfig.from_dict(yaml.safe_load((Path(path) / "config.yaml").read_text()))

    @classmethod
    def load(
        cls, path: str | Path, device: str | torch.device = "auto", trust_modified: bool = False,
        sealed: dict[str, Any] | None = None,
    ) -> "Run":
        """Verify a finished run against its seal, then read it and rebuild its adapted model (base model + task
        state + adapter, merged) on ``device`` (`workbench.core.device.resolve`).

        ``trust_modified``: use a run that does not verify (`workbench.core.seal.check_run`; its problems are in
        `Run.sealed`); ``sealed``: what the caller's own `check_run` of this run said (it is not verified twice).

        Raises:
            UserError: not a finished run, or it does not verify (naming the first problem) unless ``trust_modified``.
        """
        config = cls.read_config(path)
        sealed = sealed if sealed is not None else check_run(path, trust_modified)
        metrics = json.loads((Path(path) / "metrics.json").read_text())
        return cls(Path(path), config, metrics, adapted_model(Path(path), config, placement.resolve(device)), sealed)


def adapted_model(path: Path, config: RunConfig, device: torch.device) -> nn.Module:
    """The chosen method's model from a run directory's adapter files: base + task state + adapter, merged, on
    ``device`` (the base model is placed before the method's hooks see it)."""
    adapter = json.loads((path / "adapter.json").read_text())
    task = tasks.get(config.task)(**config.task_options)
    model = cast(task.rebuild(config.model, config.trust_checkpoint, adapter["task_state"]), config.precision)
    model = placement.place(model, device)
    method = methods.get(adapter["method"])(**adapter["options"])
    randomness.seed_all(config.seed)
    model = placement.place(method.prepare(model), device)
    method.load_trainable_state(model, load_tensors(path / "adapter.safetensors"), source=path / "adapter.safetensors")
    model = method.merge(model).eval()
    task.restore(model, adapter["task_state"])  # the merged model may be a new one (a distilled student)
    return model


def cast(model: nn.Module, precision: str) -> nn.Module:
    """``model`` in the dtype of ``--precision`` float64 / float32 (mixed precisions keep float32 weights)."""
    dtype = {"float64": torch.float64, "float32": torch.float32}.get(precision, torch.float32)
    parameter = next(model.parameters(), None)
    return model if parameter is None or parameter.dtype == dtype else model.to(dtype)
