"""Read a source/target pair of feature tables (users' embeddings or measurements) and check them.

Layout (data card ``features``): a folder with ``source.<ext>`` and ``target.<ext>``, ext one of

- ``npz``: arrays ``features`` (n, d) float and ``labels`` (n,) — int for classes, float for values;
- ``csv`` / ``parquet``: one row per sample, a ``label`` column and every other column a feature.

Source labels are required; target labels are optional (they only score the adaptation; missing
values are NaN, or -1 for classes). Training never sees a target label.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.datacard import check_fields, load_card
from workbench.core.errors import UserError, field_error
from workbench.core.npz import load_npz

EXTENSIONS = ("npz", "csv", "parquet")


@dataclass
class FeatureSet:
    """One domain's samples: features (n, d) float32 and labels (n,) (None when it has none)."""

    features: np.ndarray
    labels: np.ndarray | None
    path: str


@dataclass
class ShiftProblem:
    """A labelled source and a target of the same feature space, plus what is known about the shift."""

    source: FeatureSet
    target: FeatureSet
    kind: str  # "classification" or "regression"
    description: str
    #: Ground truth of generated problems (e.g. ``outlier_classes``); empty for users' data.
    truth: dict[str, Any] = field(default_factory=dict)
    #: Target rows scored as the test split when a fold chose them (`FeatureShift.hold_out`); None: a seeded
    #: ``target_test_fraction`` of the labelled rows.
    test_rows: np.ndarray | None = None

    @property
    def n_outputs(self) -> int:
        return int(self.source.labels.max()) + 1 if self.kind == "classification" else 1


def _read_table(path: Path) -> dict[str, np.ndarray]:
    """``features`` and, when present, ``labels`` of one npz/csv/parquet file."""
    if path.suffix == ".npz":
        return load_npz(path)
    import pandas as pd

    try:
        frame = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    except Exception as error:  # pandas raises many kinds for a malformed file
        raise UserError(f"{path}: not a readable {path.suffix[1:]} table ({error})") from None
    non_numeric = [str(name) for name in frame.columns if not pd.api.types.is_numeric_dtype(frame[name])]
    if non_numeric:
        raise field_error(path, non_numeric[0], "numeric feature columns (and a numeric 'label' column)",
                          f"values of type {frame[non_numeric[0]].dtype}")  # fmt: skip
    arrays: dict[str, np.ndarray] = {}
    if "label" in frame.columns:
        label = frame.pop("label")
        arrays["labels"] = label.astype(np.float64).to_numpy() if label.hasnans else label.to_numpy()
    arrays["features"] = frame.astype(np.float64).to_numpy()  # nullable columns: a missing value becomes NaN
    return arrays


def _find(folder: Path, stem: str) -> Path:
    found = [folder / f"{stem}.{ext}" for ext in EXTENSIONS if (folder / f"{stem}.{ext}").is_file()]
    if len(found) != 1:
        what = "none" if not found else ", ".join(p.name for p in found)
        raise UserError(f"{folder}: expected exactly one of {stem}.npz, {stem}.csv, {stem}.parquet; found {what}")
    return found[0]


def _labels_kind(labels: np.ndarray) -> str:
    """ "classification" for int labels, "regression" for float ones (`read_feature_pair` has checked the dtype)."""
    return "classification" if labels.dtype.kind in "iu" else "regression"


def read_feature_pair(folder: str | Path, kind: str = "auto") -> ShiftProblem:
    """Read ``folder/source.*`` and ``folder/target.*``; checks every field against the ``features`` card."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: expected a folder holding source.<npz|csv|parquet> and target.<npz|csv|parquet>")
    card = load_card("features")
    sets = {}
    for stem in ("source", "target"):
        path = _find(folder, stem)
        arrays = _read_table(path)
        check_fields(card, path, arrays, ["features"])
        features = arrays["features"].astype(np.float32)
        if 0 in features.shape:
            raise field_error(path, "features", "at least one sample and one feature", f"shape {list(features.shape)}")
        if not np.isfinite(features).all():
            raise field_error(path, "features", "numbers within float32's range (below 3.4e38 in size)", "larger ones")
        labels = arrays.get("labels")
        if labels is None and stem == "source":
            raise field_error(path, "labels", "a label per source sample (npz 'labels' or a 'label' column)", "none")
        if labels is not None:
            labels = np.asarray(labels)
            if labels.shape != (len(features),):
                raise field_error(path, "labels", f"shape [{len(features)}]", f"shape {list(labels.shape)}")
            if labels.dtype.kind not in "iuf":
                raise field_error(path, "labels", "int (classes) or float (values) labels", f"dtype {labels.dtype}")
        sets[stem] = FeatureSet(features, labels, str(path))
    source, target = sets["source"], sets["target"]
    if source.features.shape[1] != target.features.shape[1]:
        raise field_error(
            target.path,
            "features",
            f"{source.features.shape[1]} features per sample, as in {source.path}",
            f"{target.features.shape[1]}",
        )
    kind = _labels_kind(source.labels) if kind == "auto" else kind
    classes = len(source.labels)  # at most one class per source sample
    source.labels = _checked_labels(source, kind, classes, required=True)
    if target.labels is not None:
        target.labels = _checked_labels(target, kind, classes, required=False)
    return ShiftProblem(source, target, kind, str(folder))


def _checked_labels(domain: FeatureSet, kind: str, max_classes: int, required: bool) -> np.ndarray | None:
    """Labels as int64 classes (-1: unknown; indices below ``max_classes``) or float32 values (NaN: unknown); unknowns
    only where allowed.

    None when no label is known (allowed for the target only)."""
    labels = domain.labels
    if kind == "classification":
        values = labels.astype(np.float64)
        integral = np.isnan(values) | (values == np.round(values))
        if not integral.all():
            raise field_error(domain.path, "labels", "integer class indices", f"a value {values[~integral][0]}")
        if np.nanmax(values, initial=0) >= max_classes:  # the model's head is sized by the largest class index
            expected = f"class indices below the number of source samples ({max_classes})"
            raise field_error(domain.path, "labels", expected,
                              f"{np.nanmax(values):.0f}")  # fmt: skip
        values = np.where(np.isnan(values) | (values < 0), -1, values).astype(np.int64)
        missing = values < 0
    else:
        values = labels.astype(np.float32)
        if np.isinf(values).any():
            raise field_error(
                domain.path, "labels", "finite values (NaN for unknown)", "inf, or beyond float32's range"
            )
        missing = np.isnan(values)
    if required and missing.any():
        where = int(np.flatnonzero(missing)[0])
        raise field_error(domain.path, "labels", "a label for every source sample", f"a missing label at row {where}")
    return None if missing.all() else values
