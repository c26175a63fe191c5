"""A finished run loaded once, answering for clinical use: calibrated probabilities, a conformal set and a shift
verdict for every input the task's own ``predict_folder`` scores (``workbench predict`` and the service use it).

Per call of `ClinicalPredictor.answer` (a batch: one upload is a batch of one):

* probabilities: the task's, scaled by the run's temperatures (`workbench.clinical.calibration`);
* shift: the MMD test of the batch's features together with the last ``shift_window`` features answered before it
  for the same caller, against the run's reference sample, its null calibrated on pseudo-batches of the layer's
  held-out patients with the batch's records as patients (`workbench.clinical.fit.shift_check`; a layer written
  before it kept them: the relabelling test);
* conformal set at level 1 − `workbench.clinical.fit.ALPHA`: weighted (`workbench.clinical.conformal`), with
  ``w = p_incoming / p_calibration`` estimated by a registered density-ratio method (`DENSITY_RATIO`) between the
  calibration features and the batch with the window, when both hold at least `MIN_WEIGHTED` items; split
  conformal otherwise (``conformal_kind`` says which).

A run without ``clinical.json`` (an older run, a task without probabilities) answers with its plain probabilities;
calibration, conformal and shift are then None. Given a calibration layer (``--calibration LAYER``, fitted on a
site's own records by ``workbench calibrate``: `workbench.clinical.site_calibration`), its ``clinical.json`` and
``clinical.npz`` are used instead of the run's, once its seal verifies and it is found to belong to the run.

What is kept between calls (the rolling window and the count of batches that seeds the permutation test) is kept per
caller (`ClinicalPredictor.answer`'s ``caller``; `DEFAULT_CALLER` for ``workbench predict``): one caller's traffic
never changes another's answers.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from workbench.clinical import calibration, conformal, fit, shift_alarm
from workbench.core.errors import UserError
from workbench.core.registry import role
from workbench.core.seal import sha256_file
from workbench.core.task import Predictions, Task

#: The role whose registered method's density-ratio estimator weighs the calibration items (`make_estimator`;
#: `workbench.core.registry.role`). The workbench's plug-ins fill it with the logistic classifier between the
#: samples: on 64 penultimate features the kernel estimators (uLSIF, KLIEP) chose flat weights where it recovered the
#: true ratio (benchmarks/conformal_shift.py).
DENSITY_RATIO = "density-ratio"
#: Fewest incoming items (batch + window), and fewest calibration items, from which the weights are estimated;
#: below, split conformal (a density ratio from a handful of points is noise).
MIN_WEIGHTED = 20
#: The caller of a call that names none (``workbench predict``: one caller).
DEFAULT_CALLER = "local"


class ClinicalPredictor:
    """A finished run, loaded once, answering for clinical use."""

    def __init__(self, path: Path, config: Any, task: Task, model: nn.Module, adapter: dict[str, Any],
                 sealed: dict[str, Any], *, shift_window: int = 64, density_ratio: str | None = None,
                 calibration: Any = None):  # fmt: skip
        """``calibration``: a layer of ``workbench calibrate`` used instead of the run's own clinical files, its folder
        (verified here by `workbench.clinical.site_calibration.check_layer`: a `UserError` naming the file and field
        otherwise) or what that check returned (`CheckedLayer`: not verified again)."""
        self.path, self.config, self.task, self.model = Path(path), config, task, model.eval()
        self.adapter, self.sealed = adapter, sealed
        self._density_ratio = density_ratio
        self.state = adapter["task_state"]
        #: The layer in use (None: the run's own): its folder and ``layer.json`` (`describe` says what it is).
        self.layer: dict[str, Any] | None = None
        if calibration is not None:
            from workbench.clinical.site_calibration import CheckedLayer, check_layer

            if not isinstance(calibration, CheckedLayer):
                calibration = check_layer(calibration, self.path)
            artifacts = calibration.summary, calibration.arrays
            self.layer = {"path": str(calibration.path.resolve()), "record": calibration.record}
        else:
            artifacts = fit.read_artifacts(self.path)
        self.summary, arrays = artifacts if artifacts is not None else (None, {})
        self.multilabel = bool(self.summary and self.summary["multilabel"])
        self.temperatures = np.asarray(self.summary["calibration"]["temperatures"]) if self.summary else None
        self.reference = arrays.get("reference_features")
        self.pool, self.pool_groups = arrays.get("pool_features"), arrays.get("pool_groups")  # None: an older layer
        self.calibration_features = arrays.get("calibration_features")
        self.calibration_scores = (conformal.true_scores(arrays["calibration_probabilities"],
                                                         arrays["calibration_truth"], self.multilabel)
                                   if self.summary else None)  # fmt: skip
        self.shift_window = int(shift_window)
        self._lock = threading.Lock()
        self._windows: dict[str, deque[np.ndarray]] = {}  # per caller: the last features answered
        self._window_groups: dict[str, deque[str]] = {}  # per caller: their records (the alarm's patients)
        self._batches: dict[str, int] = {}  # per caller: batches answered (the permutation test's seed)

    @classmethod
    def load(cls, run: str | Path, *, trust_modified: bool = False, shift_window: int = 64,
             density_ratio: str | None = None, device: str = "auto",
             calibration: str | Path | None = None) -> "ClinicalPredictor":  # fmt: skip
        """Verify ``run`` against its seal (`workbench.core.seal.check_run`), then load its task and merged model once,
        on ``device`` (`workbench.core.device.resolve`); with ``calibration``, answer with that layer's clinical files
        (`workbench.clinical.site_calibration.check_layer`, before the model is loaded).

        Raises:
            UserError: a file changed after the run finished (unless ``trust_modified``), not a finished run, a
                task without batch prediction, or a ``calibration`` layer that does not verify or is another run's.
        """
        from workbench.core.finished import Run
        from workbench.core.registry import tasks
        from workbench.core.seal import check_run

        config = Run.read_config(run)
        task = tasks.get(config.task)(**config.task_options)
        if "predict" not in task.capabilities:
            raise UserError(f"task '{config.task}' has no batch prediction: it cannot answer inputs")
        sealed = check_run(run, trust_modified)  # before anything the run wrote is used
        if calibration is not None:  # refused before the model is loaded
            from workbench.clinical.site_calibration import check_layer

            calibration = check_layer(calibration, run)
        finished = Run.load(run, device, sealed=sealed)  # verified once, above
        adapter = json.loads((finished.path / "adapter.json").read_text())
        task.use_run_state(adapter["task_state"])
        return cls(finished.path, config, task, finished.model, adapter, sealed, shift_window=shift_window,
                   density_ratio=density_ratio, calibration=calibration)  # fmt: skip

    @property
    def density_ratio(self) -> str:
        """The registered method whose estimator weighs the calibration items: the one given, else the one that
        fills the `DENSITY_RATIO` role (looked up when first needed: its module imports its own libraries)."""
        if self._density_ratio is None:
            self._density_ratio = role(DENSITY_RATIO)
        return self._density_ratio

    def describe(self) -> dict[str, Any]:
        """What answers: task, method, hashes, version, calibration, conformal, shift, intended use (JSON-able)."""
        import workbench

        summary = self.summary
        calibration_part = conformal_part = shift_part = None
        if summary is not None:
            c = summary["calibration"]
            calibration_part = {"temperatures": c["temperatures"], "method": c["method"], "ece_bins": c["ece_bins"],
                                "ece_before": c["ece_before"], "ece_after": c["ece_after"],
                                "ece_items": c["ece_items"], "fit_items": c["fit_items"]}  # fmt: skip
            k = summary["conformal"]
            conformal_part = {"alpha": k["alpha"], "kind": k["kind"], "calibration_size": k["calibration_items"],
                              "empirical_coverage": k["test_coverage"], "coverage_items": k["test_items"],
                              "mean_set_size": k["test_mean_set_size"],
                              "density_ratio": self.density_ratio}  # fmt: skip
            if "test_set_frequency" in k:
                conformal_part["set_frequency"] = k["test_set_frequency"]
            shift_part = {"test": summary["shift"]["test"], "reference_size": summary["shift"]["reference_items"],
                          "window": self.shift_window}  # fmt: skip
        intended = self.path / "intended_use.md"
        return {
            "task": self.config.task,
            "method": self.adapter["method"],
            "method_options": self.adapter["options"],
            "adapter_sha256": sha256_file(self.path / "adapter.safetensors"),
            "base_model": {str(p): sha256_file(p) for p in self.task.model_files(self.config.model)
                           if Path(p).is_file()},  # fmt: skip
            "workbench_version": workbench.__version__,
            "run": str(self.path),
            "run_seal": self.sealed,
            "calibration": calibration_part,
            "conformal": conformal_part,
            "shift": shift_part,
            "clinical_layer": self._layer_part(),
            "intended_use": intended.read_text() if intended.is_file() else None,
        }

    def _layer_part(self) -> dict[str, Any]:
        """Where the clinical files answering come from: the run's own, or a site's layer (its folder, data, seal
        and held-out report)."""
        if self.layer is None:
            return {"source": "run", "path": str(self.path)}
        record = self.layer["record"]
        return {"source": "site calibration layer", "path": self.layer["path"], "data": record.get("data", {}).get(
            "folder"), "data_fingerprint": record.get("data", {}).get("fingerprint"), "verified": True,
            "site_report": (self.summary or {}).get("site_report")}  # fmt: skip

    def window(self, caller: str = DEFAULT_CALLER) -> deque[np.ndarray]:
        """``caller``'s rolling window: the last ``shift_window`` features answered for it."""
        if caller not in self._windows:
            self._windows[caller] = deque(maxlen=max(0, self.shift_window))
            self._window_groups[caller] = deque(maxlen=max(0, self.shift_window))
        return self._windows[caller]

    def answer(self, folder: Path, caller: str = DEFAULT_CALLER) -> list[dict[str, Any]]:
        """One JSON-able dict per row the task's ``predict_folder`` gives for ``folder`` (a record; a beat or a
        window where the task scores several per record): record, status, labels, calibrated probabilities,
        conformal set, shift (of the batch with ``caller``'s window). Thread-safe."""
        return self.predict(folder, caller)[1]

    def predict(self, folder: Path, caller: str = DEFAULT_CALLER) -> tuple[Predictions, list[dict[str, Any]],
                                                                          dict[str, Any]]:  # fmt: skip
        """(the task's predictions with the calibrated columns added, `answer`'s dicts, the batch's facts:
        shift and conformal kind), with ``caller``'s state. Thread-safe: one batch at a time."""
        with self._lock:
            predictions, features = shift_alarm.model_features(
                self.model, lambda: self.task.predict_folder(self.model, Path(folder), self.state))
            return self._answers(predictions, features, caller)

    def _answers(self, predictions: Predictions, features: np.ndarray,
                 caller: str) -> tuple[Predictions, list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
        rows = predictions.rows
        classes = list(predictions.facts.get("classes") or self.state.get("classes") or [])
        ok = [i for i, row in enumerate(rows) if row.get("status", "ok") == "ok"]
        probabilities = np.array([[float(rows[i][f"p_{c}"]) for c in classes] for i in ok]).reshape(len(ok),
                                                                                                      len(classes))
        if len(features) != len(ok):  # a task that scored items twice: no features to test
            features = np.zeros((0, 0), np.float32)
        window = self.window(caller)
        groups = np.array([str(rows[i].get("record")) for i in ok]) if len(features) else np.zeros(0, str)
        shift = self._shift(features, groups, window, self._window_groups[caller], self._batches.get(caller, 0))
        calibrated = probabilities
        sets, kind = None, None
        if self.summary is not None and len(ok):
            calibrated = calibration.apply_temperature(probabilities, self.temperatures, self.multilabel)
            sets, kind = self._sets(calibrated, features, window)
        if len(features):
            window.extend(features)
            self._window_groups[caller].extend(groups)
        self._batches[caller] = self._batches.get(caller, 0) + 1
        answers, columns = [], list(predictions.columns)
        if self.summary is not None:
            columns += [f"calibrated_p_{c}" for c in classes] + ["conformal_set"]
        position = {index: j for j, index in enumerate(ok)}
        for i, row in enumerate(rows):
            j = position.get(i)
            answer: dict[str, Any] = {"record": row.get("record"), "status": row.get("status", "ok"), "labels": [],
                                      "probabilities": {}, "conformal_set": None, "conformal_kind": kind,
                                      "shift": shift}  # fmt: skip
            where = {k: v for k, v in row.items() if k not in ("record", "status", "predicted") and not
                     k.startswith(("p_", "label_"))}  # fmt: skip
            if where:
                answer["where"] = where
            if j is not None:
                answer["labels"] = self._labels(row, classes)
                answer["probabilities"] = {c: float(calibrated[j, k]) for k, c in enumerate(classes)}
                if sets is not None:
                    answer["conformal_set"] = self._set(sets[j], classes)
                    row.update({f"calibrated_p_{c}": f"{calibrated[j, k]:.6f}" for k, c in enumerate(classes)})
                    row["conformal_set"] = "|".join(answer["conformal_set"])
                    if self.multilabel:
                        answer["conformal_per_class"] = {c: [y for y in (0, 1) if sets[j, k, y]]
                                                         for k, c in enumerate(classes)}  # fmt: skip
            answers.append(answer)
        facts = {"shift": shift, "conformal_kind": kind}
        return Predictions(columns, rows, predictions.facts), answers, facts

    def _labels(self, row: dict[str, Any], classes: list[str]) -> list[str]:
        if "predicted" in row:
            return [row["predicted"]]
        return [c for c in classes if str(row.get(f"label_{c}", "0")) == "1"]

    def _set(self, chosen: np.ndarray, classes: list[str]) -> list[str]:
        """The set's classes: those whose label is in it (softmax), those that may be present (multi-label: 1 is in
        the class's set)."""
        return [c for k, c in enumerate(classes) if (chosen[k, 1] if self.multilabel else chosen[k])]

    def _shift(self, features: np.ndarray, groups: np.ndarray, window: deque[np.ndarray], window_groups: deque[str],
               batches: int) -> dict[str, Any] | None:  # fmt: skip
        """The alarm's verdict (`workbench.clinical.fit.shift_check`) on the batch's ``features`` (m, d) and their
        records ``groups`` (m,) with the caller's window, seeded by the caller's count of ``batches`` (None without
        a reference)."""
        if self.reference is None:
            return None
        tested = self._incoming(features, window)
        tested_groups = np.concatenate([groups, np.array(window_groups, dtype=str)])[: len(tested)]
        if tested.shape[0] and tested.shape[1] != self.reference.shape[1]:
            raise UserError(f"{self.path}: the model's features have {tested.shape[1]} values, the run's reference "
                            f"{self.reference.shape[1]}: the run's {fit.CLINICAL_NPZ} is not this model's")  # fmt: skip
        result = fit.shift_check(self.reference, tested, tested_groups, self.pool, self.pool_groups, batches)
        return {"statistic": result["statistic"], "p_value": result["p_value"], "verdict": result["verdict"],
                "window": int(len(tested)), "batch": int(len(features)), "null": result["null"]}  # fmt: skip

    def _incoming(self, features: np.ndarray, window: deque[np.ndarray]) -> np.ndarray:
        """The batch's features followed by the window's (n, d)."""
        parts = [f for f in (features, np.array(window)) if len(f)]
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)

    def _sets(self, calibrated: np.ndarray, features: np.ndarray, window: deque[np.ndarray]) -> tuple[np.ndarray, str]:
        """The conformal sets of the batch and their kind: weighted when the incoming items (the batch and the
        caller's window) allow, else split."""
        scores, alpha = self.calibration_scores, fit.ALPHA
        incoming = self._incoming(features, window)
        if len(features) and min(len(incoming), len(self.calibration_features)) >= MIN_WEIGHTED:
            estimator = conformal.density_ratio_estimator(self.density_ratio, seed=0)
            w_cal, w_in = conformal.density_ratio_weights(self.calibration_features, incoming, estimator)
            w_batch = w_in[: len(features)]
            if self.multilabel:
                q = np.stack([conformal.weighted_quantiles(scores[:, k], w_cal, w_batch, alpha)
                              for k in range(scores.shape[1])], axis=1)  # fmt: skip
            else:
                q = conformal.weighted_quantiles(scores, w_cal, w_batch, alpha)
            return conformal.prediction_sets(calibrated, q, self.multilabel), f"weighted ({self.density_ratio})"
        q = np.array([np.inf if q is None else q for q in self.summary["conformal"]["quantiles"]])
        q = q if self.multilabel else q[0]
        return conformal.prediction_sets(calibrated, q, self.multilabel), "split"
