"""The run's human-readable side: the before/after table, learning curves and ``report.md``."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

import yaml
from matplotlib.figure import Figure

from workbench.core.config import RunConfig
from workbench.core.task import TaskData
from workbench.core.verdicts import scored_units, verdict


def _rows(
    metrics: Mapping[str, Any], default_method: str | None
) -> list[tuple[str, str, Mapping[str, float], Mapping[str, Any] | None]]:
    """(label, key in ``metrics["intervals"]``, metrics, costs) of each row: the base model, the run's method, the
    baselines."""
    whose = "task's default method" if metrics["method"] == default_method else "this run's method"
    rows = [
        ("before (pretrained)", "before", metrics["before"], None),
        (f"{metrics['method']} ({whose})", "after", metrics["after"], metrics["costs"][metrics["method"]]),
    ]
    rows += [(name, name, values, metrics["costs"][name]) for name, values in metrics["baselines"].items()]
    return rows


def _cell(values: Mapping[str, float], bounds: Mapping[str, Any], name: str, spec: str) -> str:
    """``value [low, high]`` (the 95 % interval over test items, where the run has one), or "-" where this data give
    no value."""
    if name not in values:
        return "-"
    interval = bounds.get(name)
    value = format(values[name], spec)
    return value if interval is None else f"{value} [{format(interval[0], spec)}, {format(interval[1], spec)}]"


#: What the tables' memory column counts (`workbench.core.memory.training_step_bytes`, metrics.json
#: ``training_step_bytes``).
MEMORY_NOTE = (
    "step MiB: peak bytes of the tensors one training step allocates — activations, gradients, optimizer and "
    "EMA state; not the model's own weights, nor on a CPU an input batch made from NumPy memory — measured over 2 "
    "steps after a warm-up on a copy of the model (on a GPU: max_memory_allocated). metrics.json also keeps the "
    "process's resident peak (peak_memory_bytes) and what training added to it (training_memory_bytes); on a CPU "
    "these include what the C heap keeps cached and do not separate methods."
)


#: How the report counts epochs (metrics.json keeps the trainer's indices).
EPOCHS_NOTE = (
    "Epochs are counted from 1 here and on the console; metrics.json's history (`epoch`) and `best_epoch` "
    "number them from 0."
)


def _megabytes(cost: Mapping[str, Any]) -> str:
    """Peak tensor memory of one training step of a method [MiB] ("-" when it takes no step)."""
    step = cost.get("training_step_bytes")
    return "-" if step is None else f"{step / 2**20:.1f}"


#: Widest console table [characters]: a wider one wraps its column names at "_" and, if still wider, shows its cost
#: columns in a second table under the metrics; lines under it wrap at this width.
CONSOLE_WIDTH = 120


def table(
    metrics: Mapping[str, Any], metric_names: Sequence[str], default_method: str | None = None,
    lower_is_better: Collection[str] = (),
) -> str:  # fmt: skip
    """A fixed-width before/after table for the terminal: each metric ``value [low, high]`` with its 95 % interval
    over the test items, the title saying how many items (and groups) they are (and the data's ``caveat``, where
    the task's data summary gives one), and the `verdict` line under it; at most `CONSOLE_WIDTH` wide where the
    cells allow (`_blocks`)."""
    header = ["model", *metric_names, "trainable params", "s/epoch", "step MiB", "epochs run"]
    lines = []
    intervals = metrics.get("intervals", {})
    for label, key, values, cost in _rows(metrics, default_method):
        lines.append(
            [
                label,
                *(_cell(values, intervals.get(key, {}), m, ".2f") for m in metric_names),
                f"{cost['trainable_parameters']:,}" if cost else "-",
                f"{cost['seconds_per_epoch']:.2f}" if cost else "-",
                _megabytes(cost) if cost else "-",
                str(cost["epochs"]) if cost else "-",
            ]
        )
    title = f"{metrics['task']}: test split ({scored_units(metrics)}; trained on {metrics['samples']['train']})"
    caveat = (metrics.get("data_summary") or {}).get("caveat")
    title += f"; {caveat}" if caveat else ""
    footer = [_skipped_line(metrics)] if metrics.get("skipped_records", {}).get("skipped") else []
    footer += [line for line in [verdict(metrics, metric_names, lower_is_better)] if line]
    return "\n".join([title, *_blocks(header, lines, 1 + len(metric_names)), *map(_wrapped, footer)])


def _blocks(header: list[str], rows: list[list[str]], n_metric_columns: int) -> list[str]:
    """The table's lines: one block; past `CONSOLE_WIDTH`, column names wrapped at "_" and spaces onto several
    lines, and the columns packed in order into blocks of at most that width (each metric column on its own, the
    cost columns, from ``n_metric_columns`` on, together), the row labels repeated in each."""
    block = _block(header, rows, wrap=False)
    if len(block[0]) <= CONSOLE_WIDTH:
        return block
    widths = [_column_width(name, [row[i] for row in rows], wrap=bool(i)) for i, name in enumerate(header)]
    units = [[i] for i in range(1, n_metric_columns)] + [list(range(n_metric_columns, len(header)))]
    groups, used = [[0]], widths[0]
    for unit in filter(None, units):
        need = sum(widths[i] + 2 for i in unit)
        if len(groups[-1]) > 1 and used + need > CONSOLE_WIDTH:
            groups, used = [*groups, [0]], widths[0]
        groups[-1] += unit
        used += need
    return [line for group in groups
            for line in _block([header[i] for i in group], [[row[i] for i in group] for row in rows], wrap=True)]


def _name_lines(name: str, width: int) -> list[str]:
    """``name`` cut after "_" and at spaces into lines of at most ``width`` characters where its words allow."""
    lines = [""]
    for piece in re.findall(r"[^_ ]+[_ ]?|[_ ]", name):
        if lines[-1] and len(lines[-1] + piece.rstrip(" ")) > width:
            lines.append("")
        lines[-1] += piece
    return [line.rstrip(" ") for line in lines]


def _column_width(name: str, cells: list[str], wrap: bool) -> int:
    """A column's width: its widest cell, or its name's widest line (``wrap``: `_name_lines`) where wider."""
    width = max(map(len, cells))
    return max(width, *map(len, _name_lines(name, width) if wrap else [name]))


def _block(header: list[str], rows: list[list[str]], wrap: bool) -> list[str]:
    """Rule, column names (after the first, each wrapped at "_" and spaces to its values' width when ``wrap``),
    rule, rows, rule."""
    widths = [_column_width(name, [row[i] for row in rows], wrap and bool(i)) for i, name in enumerate(header)]
    names = [_name_lines(name, w) if wrap and i else [name] for i, (name, w) in enumerate(zip(header, widths))]
    depth = max(map(len, names))
    names = [[""] * (depth - len(pieces)) + pieces for pieces in names]  # names end on the rule's line

    def fmt(row: list[str]) -> str:
        return "  ".join(
            str(cell).rjust(w) if i else str(cell).ljust(w) for i, (cell, w) in enumerate(zip(row, widths))
        )

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    return [rule, *(fmt([pieces[k] for pieces in names]) for k in range(depth)), rule, *map(fmt, rows), rule]


def _wrapped(line: str) -> str:
    """``line`` wrapped at `CONSOLE_WIDTH`, a `command` in backticks at its end kept whole on a line of its own."""
    text, _, command = line.partition(" `")
    text = re.sub(r"\[([^\]]*), ([^\]]*)\]", "[\\1,\u00a0\\2]", text).replace(" % ", "\u00a0% ")  # kept whole
    lines = [piece.replace("\u00a0", " ") for piece in textwrap.wrap(text, CONSOLE_WIDTH, break_on_hyphens=False)]
    if command:
        lines += [f"  `{command}"]
    return "\n".join(lines)


def _skipped_line(metrics: Mapping[str, Any]) -> str:
    skipped = metrics["skipped_records"]
    of = f" of {skipped['seen']}" if skipped["seen"] else ""
    return f"{skipped['skipped']}{of} record(s) skipped (bad records; listed in metrics.json)"


def _interval_note(metrics: Mapping[str, Any]) -> str:
    units = metrics.get("test_units", {})
    if not metrics.get("intervals"):
        return "No intervals: this run's test predictions cannot be rescored on resamples of the test items."
    whole = "" if units["group_kind"] == units["item_kind"] else f" (whole {units['group_kind']}s at a time)"
    if units.get("resampled") == "items within groups":
        whole = (f" ({units['item_kind']}s drawn within each {units['group_kind']}: too few {units['group_kind']}s to "
                 f"draw them; the interval holds these {units['group_kind']}s fixed)")  # fmt: skip
    return (
        f"[low, high]: 95 % percentile bootstrap interval over the test split's {scored_units(metrics)}, "
        f"{units['resamples']} resamples{whole}; it says how much these numbers would move on another draw of "
        "test items, not over training seeds or data splits."
    )


def _differences(
    metrics: Mapping[str, Any], metric_names: Sequence[str], lower_is_better: Collection[str]
) -> list[str]:
    """The report's section of paired differences (same resampled test items for both models), and the verdict."""
    differences = metrics.get("differences", {})
    if not differences:
        return []
    lines = ["", "## Paired differences", "",
             "Each row: one model minus another on the same resampled test items; estimate [95 % interval]. An "
             "interval holding 0 means this split cannot tell the two apart.", "",
             "| difference | " + " | ".join(metric_names) + " |", "|" + "---|" * (len(metric_names) + 1)]  # fmt: skip
    for name, values in differences.items():
        cells = []
        for metric in metric_names:
            value = values.get(metric)
            if value is None:
                cells.append("-")
            elif value["low"] is None:
                cells.append(f"{value['estimate']:+.3f}")
            else:
                cells.append(f"{value['estimate']:+.3f} [{value['low']:+.3f}, {value['high']:+.3f}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    line = verdict(metrics, metric_names, lower_is_better)
    return lines + (["", f"**{line}**"] if line else [])


def learning_curves(
    results: Mapping[str, Mapping[str, Any]], out_dir: Path, name: str = "learning_curves.png"
) -> tuple[str, str]:
    """Training and validation loss per epoch for every method that trains (log scale)."""
    figure = Figure(figsize=(6.4, 4.2))
    axis = figure.subplots()
    for index, (method, result) in enumerate(results.items()):
        if not result["history"]:  # a method that takes no gradient step
            continue
        epochs = [h["epoch"] + 1 for h in result["history"]]
        color = f"C{index}"
        axis.plot(epochs, [h["val_loss"] for h in result["history"]], color=color, label=f"{method} (validation)")
        axis.plot(epochs, [h["train_loss"] for h in result["history"]], color=color, ls=":", alpha=0.7)
        axis.plot([result["best_epoch"] + 1], [result["history"][result["best_epoch"]]["val_loss"]], "o", color=color)
    axis.set_yscale("log")
    axis.set_xlabel("epoch (from 1)")
    axis.set_ylabel("loss (dotted: training)")
    if axis.lines:
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(Path(out_dir) / name, dpi=110)
    return "Learning curves (dots: the epoch whose weights were kept)", name


def _recipe_lines(config: RunConfig) -> list[str]:
    """What the run's recipe is and what the run does otherwise (`workbench.core.recipe.deviations`); none without."""
    if not config.recipe:
        return []
    from workbench.core.recipe import deviations
    from workbench.core.registry import methods

    changed = deviations(config, methods)
    owner, name = config.recipe.rsplit(":", 1)
    source = methods.get(owner).recipes[name].source
    said = "; ".join(changed) if changed else "none"
    return [f"Recipe: `{config.recipe}` ({source}), for every method of the run. Where this run departs from it: "
            f"{said}.", ""]  # fmt: skip


def markdown(
    config: RunConfig,
    data: TaskData,
    metrics: Mapping[str, Any],
    figures: Sequence[tuple[str, str]],
    metric_names: Sequence[str],
    metrics_note: str = "Errors are on the test split; lower is better.",
    default_method: str | None = None,
    lower_is_better: Collection[str] = (),
    clinical: Mapping[str, Any] | None = None,
) -> str:
    """The run's ``report.md``: what was run, the table (with 95 % intervals over the test items), the paired
    differences, the plots, calibration, conformal sets and shift check (``clinical``: `workbench.clinical.fit`'s
    record, None for none), the configuration."""
    columns = [*metric_names, "trainable params", "s/epoch", "step MiB", "epochs run (best, from 1)"]
    header = "| model | " + " | ".join(columns) + " |"
    caveat = (metrics.get("data_summary") or {}).get("caveat")
    lines = [
        f"# {config.task}: {config.method} vs {', '.join(map(str, config.baselines)) or 'no baselines'}",
        "",
        f"Data: `{data.source}` — {metrics['samples']['train']} training, {metrics['samples']['val']} validation, "
        f"{metrics['samples']['test']} test samples ({scored_units(metrics)}). Seed {config.seed}, device "
        f"{config.device}." + (f" **Caveat: {caveat}.**" if caveat else ""),
        "",
        *_recipe_lines(config),
        header,
        "|" + "---|" * (len(metric_names) + 5),
    ]
    intervals = metrics.get("intervals", {})
    for label, key, values, cost in _rows(metrics, default_method):
        extra = "- | - | - | -"
        if cost:
            extra = (
                f"{cost['trainable_parameters']:,} | {cost['seconds_per_epoch']:.2f} | {_megabytes(cost)} | "
                f"{cost['epochs']} ({cost['best_epoch'] + 1})"
            )
        cells = " | ".join(_cell(values, intervals.get(key, {}), m, ".3f") for m in metric_names)
        lines.append(f"| {label} | {cells} | {extra} |")
    lines += ["", metrics_note, "", _interval_note(metrics), "", MEMORY_NOTE, "", EPOCHS_NOTE]
    lines += _differences(metrics, metric_names, lower_is_better)
    skipped = metrics.get("skipped_records", {})
    if skipped.get("skipped"):
        lines += ["", "## Skipped records", "", _skipped_line(metrics) + ":", ""]
        lines += [f"- `{item['record']}`: {item['problem']}" for item in skipped["records"]]
    for caption, file_name in figures:
        lines += ["", f"## {caption}", "", f"![{caption}]({file_name})"]
    if clinical is not None:
        lines += _clinical_lines(clinical)
    lines += [
        "",
        "## Configuration",
        "",
        "```yaml",
        yaml.safe_dump(config.to_dict(), sort_keys=False).rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def _clinical_lines(clinical: Mapping[str, Any]) -> list[str]:
    """The report's section on calibration, conformal sets and the shift check (`workbench.clinical.fit`)."""
    cal, conf, shift = clinical["calibration"], clinical["conformal"], clinical["shift"]
    check = shift["test_split"]
    verdict = check["verdict"] if check["p_value"] is None else f"{check['verdict']} (p = {check['p_value']:.3f})"
    temperatures = ", ".join(f"{t:.3g}" for t in cal["temperatures"])
    return [
        "", "## Calibration, conformal sets and shift check", "",
        f"Split: {clinical['split']}.", "",
        f"- Calibration: {cal['method']}; T = {temperatures}"
        + (f" (kept at 1 for classes {cal['unfitted_classes']}: under {cal['min_fit_items']} fitting items, or one "
           "label value only)"
           if cal["unfitted_classes"] else "")
        + f". ECE ({cal['ece_bins']}, {cal['ece_items']} held-out items): {cal['ece_before']:.3f} before, "
        f"{cal['ece_after']:.3f} after.",
        f"- Conformal: {conf['kind']}; nominal {1 - conf['alpha']:.0%}, {conf['calibration_items']} calibration "
        f"items; on the {conf['test_items']} test items coverage {conf['test_coverage']:.3f}, mean set size "
        f"{conf['test_mean_set_size']:.2f}" + (" (calibration too small for a finite quantile: every set is full)"
                                               if None in conf["quantiles"] else "") + ".",
        f"- Shift alarm: {shift['test']}; {shift['reference_items']} reference (training) items. The test split "
        f"against them: {verdict}.",
        "", "![Reliability before and after temperature scaling](reliability.png)",
    ]  # fmt: skip
