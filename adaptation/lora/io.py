"""Adapter files, shared by every low-rank method (`workbench.adaptation.lora`, `workbench.adaptation.elora`).

An adapter file is one safetensors file holding the tensors a method owns apart from the frozen base model; its
string metadata names the method (``method``) and holds the method's configuration as JSON (``config``), so the
file alone rebuilds the adapter. Loading matches tensors to the model's adapter tensors by name and says what it
found — matched, missing (left as they were), unexpected (ignored) — instead of loading "0 of 99 keys" silently:
a file that matches nothing is refused, a matched tensor of another shape is refused, and ``strict`` refuses any
missing or unexpected name too.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from workbench.core.checkpoint import load_tensors, read_metadata, save_tensors
from workbench.core.errors import UserError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadReport:
    """What loading an adapter file found: the names it ``matched``, those of the model it lacked (``missing``,
    left unchanged) and those of the file the model has no place for (``unexpected``, ignored)."""

    source: str
    matched: tuple[str, ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]

    def __str__(self) -> str:
        total = len(self.matched) + len(self.missing)
        text = f"{self.source}: {len(self.matched)} of {total} adapter tensors matched"
        if self.missing:
            text += f"; missing {len(self.missing)} (left as they were): {_some(self.missing)}"
        if self.unexpected:
            text += f"; unexpected {len(self.unexpected)} (ignored): {_some(self.unexpected)}"
        return text


def _some(names: tuple[str, ...], n: int = 3) -> str:
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def write_adapter(
    path: str | Path, tensors: Mapping[str, torch.Tensor], method: str, config: Mapping[str, Any]
) -> None:
    """Write ``tensors`` to ``path`` (safetensors, atomically) with metadata ``method`` and ``config`` (JSON)."""
    metadata = {"format": "pt", "method": method, "config": json.dumps(dict(config))}
    save_tensors(path, tensors, metadata=metadata)


def read_adapter(path: str | Path, method: str) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """(tensors, configuration) of an adapter file; the configuration is None in a file without one (a PEFT file).

    A file written for another method is a `UserError` naming it.
    """
    metadata = read_metadata(path)
    found = metadata.get("method")
    if found is not None and found != method:
        raise UserError(f"{path}: an adapter of method '{found}', not '{method}'")
    try:
        config = json.loads(metadata["config"]) if "config" in metadata else None
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: the metadata field 'config' is not JSON ({error})") from None
    return load_tensors(path), config


def load_into(
    params: Mapping[str, torch.Tensor],
    tensors: Mapping[str, torch.Tensor],
    source: str | Path,
    strict: bool = False,
) -> LoadReport:
    """Copy ``tensors`` into the model tensors ``params`` of the same names; returns (and logs) the `LoadReport`.

    Args:
        params: the model's adapter tensors by name (what the file should hold).
        tensors: what the file holds, by name.
        source: the file, for messages.
        strict: refuse missing and unexpected names too (default: report them).

    Nothing is copied unless every check passes.
    """
    matched = tuple(name for name in params if name in tensors)
    report = LoadReport(
        str(source),
        matched,
        tuple(name for name in params if name not in tensors),
        tuple(name for name in tensors if name not in params),
    )
    if not matched:
        raise UserError(
            f"{source}: none of its {len(tensors)} tensors ({_some(tuple(tensors))}) is one of this model's "
            f"{len(params)} adapter tensors ({_some(tuple(params))}); it was saved from another model or method"
        )
    for name in matched:
        if tensors[name].shape != params[name].shape:
            expected, found = tuple(params[name].shape), tuple(tensors[name].shape)
            raise UserError(f"{source}: tensor '{name}': expected shape {expected}, found {found}")
    if strict and (report.missing or report.unexpected):
        raise UserError(f"{report}; the file must hold exactly this model's adapter tensors")
    with torch.no_grad():
        for name in matched:
            params[name].copy_(tensors[name])
    (log.warning if report.missing or report.unexpected else log.info)("%s", report)
    return report
