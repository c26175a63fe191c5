"""How far one run's numbers can be trusted: a percentile bootstrap over its test items.

A run scores every model on one test split. Drawing that split's items again with replacement (`RESAMPLES` times,
a generator seeded from the run's seed) and rescoring each model on each draw (`workbench.core.task.Task.rescore`) gives
a 95 % percentile interval of every metric and, with the same draws for two models, a paired interval of their
difference. Where the items come in groups that are not independent (the records of one patient, the windows of one
subject, the frames of one trajectory block) whole groups are drawn: a cluster bootstrap (Davison & Hinkley 1997,
§3.8), whose interval reflects how many groups the split holds, not how many items.

With fewer than `MIN_GROUPS` groups there is nothing to resample groups from (one test subject gives one possible
draw: an interval of width 0): then items are drawn within each group, as many as it holds (a stratified bootstrap),
and the interval holds those groups fixed — it says how much the numbers would move with other items of the same
patients or subjects, not with other ones (`resampled_units` says which applies; the report says it too).

A metric a draw does not define (AUROC of a draw holding one class) is left out of that draw; with fewer than
`MIN_DEFINED` of the draws defining it the metric gets no interval (None).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

#: Resamples of the test items per run.
RESAMPLES = 1000
#: Two-sided level of every interval.
LEVEL = 0.95
#: Least share of resamples that must define a metric for it to get an interval.
MIN_DEFINED = 0.9
#: Fewest groups drawn whole; with fewer, items are drawn within their groups.
MIN_GROUPS = 5

#: Rescores predictions on resamples: ``(predictions, counts (n_resamples, n_items)) -> {metric: (n_resamples,)}``.
Rescore = Callable[[Mapping[str, np.ndarray], np.ndarray], Mapping[str, np.ndarray]]


def resampled_units(groups: np.ndarray) -> str:
    """What `resample_counts` draws for ``groups (n_items,)``: "groups" (whole groups, at least `MIN_GROUPS` of them,
    or every item its own group) or "items within groups"."""
    n_items, n_groups = count_units(groups)
    return "groups" if n_groups >= MIN_GROUPS or n_groups == n_items else "items within groups"


def resample_counts(groups: np.ndarray, rng: np.random.Generator, resamples: int = RESAMPLES) -> np.ndarray:
    """How often each item is drawn in each resample: whole groups drawn with replacement (as many groups as there
    are; items of one group drawn together), or with fewer than `MIN_GROUPS` groups each group's items drawn within
    it (`resampled_units`).

    Shapes: groups (n_items,) any labels (distinct labels: items drawn one by one) → (resamples, n_items) int64.
    """
    _, group_of_item = np.unique(np.asarray(groups), return_inverse=True)
    group_of_item = group_of_item.reshape(-1)
    n_groups = int(group_of_item.max()) + 1 if len(group_of_item) else 0
    if resampled_units(groups) != "groups":
        counts = np.zeros((resamples, len(group_of_item)), np.int64)
        for group in range(n_groups):
            members = np.flatnonzero(group_of_item == group)
            drawn = members[rng.integers(0, len(members), size=(resamples, len(members)))]
            np.add.at(counts, (np.arange(resamples)[:, None], drawn), 1)
        return counts
    drawn = rng.integers(0, n_groups, size=(resamples, n_groups))
    offsets = (np.arange(resamples) * n_groups)[:, None]
    per_group = np.bincount((drawn + offsets).ravel(), minlength=resamples * n_groups).reshape(resamples, n_groups)
    return per_group[:, group_of_item]


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float] | None:
    """The (low, high) percentiles of the defined (non-NaN) resampled ``values`` at ``level``; None when fewer than
    `MIN_DEFINED` of them are defined. Shapes: values (n_resamples,)."""
    values = np.asarray(values, dtype=np.float64)
    defined = values[~np.isnan(values)]
    if not len(values) or len(defined) < MIN_DEFINED * len(values):
        return None
    low, high = np.percentile(defined, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def item_intervals(
    rescore: Rescore,
    predictions: Mapping[str, Mapping[str, np.ndarray]],
    groups: np.ndarray,
    estimates: Mapping[str, Mapping[str, float]],
    pairs: Mapping[str, tuple[str, str]],
    seed: int,
) -> dict[str, dict]:
    """Intervals of every model's metrics and paired intervals of differences between models, from the same
    resamples of the test items.

    Args:
        rescore: the task's `workbench.core.task.Task.rescore`.
        predictions: per model label, its test predictions (`workbench.core.task.Evaluation.predictions`).
        groups: (n_items,) the group of each test item (`workbench.core.task.Evaluation.groups`).
        estimates: per model label, its metrics on the whole split (the point estimates of differences).
        pairs: per difference label, (model label, model label subtracted).
        seed: the run's seed (a rerun draws the same resamples).

    Returns ``{"intervals": {label: {metric: [low, high] | None}}, "differences": {label: {metric: {"estimate",
    "low", "high"}}}}``, over the metrics ``rescore`` gives (low/high None where too few resamples define them).
    """
    counts = resample_counts(groups, np.random.default_rng([seed, 0x1B007]))
    resampled = {label: dict(rescore(values, counts)) for label, values in predictions.items()}
    intervals = {
        label: {metric: _listed(percentile_interval(values)) for metric, values in metrics.items()}
        for label, metrics in resampled.items()
    }
    differences: dict[str, dict] = {}
    for name, (first, second) in pairs.items():
        shared = [m for m in resampled[first] if m in resampled[second] and m in estimates[first]
                  and m in estimates[second]]  # fmt: skip
        differences[name] = {}
        for metric in shared:
            bounds = percentile_interval(resampled[first][metric] - resampled[second][metric])
            differences[name][metric] = {
                "estimate": float(estimates[first][metric]) - float(estimates[second][metric]),
                "low": None if bounds is None else bounds[0],
                "high": None if bounds is None else bounds[1],
            }
    return {"intervals": intervals, "differences": differences}


def _listed(bounds: tuple[float, float] | None) -> list[float] | None:
    return None if bounds is None else list(bounds)


def count_units(groups: Sequence) -> tuple[int, int]:
    """(number of items, number of distinct groups) of ``groups (n_items,)``."""
    groups = np.asarray(groups)
    return len(groups), len(np.unique(groups))
