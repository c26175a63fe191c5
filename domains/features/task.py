"""The ``features`` task: adapt a classifier or regressor on fixed feature vectors across a domain shift.

For users who already have embeddings (from any foundation model) or measurements: a labelled source
table and a target table (labels optional, used only for scoring). With no ``--data`` it generates a
problem with known ground truth (seeded by ``--seed``):

- ``partial-da``: Gaussian classes, the target holds only some of them (known outlier classes) and is
  shifted — the setting of WARMPOT's partial-OT weights;
- ``covariate-shift``: regression whose inputs move between domains with the density ratio known in
  closed form — the setting of importance weighting (ppDRE).

The model is a `FeatureNet` (MLP; linear for the covariate-shift problem). Before any method runs, it
is trained on the source alone ("before" = source-only model); every method then continues from it.
Target samples are split once into an unlabelled adaptation pool (``TaskData.target``, labels removed)
and a labelled test split that scores every method.

Loss: cross-entropy (classes) or squared error (values), per sample, so methods can weight samples.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from workbench.domains.features import plots
from workbench.domains.features.covariate_shift import make_covariate_shift
from workbench.domains.features.partial_da import make_partial_da
from workbench.domains.features.readers import FeatureSet, ShiftProblem, read_feature_pair
from workbench.models.mlp import FeatureNet

from workbench.core import resampled_metrics
from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.metrics import classification_scores
from workbench.core.options import Option
from workbench.core.registry import tasks
from workbench.core.task import Evaluation, Task, TaskData, held_out_groups

#: Methods that weight samples by a density ratio: they get the covariate-shift problem by default.
DENSITY_RATIO_METHODS = ("dre-pp", "dre-ulsif", "dre-kliep", "dre-logistic")
PARTIAL_DA_METHODS = ("warmpot", "pada", "oracle", "full")


class FeatureSample:
    """One sample: features (d,) float32, a label (class index, value, or unknown) and a run-wide id."""

    __slots__ = ("x", "y", "id")

    def __init__(self, x: np.ndarray, y: float | int, id: int):
        self.x, self.y, self.id = x, y, id


class FeatureBatch(NamedTuple):
    """x (batch, d), y (batch,) int64 or float32, ids (batch,) int64 — on one device."""

    x: torch.Tensor
    y: torch.Tensor
    ids: torch.Tensor


@tasks.register
class FeatureShift(Task):
    """Classification or regression on feature vectors, source → target."""

    name = "features"
    description = (
        "Source -> target shift on feature vectors (your embeddings, or generated partial-DA / covariate shift)"
    )
    card = "features-generated"
    reads = ("features",)
    requires = ("sklearn", "ot", "pandas")
    extra = "shift"
    default_model = "mlp"
    default_method = "warmpot"
    capabilities = frozenset({"target_pool", "folds"})
    group_kind = "target row"
    item_kind = "target row"
    baselines = ("pada", "full", "oracle")
    metrics = ("accuracy", "balanced_accuracy", "macro_f1")
    metrics_note = (
        "Scores on the target's labelled test split, higher is better: accuracy, balanced accuracy (mean recall "
        "over the target's classes), macro F1. `outlier_weight_share` in metrics.json: the share of source weight "
        "on classes absent from the target."
    )
    defaults = {"epochs": 60, "batch_size": 64, "train_size": 800, "patience": 20, "learning_rate": 1e-3}
    examples = (
        "workbench adapt --domain features --method warmpot      # partial DA: a target site lacking classes",
        "workbench adapt --domain features --method dre-pp       # covariate shift: importance weights",
        "workbench data generate features --out my_problem --problem partial-da",
    )
    options = (
        Option(
            "problem",
            str,
            "partial-da",
            "generated problem when no --data is given",
            choices=("partial-da", "covariate-shift"),
        ),
        Option("dim", int, 0, "feature dimension of the generated problem (0: the generator's default)"),
        Option("kind", str, "auto", "what the labels are", choices=("auto", "classification", "regression")),
        Option("hidden", str, "auto", "hidden widths, e.g. '64,64'; '' for a linear model; auto: 64,64 or linear"),
        Option("target_test_fraction", float, 0.5, "share of target samples held out (labelled) for scoring"),
        Option("pretrain_epochs", int, 200, "full-batch Adam steps of the source-only model (before any method)"),
    )

    @classmethod
    def profile(cls, method: str) -> dict[str, Any]:
        if method in DENSITY_RATIO_METHODS:
            others = tuple(name for name in DENSITY_RATIO_METHODS if name != method)
            return {"options": {"problem": "covariate-shift"}, "baselines": ("full", *others)}
        return {}

    def __init__(self, **options: Any):
        super().__init__(**options)
        if not 0 < self.config["target_test_fraction"] < 1:
            raise UserError(f"--target-test-fraction must be in (0, 1), got {self.config['target_test_fraction']}")
        self.problem: ShiftProblem | None = None
        self.kind = "classification"

    # -- data and model --------------------------------------------------------------------------
    def read(self, data: str | Path | None, seed: int = 0) -> ShiftProblem:
        if data is None:
            problem = generated_problem(self.config["problem"], self.config["dim"], seed)
        else:
            problem = read_feature_pair(data, self.config["kind"])
        if problem.target.labels is None:
            raise UserError(
                f"{problem.target.path}: the target has no labels; the features task scores adaptation on labelled "
                "target samples — add labels for some target rows (the others may be NaN, or -1 for classes)"
            )
        self._set_kind(problem.kind)
        self.problem, self.seed = problem, seed
        return problem

    def default_data(self, seed: int) -> str:
        """The generator of the default problem, its options and ``seed``."""
        return f"generated_problem(problem={self.config['problem']!r}, dim={self.config['dim']}, seed={seed})"

    def split_groups(self, raw: ShiftProblem) -> list[str]:
        """The target's labelled rows, one group each (``row<i>``, i the row in the target file)."""
        return [f"row{i}" for i in np.flatnonzero(_known(raw.target.labels))]

    def hold_out(self, raw: ShiftProblem, split: Mapping[str, Sequence[str]]) -> ShiftProblem:
        """``raw`` with the target rows ``split["test"]`` as its labelled test split. Every other target row is in
        the unlabelled adaptation pool (its label unseen) and validation stays on held-out source samples: a method
        never sees a target label before scoring, so ``split["val"]`` rows join the pool."""
        parts = held_out_groups(self.split_groups(raw), split, str(raw.target.path), self.group_kind)
        rows = np.array(sorted(int(group.removeprefix("row")) for group in parts["test"]), dtype=np.int64)
        return dataclasses.replace(raw, test_rows=rows)

    def _set_kind(self, kind: str) -> None:
        self.kind = kind
        if kind == "regression":
            self.lower_is_better = frozenset({"mse", "mae"})
            self.metrics = ("mse", "mae", "r2")
            self.metrics_note = "Errors on the target's labelled test split; lower is better (r2: higher is better)."

    def _hidden(self, kind: str) -> tuple[int, ...]:
        text = self.config["hidden"]
        if text == "auto":
            return (64, 64) if kind == "classification" else ()
        try:
            return tuple(int(width) for width in text.split(",") if width.strip())
        except ValueError:
            raise UserError(f"--hidden must be comma-separated integers (e.g. 64,64) or '', got {text!r}") from None

    def model_sizes(self) -> dict[str, Any]:
        if self.problem is None:
            raise RuntimeError("read() comes before load_model() for the features task")
        problem = self.problem
        return {
            "in_features": problem.source.features.shape[1],
            "n_outputs": problem.n_outputs,
            "hidden": self._hidden(problem.kind),
        }

    def load_model(self, source: str | Path | None, trust_checkpoint: bool = False) -> nn.Module:
        """The registered model (fresh: trained on the source in `prepare`) or a checkpoint (used as it is)."""
        model = super().load_model(source, trust_checkpoint)
        model.pretrained = self.model_choice(source)[1] is not None
        return model

    def prepare(
        self, model: nn.Module, raw: ShiftProblem, train_size: int, val_size: int, seed: int
    ) -> tuple[TaskData, dict[str, Any]]:
        n_source = len(raw.source.features)
        if train_size + val_size > n_source:
            raise UserError(
                f"{raw.source.path}: {n_source} source samples; --train-size {train_size} plus {val_size} validation "
                "samples do not fit (lower --train-size or --val-size)"
            )
        rng = np.random.default_rng(seed)
        order = rng.permutation(n_source)
        train = _samples(raw.source, order[:train_size], start=0)
        val = _samples(raw.source, order[train_size : train_size + val_size], start=train_size)
        test_index = self._target_test_index(raw, seed)
        pool_index = np.setdiff1d(np.arange(len(raw.target.features)), test_index)
        if len(pool_index) == 0:
            raise UserError(f"{raw.target.path}: no target samples are left for adaptation after the test split")
        first_id = train_size + val_size
        target = _samples(FeatureSet(raw.target.features, None, raw.target.path), pool_index, start=first_id)
        test = _samples(raw.target, test_index, start=first_id + len(pool_index))
        x_train = raw.source.features[order[:train_size]]
        if not getattr(model, "pretrained", False):
            model.set_standardisation(torch.as_tensor(x_train.mean(0)), torch.as_tensor(x_train.std(0)))
            self._fit_source(model, train, seed)
        summary = {
            "source": raw.description,
            "kind": raw.kind,
            "samples": {"source_train": len(train), "source_val": len(val), "target_pool": len(target)},
            "target_test": len(test),
        }
        if raw.kind == "classification":
            summary["source_classes"] = sorted(int(c) for c in np.unique(raw.source.labels))
            summary["target_classes"] = sorted(int(c) for c in np.unique(raw.target.labels[_known(raw.target.labels)]))
        data = TaskData(train, val, test, raw.description, summary, target=target)
        return data, self._state(model)

    def _target_test_index(self, raw: ShiftProblem, seed: int) -> np.ndarray:
        """Rows of the target's labelled test split: those a fold chose, else a seeded ``target_test_fraction`` of
        the labelled rows."""
        if raw.test_rows is not None:
            return raw.test_rows
        known = np.flatnonzero(_known(raw.target.labels))
        size = max(1, int(round(len(known) * self.config["target_test_fraction"])))
        return np.sort(np.random.default_rng([seed, 1]).permutation(known)[:size])

    def _fit_source(self, model: FeatureNet, train: Sequence[FeatureSample], seed: int) -> None:
        """The source-only model: full-batch Adam (lr 1e-2) on the training samples, seeded."""
        torch.manual_seed(seed)
        batch = self.collate(train, device_of(model))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(self.config["pretrain_epochs"]):
            optimizer.zero_grad()
            self.loss(model, batch, True).backward()
            optimizer.step()

    def _state(self, model: FeatureNet) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "architecture": model.architecture,
            "input_mean": model.input_mean.tolist(),
            "input_scale": model.input_scale.tolist(),
        }

    def restore(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        model.set_standardisation(torch.tensor(state["input_mean"]), torch.tensor(state["input_scale"]))
        self._set_kind(state["kind"])

    def rebuild(self, source: str | Path | None, trust_checkpoint: bool, state: Mapping[str, Any]) -> nn.Module:
        architecture = state["architecture"]
        model = FeatureNet(architecture["in_features"], architecture["n_outputs"], architecture["hidden"])
        self.restore(model, state)
        return model

    def test_samples(self, model: nn.Module, raw: ShiftProblem) -> list[FeatureSample]:
        expected = model.architecture["in_features"]
        if raw.target.features.shape[1] != expected:
            raise UserError(f"{raw.target.path}: {raw.target.features.shape[1]} features; the model takes {expected}")
        return _samples(raw.target, self._target_test_index(raw, self.seed), start=0)

    # -- training and scoring --------------------------------------------------------------------
    def collate(self, samples: Sequence[FeatureSample], device: torch.device) -> FeatureBatch:
        x = torch.as_tensor(np.stack([s.x for s in samples]), device=device)
        dtype = torch.int64 if self.kind == "classification" else torch.float32
        y = torch.tensor([s.y for s in samples], dtype=dtype, device=device)
        ids = torch.tensor([s.id for s in samples], dtype=torch.int64, device=device)
        return FeatureBatch(x, y, ids)

    def sample_losses(self, model: nn.Module, batch: FeatureBatch) -> torch.Tensor:
        output = model(batch.x)
        if batch.y.dtype == torch.int64:
            return F.cross_entropy(output, batch.y, reduction="none")
        return (output.squeeze(-1) - batch.y) ** 2

    def loss(self, model: nn.Module, batch: FeatureBatch, training: bool) -> torch.Tensor:
        return self.sample_losses(model, batch).mean()

    def embed(self, model: nn.Module, batch: FeatureBatch) -> tuple[torch.Tensor, torch.Tensor]:
        net = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        features = net.features(batch.x)
        return features, net.head(features)

    def batch_labels(self, batch: FeatureBatch) -> torch.Tensor:
        return batch.y

    def batch_ids(self, batch: FeatureBatch) -> torch.Tensor:
        return batch.ids

    def sample_ids(self, samples: Sequence[FeatureSample]) -> np.ndarray:
        return np.array([s.id for s in samples], dtype=np.int64)

    def sample_inputs(self, samples: Sequence[FeatureSample]) -> np.ndarray:
        return np.stack([s.x for s in samples])

    def evaluate(self, model: nn.Module, samples: Sequence[FeatureSample], device) -> Evaluation:
        model.eval()
        with torch.no_grad():
            batch = self.collate(samples, device)
            output = model(batch.x).cpu()
        truth = batch.y.cpu().numpy()
        if self.kind == "regression":
            predicted = output.squeeze(-1).numpy()
            error = predicted - truth
            metrics = {
                "mse": float(np.mean(error**2)),
                "mae": float(np.mean(np.abs(error))),
                "r2": float(1 - np.sum(error**2) / np.sum((truth - truth.mean()) ** 2)),
            }
            predictions = {"truth": truth, "predicted": predicted, "x": batch.x.cpu().numpy()}
            return Evaluation(metrics, predictions, self.sample_ids(samples))
        probabilities = torch.softmax(output, dim=-1).numpy()
        predicted = probabilities.argmax(-1)
        predictions = {"truth": truth, "probabilities": probabilities}
        return Evaluation(classification_scores(truth, predicted), predictions, self.sample_ids(samples))

    def rescore(self, predictions: Mapping[str, np.ndarray], counts: np.ndarray) -> dict[str, np.ndarray]:
        """`evaluate`'s metrics of resampled target rows (independent rows: each its own group)."""
        truth = predictions["truth"]
        if "probabilities" not in predictions:  # regression
            error = predictions["predicted"] - truth
            centre = resampled_metrics.mean(truth, counts)
            spread = (np.asarray(counts, np.float64) * (truth[None, :] - centre[:, None]) ** 2).sum(axis=1)
            mse = resampled_metrics.mean(error**2, counts)
            with np.errstate(divide="ignore", invalid="ignore"):
                r2 = 1 - mse * counts.sum(axis=1) / spread
            return {"mse": mse, "mae": resampled_metrics.mean(np.abs(error), counts), "r2": r2}
        probabilities = predictions["probabilities"]
        matrices = resampled_metrics.confusion(truth, probabilities.argmax(-1), counts, probabilities.shape[1])
        scores = resampled_metrics.label_scores(matrices)
        return {name: scores[name] for name in ("accuracy", "balanced_accuracy", "macro_f1")}

    def figures(self, evaluations: Mapping[str, Evaluation], out_dir: Path) -> list[tuple[str, str]]:
        if "probabilities" in next(iter(evaluations.values())).predictions:
            return [plots.confusion_matrices(evaluations, out_dir)]
        return [plots.regression_fits(evaluations, out_dir)]

    # -- data commands ---------------------------------------------------------------------------
    def info(self, data: str | Path | None) -> str:
        problem = self.read(data)
        source, target = problem.source, problem.target
        lines = [
            f"data: {problem.description} ({problem.kind})",
            f"source: {len(source.features)} samples × {source.features.shape[1]} features ({source.path})",
            f"target: {len(target.features)} samples, {int(_known(target.labels).sum())} labelled ({target.path})",
            f"domain separability (5-fold AUROC of a logistic source-vs-target classifier): "
            f"{domain_auroc(source.features, target.features):.3f}  (0.5: no shift)",
        ]
        if problem.kind == "classification":
            for name, labels in (("source", source.labels), ("target", target.labels[_known(target.labels)])):
                classes, counts = np.unique(labels, return_counts=True)
                lines.append(f"{name} classes: " + ", ".join(f"{c}: {n}" for c, n in zip(classes, counts)))
        for key, value in problem.truth.items():
            if np.ndim(value) <= 1 and not callable(value):
                lines.append(f"ground truth {key}: {np.asarray(value).tolist()}")
        return "\n".join(lines)

    def generate(self, out: Path, seed: int | None = None) -> str:
        """Write the generated problem as ``source.npz`` / ``target.npz`` (the ``features`` layout)."""
        seed = 0 if seed is None else seed
        problem = generated_problem(self.config["problem"], self.config["dim"], seed)
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        from workbench.core.checkpoint import atomic_path

        for name, domain in (("source", problem.source), ("target", problem.target)):
            with atomic_path(out / f"{name}.npz") as tmp:
                with open(tmp, "wb") as handle:
                    np.savez(handle, features=domain.features, labels=domain.labels)
        return f"wrote {out}/source.npz and target.npz ({problem.description}; read with --data {out})"


def _known(labels: np.ndarray) -> np.ndarray:
    return labels >= 0 if labels.dtype.kind in "iu" else ~np.isnan(labels)


def _samples(domain: FeatureSet, index: np.ndarray, start: int) -> list[FeatureSample]:
    """Samples of ``domain`` at ``index`` with ids ``start, start + 1, ...`` (label -1 when it has none)."""
    labels = domain.labels
    return [
        FeatureSample(domain.features[i], -1 if labels is None else labels[i].item(), start + k)
        for k, i in enumerate(index)
    ]


def domain_auroc(source: np.ndarray, target: np.ndarray, seed: int = 0) -> float:
    """Cross-validated AUROC of a logistic classifier telling target from source (0.5: indistinguishable)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.concatenate([source, target])
    y = np.concatenate([np.zeros(len(source)), np.ones(len(target))])
    classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    folds = min(5, len(source), len(target))
    return float(np.mean(cross_val_score(classifier, x, y, cv=folds, scoring="roc_auc")))


def generated_problem(problem: str, dim: int, seed: int) -> ShiftProblem:
    """A generated source/target pair with its ground truth (see the module docstring)."""
    if problem == "covariate-shift":
        draw = make_covariate_shift(dim=dim or 20, seed=seed)
        unlabelled = np.full(len(draw.x_target), np.nan)
        return ShiftProblem(
            FeatureSet(draw.x_source.astype(np.float32), draw.y_source.astype(np.float32), "generated source"),
            FeatureSet(
                np.concatenate([draw.x_target, draw.x_test]).astype(np.float32),
                np.concatenate([unlabelled, draw.y_test]).astype(np.float32),
                "generated target",
            ),
            "regression",
            f"generated covariate shift (Gaussian, d={draw.shift.dim}, seed {seed})",
            truth={"true_ratio": draw.true_ratio},
        )
    # Overlapping classes (separation 5 noise-σ) and a translation of 3: outlier classes now pull target
    # samples (logistic regression: 0.72 target accuracy from all source classes, 0.88 from the shared ones).
    draw = make_partial_da(**({"dim": dim} if dim else {}), separation=5.0, shift=3.0, seed=seed)
    return ShiftProblem(
        FeatureSet(draw.source_x.astype(np.float32), draw.source_y.astype(np.int64), "generated source"),
        FeatureSet(draw.target_x.astype(np.float32), draw.target_y.astype(np.int64), "generated target"),
        "classification",
        f"generated partial DA ({draw.source_x.shape[1]} features, outlier classes "
        f"{list(map(int, draw.outlier_classes))}, seed {seed})",
        truth={"outlier_classes": np.asarray(draw.outlier_classes)},
    )
