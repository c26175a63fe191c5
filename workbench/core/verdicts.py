"""What one run's paired differences say, in a sentence: the run's method against the best baseline (`verdict`),
over the test items it was scored on (`scored_units`). The console table, ``report.md`` and the model card say it."""

from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence


def _plural(kind: str, n: int) -> str:
    """``n`` and the noun ``kind``, each alternative ("subject or image") plural when ``n`` is not 1."""
    return f"{n} {kind if n == 1 else ' or '.join(word + 's' for word in kind.split(' or '))}"


def scored_units(metrics: Mapping[str, Any]) -> str:
    """What the test scores rest on: "18 records from 12 patients" (or "40 target nodes" when each item is its own
    group; "N samples" for a run without ``test_units``)."""
    units = metrics.get("test_units")
    if not units or not units.get("items"):
        return f"{metrics['samples']['test']} samples"
    items = _plural(units["item_kind"], units["items"])
    if units["group_kind"] == units["item_kind"]:
        return items
    within = ", resampled within each" if units.get("resampled") == "items within groups" else ""
    return f"{items} from {_plural(units['group_kind'], units['groups'])}{within}"


#: ``workbench compare``'s default seeds (`workbench.comparison.design.CompareSpec.seeds`, which a test checks
#: against): what the verdict line's command names.
COMPARE_SEEDS = "200-202"


def verdict(metrics: Mapping[str, Any], metric_names: Sequence[str], lower_is_better: Collection[str] = ()) -> str:
    """One sentence on the run's method against the best baseline in the headline metric (the first of
    ``metric_names``; best: lowest where ``lower_is_better`` names it, else highest): better, worse, or not told
    apart by the paired 95 % interval of (run's method − best baseline) over the test items, with that difference,
    its interval and the ``workbench compare`` command that settles it across seeds; "" without baselines or
    without an interval for that difference. What the console table, ``report.md`` and a model card say.

    >>> metrics = {"task": "T", "method": "a", "samples": {"test": 40}, "baselines": {"b": {"mae": 1.0}},
    ...            "differences": {"a − b": {"mae": {"estimate": 0.5, "low": 0.2, "high": 0.9}}}}
    >>> verdict(metrics, ["mae"], {"mae"}).split(":")[0]
    'a is worse than b (the best baseline) in mae (lower is better)'
    """
    metric, method = metric_names[0] if metric_names else "", metrics["method"]
    scored = {name: values[metric] for name, values in metrics.get("baselines", {}).items() if metric in values}
    if not scored:
        return ""
    lower = metric in lower_is_better
    best = (min if lower else max)(scored, key=scored.__getitem__)
    difference = metrics.get("differences", {}).get(f"{method} − {best}", {}).get(metric)
    if not difference or difference["low"] is None:
        return ""
    low, high = difference["low"], difference["high"]
    direction = "lower" if lower else "higher"
    if low <= 0 <= high:
        said = f"{method} and {best} (the best baseline) cannot be told apart in {metric} ({direction} is better)"
    else:
        better = (high < 0) == lower
        said = f"{method} is {'better' if better else 'worse'} than {best} (the best baseline) in {metric} " \
               f"({direction} is better)"  # fmt: skip
    return (
        f"{said}: {method} − {best} = {difference['estimate']:+.3f}, 95 % interval [{low:+.3f}, {high:+.3f}] over "
        f"{scored_units(metrics)} of this one split, not over training seeds; across seeds: `workbench compare "
        f"--domain {metrics['task']} --methods {method},{best} --seeds {COMPARE_SEEDS}`"
    )
