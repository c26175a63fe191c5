"""Data cards: one YAML file per dataset in ``data_cards/``, and the checks a loader runs against them.

A card's ``fields`` map each field of a file to its dtype kind, symbolic shape, units and checks::

    forces: {dtype: float, shape: [n_frames, n_atoms, 3], units: kcal/mol/angstrom, checks: [finite]}

`check_fields` verifies arrays read from a file against those entries and raises a `UserError` that
names the file, the field and what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

from workbench.core.errors import UserError, field_error

_DTYPE_KINDS = {"float": "f", "int": "iu", "bool": "b", "str": "USO"}


@dataclass(frozen=True)
class DataCard:
    """A dataset's card: its name, a one-line title, the file fields and everything else it says."""

    name: str
    title: str
    fields: Mapping[str, Mapping[str, Any]]
    content: Mapping[str, Any] = field(repr=False)
    path: str = ""


def load_card(name: str) -> DataCard:
    """The card ``data_cards/<name>.yaml`` shipped with the workbench, or the card file ``name`` (a path ending in
    ``.yaml``: a third-party task ships its card beside its module)."""
    if name.endswith(".yaml"):
        source = Path(name)
    else:
        source = resources.files("workbench.data_cards") / f"{name}.yaml"
    if not source.is_file():
        raise UserError(f"no data card named '{name}' (looked for {source})")
    content = yaml.safe_load(source.read_text())
    return DataCard(
        name=content["name"],
        title=content["title"],
        fields=content.get("fields", {}),
        content=content,
        path=str(source),
    )


def check_fields(
    card: DataCard, path: str | Path, arrays: Mapping[str, np.ndarray], names: list[str] | None = None
) -> dict[str, int]:
    """Check ``arrays`` (field -> array, read from ``path``) against ``card.fields``.

    Checks presence, dtype kind, shape (symbolic sizes such as ``n_atoms`` must agree across fields)
    and the listed value checks (``finite``, ``positive``). Returns the bound symbolic sizes.
    """
    sizes: dict[str, int] = {}
    for name in names or list(card.fields):
        spec = card.fields[name]
        if name not in arrays:
            raise field_error(
                path,
                name,
                f"a field '{name}' ({_describe(spec)}) as the {card.name} card says",
                f"only {sorted(arrays)}",
            )
        value = np.asarray(arrays[name])
        kinds = _DTYPE_KINDS[spec["dtype"]]
        if value.dtype.kind not in kinds:
            raise field_error(path, name, f"dtype {spec['dtype']}", f"{value.dtype}")
        shape = spec.get("shape")
        if shape is not None:
            if value.ndim != len(shape):
                raise field_error(path, name, f"shape {shape}", f"shape {list(value.shape)}")
            for axis, (symbol, size) in enumerate(zip(shape, value.shape)):
                expected = symbol if isinstance(symbol, int) else sizes.setdefault(symbol, size)
                if size != expected:
                    raise field_error(
                        path,
                        name,
                        f"shape {shape} with {symbol} = {expected}",
                        f"{size} on axis {axis} (shape {list(value.shape)})",
                    )
        for check in spec.get("checks", []):
            _value_check(path, name, value, check)
    return sizes


def _value_check(path, name: str, value: np.ndarray, check: str) -> None:
    if check == "finite":
        bad = ~np.isfinite(value)
        if bad.any():
            where = np.argwhere(bad)[0].tolist()
            raise field_error(path, name, "finite numbers", f"{int(bad.sum())} NaN/inf values (first at index {where})")
    elif check == "positive":
        if (value <= 0).any():
            raise field_error(path, name, "positive values", f"minimum {value.min()}")
    else:
        raise ValueError(f"data card check '{check}' is not known (field {name})")


def _describe(spec: Mapping[str, Any]) -> str:
    units = f" [{spec['units']}]" if spec.get("units") else ""
    return f"{spec['dtype']} {spec.get('shape', '')}{units}".strip()
