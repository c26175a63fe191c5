"""A clinical layer fitted on a site's own labelled records (``workbench calibrate --run RUN --data FOLDER --out
LAYER``), and its check before ``predict`` / ``serve`` / ``card`` use it (``--calibration LAYER``).

The run's own layer (`workbench.clinical.fit.fit_run`) is fitted on its validation split: 12 records on a
small embedded set, too few for a temperature or a finite conformal threshold. A site recalibrates on its own
labelled records instead:

1. the records are read with the run's task reader and preprocessing (``Task.read`` after ``Task.use_run_state``);
2. their groups (``Task.split_groups``: patients, or records where the data have none) are dealt at random (seeded)
   into three disjoint parts, `PARTS`: temperature fit, conformal calibration, held-out report; one patient's items
   never sit in two parts. Each part's items are the task's test items of the data re-split with that part held out
   (``Task.hold_out``, ``Task.test_samples``);
3. every item is scored by the run's merged model (probabilities, labels and the head's input features);
4. `workbench.clinical.fit.fit_layer` fits the temperatures (per class for multi-label; none under
   `workbench.clinical.fit.MIN_FIT_ITEMS` items) on the first part, the split conformal quantiles on the second; the
   shift alarm's reference is the first part's features and its null is calibrated on the second part's patients
   (`workbench.clinical.fit.shift_check`); `site_report` measures the sets on the third.

LAYER is a new folder outside every run (`workbench.core.seal.run_folder_above`), written beside its destination and
renamed into place, sealed as kind ``calibration`` (`workbench.core.seal.REQUIRED`)::

    clinical.json     as the run's (`workbench.clinical.fit`), plus ``site_report``: the held-out report
    clinical.npz      as the run's: the site's reference features and conformal calibration items
    reliability.png   the reliability diagram before/after the site's temperatures
    layer.json        which run it belongs to (sha256 of its adapter files and of its seal), which data (folder,
                      fingerprint, files), the seed, and the groups and items of each part

`check_layer` verifies a layer's seal and that it belongs to the run before any of it is used.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from workbench.clinical import calibration, conformal, fit
from workbench.core.checkpoint import atomic_folder, write_json
from workbench.core.errors import UserError

log = logging.getLogger("workbench")

#: The layer's record of its run and data (besides `fit.CLINICAL_JSON`, `fit.CLINICAL_NPZ`, `fit.RELIABILITY_PNG`).
LAYER_JSON = "layer.json"
LAYER_FORMAT = "workbench-calibration-layer/1"
#: The seal kind of a layer (`workbench.core.seal.REQUIRED`).
KIND = "calibration"
#: The three disjoint parts of the site's groups and the share of the groups each gets (each at least one group).
PARTS: tuple[tuple[str, float], ...] = (("temperature", 0.4), ("conformal", 0.3), ("report", 0.3))
#: Level of the exact (Clopper–Pearson) intervals of the held-out report.
CONFIDENCE = 0.95


def calibrate(run: str | Path, data: str | Path, out: str | Path, *, seed: int | None = None, overwrite: bool = False,
              trust_modified: bool = False, device: str = "auto") -> dict[str, Any]:  # fmt: skip
    """Fit a clinical layer of the finished run ``run`` on the labelled records in ``data`` and write it to the new
    folder ``out`` (module docstring). ``seed`` deals the groups into the parts and draws the alarm's reference
    (default: the run's seed). Returns what the layer's ``clinical.json`` holds.

    Raises:
        UserError: ``data`` is no folder the task reads; ``out`` lies inside a run folder or exists (without
            ``overwrite``, or holding anything but an earlier layer); the run does not verify (unless
            ``trust_modified``); its task has no batch prediction or no groups; the site has fewer than 3 groups.
    """
    from workbench.core.finished import Run
    from workbench.core.registry import tasks
    from workbench.core.seal import check_run, seal

    run, data, out = Path(run), Path(data), Path(out)
    _check_out(out, overwrite)
    if not data.is_dir():
        raise UserError(f"--data {data}: no such folder (give a folder of the site's labelled records, in a layout "
                        "the run's task reads)")  # fmt: skip
    config = Run.read_config(run)
    task = tasks.get(config.task)(**config.task_options)
    for capability, why in (("predict", "batch prediction, which a layer serves"),
                            ("folds", "patient groups, which keep one patient's items in one part")):  # fmt: skip
        if capability not in task.capabilities:
            raise UserError(f"task '{config.task}' has no {why}: it cannot be calibrated on a site's records")
    sealed = check_run(run, trust_modified)  # before anything the run wrote is used
    adapter = json.loads((run / "adapter.json").read_text())
    task.use_run_state(adapter["task_state"])  # the records are read as the run read its own
    seed = config.seed if seed is None else int(seed)
    raw = task.read(data, seed)  # a folder the task cannot read is refused before the model is loaded
    groups = deal_groups(task.split_groups(raw), seed)
    finished = Run.load(run, device, sealed=sealed)  # verified once, above
    scored = {name: _scored_part(task, finished.model, raw, groups, name, data) for name, _ in PARTS}
    fitting, calibrating, checking = (scored[name] for name, _ in PARTS)
    classes = list(adapter["task_state"].get("classes") or [])
    items = {name: len(part.truth) for name, part in scored.items()}
    split = (f"the site's records at {data} ({sum(items.values())} items of {sum(map(len, groups.values()))} "
             f"{task.group_kind}s), {task.group_kind}s dealt at random (seed {seed}) into three disjoint parts: "
             f"temperatures fitted on {items['temperature']} items, conformal scores and ECE on "
             f"{items['conformal']}, the report on {items['report']} held out from both")  # fmt: skip
    with atomic_folder(out, overwrite=True) as work:  # `_check_out` has refused what may not be replaced
        summary = fit.fit_layer(work, fitting, calibrating, checking, fitting.features, seed, split=split,
                                reference_kind="site items of the temperature part", pool=calibrating)
        summary["site_report"] = site_report(summary, checking, classes, groups["report"], task.group_kind)
        write_json(work / fit.CLINICAL_JSON, summary)
        write_json(work / LAYER_JSON, _layer_record(finished.path, config, adapter, sealed, data, seed, groups, items,
                                                    task.group_kind))  # fmt: skip
        seal(work, kind=KIND)
    return summary


def _check_out(out: Path, overwrite: bool) -> None:
    """``out`` may become a layer: outside every run folder, and new (or, with ``overwrite``, an earlier layer)."""
    from workbench.core.seal import run_folder_above

    inside = run_folder_above(out.parent)
    if inside is not None:
        raise UserError(f"--out {out}: inside the run folder {inside}; a calibration layer is never written into a run "
                        "folder: choose an --out outside it (beside the run)")  # fmt: skip
    if out.exists() or out.is_symlink():
        if not _is_layer(out):
            raise UserError(f"--out {out}: already exists and is not a calibration layer; choose a new folder")
        if not overwrite:
            raise UserError(f"--out {out}: already exists; pass --overwrite to replace it, or choose another --out")


def _is_layer(folder: Path) -> bool:
    """Whether ``folder`` is a folder sealed as a calibration layer (read, not verified)."""
    from workbench.core.seal import SEAL

    try:
        return folder.is_dir() and not folder.is_symlink() and json.loads((folder / SEAL).read_text()).get(
            "kind") == KIND  # fmt: skip
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False


def deal_groups(groups: Sequence[str], seed: int) -> dict[str, list[str]]:
    """``groups`` dealt at random (``seed``) into the `PARTS`, each at least one group, by their shares (rounded;
    the last part takes the rest). Each part's groups sorted.

    Raises:
        UserError: fewer groups than parts.
    """
    groups = sorted({str(group) for group in groups})
    if len(groups) < len(PARTS):
        raise UserError(f"the site's data hold {len(groups)} group(s) (patients or records); calibration needs at "
                        f"least {len(PARTS)}: one for each of {', '.join(name for name, _ in PARTS)}")  # fmt: skip
    order = [groups[i] for i in np.random.default_rng(seed).permutation(len(groups))]
    parts, start = {}, 0
    for position, (name, share) in enumerate(PARTS):
        left = len(PARTS) - position - 1  # parts still to fill, one group each at least
        size = len(order) - start if left == 0 else min(max(1, round(share * len(order))), len(order) - start - left)
        parts[name] = sorted(order[start : start + size])
        start += size
    return parts


def _scored_part(task: Any, model: Any, raw: Any, groups: Mapping[str, list[str]], name: str, data: Path
                 ) -> fit.Scored:  # fmt: skip
    """The items of part ``name`` scored by ``model``: the task's test items of ``raw`` re-split with the part's
    groups as test (and the next part's as validation: a re-split needs one)."""
    names = [part for part, _ in PARTS]
    following = names[(names.index(name) + 1) % len(names)]
    samples = task.test_samples(model, task.hold_out(raw, {"test": groups[name], "val": groups[following]}))
    from workbench.core.device import device_of

    scored = fit.score_items(task, model, samples, device_of(model))
    if scored is None:
        raise UserError(f"--data {data}: the task's evaluation gives no per-item probabilities and labels for these "
                        "records, so no layer can be fitted")  # fmt: skip
    return scored


def clopper_pearson(successes: int, trials: int, confidence: float = CONFIDENCE) -> list[float]:
    """Exact (Clopper–Pearson) interval ``[low, high]`` of a binomial proportion (scipy's ``binomtest``)."""
    from scipy.stats import binomtest

    interval = binomtest(int(successes), int(trials)).proportion_ci(confidence_level=confidence, method="exact")
    return [float(interval.low), float(interval.high)]


def site_report(summary: Mapping[str, Any], checking: fit.Scored, classes: Sequence[str], groups: Sequence[str],
                group_kind: str) -> dict[str, Any]:  # fmt: skip
    """What the layer's split conformal sets do on the held-out items ``checking``: coverage with its exact
    `CONFIDENCE` interval, mean set size, how often each class is in a set, the empty-set and all-classes rates.

    Coverage counts, as `workbench.clinical.conformal.coverage` does, true labels inside their sets: one per item
    (softmax), one per item and class (multi-label, whose guarantee is per class: each class also gets its own
    coverage and interval over the items). The intervals treat the items as independent trials; where a group
    (patient) holds several items, they are not, and the intervals are too narrow (``items_per_group`` says).

    "Empty" is a set naming no class (multi-label: no class possibly present; ``empty_label_sets`` counts the
    (item, class) sets holding neither label, which cannot cover); "all classes" a set naming every class (it
    does not narrow the answer)."""
    multilabel = bool(summary["multilabel"])
    temperatures = np.asarray(summary["calibration"]["temperatures"])
    quantiles = np.array([np.inf if q is None else q for q in summary["conformal"]["quantiles"]])
    quantiles = quantiles if multilabel else quantiles[0]
    probabilities = calibration.apply_temperature(checking.probabilities, temperatures, multilabel)
    sets = conformal.prediction_sets(probabilities, quantiles, multilabel)
    truth = np.asarray(checking.truth, dtype=np.int64)
    n, k = probabilities.shape
    names = list(classes) if len(classes) == k else [str(c) for c in range(k)]
    named = sets[..., 1] if multilabel else sets  # (n, K): the classes each set names
    covered = np.take_along_axis(sets, truth[..., None], axis=-1)[..., 0] if multilabel else sets[np.arange(n), truth]
    alpha = float(summary["conformal"]["alpha"])
    report: dict[str, Any] = {
        "items": int(n),
        "groups": len(groups),
        "group_kind": group_kind,
        "items_per_group": float(n / max(1, len(groups))),
        "nominal_coverage": 1 - alpha,
        "coverage": float(covered.mean()),
        "covered": int(covered.sum()),
        "trials": int(covered.size),
        "trial": "(item, class) pair" if multilabel else "item",
        "coverage_interval": clopper_pearson(int(covered.sum()), int(covered.size)),
        "interval": f"exact (Clopper–Pearson) {100 * CONFIDENCE:.0f} % interval, scipy.stats.binomtest",
        "mean_set_size": float(named.sum(axis=1).mean()),
        "set_frequency": {name: float(share) for name, share in zip(names, named.mean(axis=0))},
        "empty_rate": float((named.sum(axis=1) == 0).mean()),
        "all_classes_rate": float((named.sum(axis=1) == k).mean()),
    }
    if multilabel:
        report["interval_note"] = ("the pairs of one item are not independent trials: read the per-class intervals "
                                   "(one trial per item) for the guarantee, which is per class")  # fmt: skip
        report["empty_label_sets"] = float((~sets.any(axis=-1)).mean())
        report["per_class_coverage"] = {
            name: {"coverage": float(covered[:, j].mean()), "covered": int(covered[:, j].sum()), "trials": int(n),
                   "interval": clopper_pearson(int(covered[:, j].sum()), int(n))}
            for j, name in enumerate(names)
        }  # fmt: skip
    return report


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """The held-out report as a short console table."""
    low, high = report["coverage_interval"]
    lines = [
        f"held-out report: {report['items']} item(s) of {report['groups']} {report['group_kind']}(s), never used to "
        f"fit; nominal coverage {report['nominal_coverage']:.2f}",
        f"  coverage {report['coverage']:.3f} [{low:.3f}, {high:.3f}]: {report['covered']} of {report['trials']} "
        f"true labels in their sets, one per {report['trial']}",
        f"  ({report['interval']})",
        f"  mean set size {report['mean_set_size']:.2f}; empty sets {report['empty_rate']:.3f}; sets holding every "
        f"class {report['all_classes_rate']:.3f}",
        f"  {'class':<10} {'in set':>7}" + (f" {'coverage':>9} {'95 % interval':>16}"
                                           if "per_class_coverage" in report else ""),  # fmt: skip
    ]
    per_class = report.get("per_class_coverage") or {}
    for name, share in report["set_frequency"].items():
        line = f"  {name:<10} {share:>7.3f}"
        if name in per_class:
            c = per_class[name]
            line += f" {c['coverage']:>9.3f} [{c['interval'][0]:.3f}, {c['interval'][1]:.3f}]"
        lines.append(line)
    return lines


def _layer_record(run: Path, config: Any, adapter: Mapping[str, Any], sealed: Mapping[str, Any], data: Path,
                  seed: int, groups: Mapping[str, list[str]], items: Mapping[str, int], group_kind: str
                  ) -> dict[str, Any]:  # fmt: skip
    """``layer.json``: the run it belongs to, the data it was fitted on, and the parts."""
    import hashlib

    import workbench
    from workbench.core.seal import SEAL, sha256_file

    folder = data.resolve()
    digests = {path.relative_to(folder).as_posix(): sha256_file(path) for path in sorted(folder.rglob("*"))
               if path.is_file()}  # fmt: skip
    fingerprint = hashlib.sha256()  # over names and digests in sorted order, as a run's data fingerprint
    for name, digest in digests.items():
        fingerprint.update(name.encode() + b"\0" + bytes.fromhex(digest))
    return {
        "format": LAYER_FORMAT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "workbench_version": workbench.__version__,
        "run": {
            "path": str(run.resolve()),
            "task": config.task,
            "method": adapter["method"],
            "adapter_sha256": sha256_file(run / "adapter.safetensors"),
            "adapter_json_sha256": sha256_file(run / "adapter.json"),
            "seal_sha256": sha256_file(run / SEAL) if (run / SEAL).is_file() else None,
            "run_seal": dict(sealed),
        },
        "data": {
            "folder": str(data.resolve()),
            "fingerprint": fingerprint.hexdigest(),
            "files": len(digests),
            "sha256": digests if len(digests) <= 1000 else None,  # a large data set keeps its fingerprint only
        },
        "seed": seed,
        "group_kind": group_kind,
        "parts": {name: {"share": share, "groups": groups[name], "items": int(items[name])} for name, share in PARTS},
    }


class CheckedLayer(NamedTuple):
    """A calibration layer that verified for a run (`check_layer`): its folder, its ``clinical.json``, the arrays of
    its ``clinical.npz`` and its ``layer.json``."""

    path: Path
    summary: dict[str, Any]
    arrays: dict[str, np.ndarray]
    record: dict[str, Any]


def check_layer(layer: str | Path, run: str | Path) -> CheckedLayer:
    """The calibration layer ``layer`` (`CheckedLayer`), after verifying its seal
    (`workbench.core.seal.verify_seal`, kind `KIND`) and that it was fitted for the run ``run``: the sha256 of the
    run's ``adapter.safetensors`` and ``adapter.json`` match ``layer.json``'s ``run``.

    Raises:
        UserError: naming the file and field: not a folder, a seal that does not verify or of another kind, a
            damaged record, or a layer of another run.
    """
    from workbench.core.seal import SEAL, sha256_file, verify_seal

    layer, run = Path(layer), Path(run)
    fix = "fit a layer for this run: workbench calibrate --run RUN --data FOLDER --out LAYER"
    if not layer.is_dir():
        raise UserError(f"--calibration {layer}: no such folder (a layer written by workbench calibrate)")
    problems = verify_seal(layer)
    if problems:
        more = f" (and {len(problems) - 1} more: workbench verify {layer})" if len(problems) > 1 else ""
        raise UserError(f"{problems[0]}{more}; the calibration layer cannot be used: {fix}")
    kind = json.loads((layer / SEAL).read_text()).get("kind")
    if kind != KIND:
        raise UserError(f"{layer / SEAL}: field kind is {kind!r}, expected {KIND!r}: --calibration names a layer "
                        "written by workbench calibrate, not a run")  # fmt: skip
    record_path = layer / LAYER_JSON
    try:
        record = json.loads(record_path.read_text())
        belongs = record["run"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{record_path}: not a layer record ({error!r}); {fix}") from None
    for field, name in (("adapter_sha256", "adapter.safetensors"), ("adapter_json_sha256", "adapter.json")):
        if belongs.get(field) != sha256_file(run / name):
            raise UserError(f"{record_path}: field run.{field} is {belongs.get(field)}, but {run / name} has sha256 "
                            f"{sha256_file(run / name)}: the layer was fitted for another run "
                            f"({belongs.get('path')}); {fix}")  # fmt: skip
    artifacts = fit.read_artifacts(layer)
    if artifacts is None:
        raise UserError(f"{layer / fit.CLINICAL_JSON}: missing; {fix}")
    return CheckedLayer(layer, artifacts[0], artifacts[1], record)
