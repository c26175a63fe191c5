"""The run's human-readable side: the before/after table, learning curves and ``report.md``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from matplotlib.figure import Figure

from workbench.config import RunConfig
from workbench.task import TaskData


def _rows(metrics: Mapping[str, Any]) -> list[tuple[str, Mapping[str, float], Mapping[str, Any] | None]]:
    rows = [
        ("before (pretrained)", metrics["before"], None),
        (f"{metrics['method']} (chosen)", metrics["after"], metrics["costs"][metrics["method"]]),
    ]
    rows += [(name, values, metrics["costs"][name]) for name, values in metrics["baselines"].items()]
    return rows


#: What the tables' memory column counts (`workbench.memory.training_step_bytes`, metrics.json ``training_step_bytes``).
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


def table(metrics: Mapping[str, Any], metric_names: Sequence[str]) -> str:
    """A fixed-width before/after table for the terminal."""
    header = ["model", *metric_names, "trainable params", "s/epoch", "step MiB", "epochs run"]
    lines = []
    for label, values, cost in _rows(metrics):
        lines.append(
            [
                label,
                *(_value(values, m, ".2f") for m in metric_names),
                f"{cost['trainable_parameters']:,}" if cost else "-",
                f"{cost['seconds_per_epoch']:.2f}" if cost else "-",
                _megabytes(cost) if cost else "-",
                str(cost["epochs"]) if cost else "-",
            ]
        )
    widths = [max(len(str(row[i])) for row in [header, *lines]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        return "  ".join(
            str(cell).rjust(w) if i else str(cell).ljust(w) for i, (cell, w) in enumerate(zip(row, widths))
        )

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    samples = metrics["samples"]
    title = f"{metrics['task']}: test split ({samples['test']} samples; trained on {samples['train']})"
    footer = [_skipped_line(metrics)] if metrics.get("skipped_records", {}).get("skipped") else []
    return "\n".join([title, rule, fmt(header), rule, *map(fmt, lines), rule, *footer])


def _value(values: Mapping[str, float], name: str, spec: str) -> str:
    """A metric formatted, or "-" where this data gives none (e.g. a sub-task the data do not hold)."""
    return format(values[name], spec) if name in values else "-"


def _skipped_line(metrics: Mapping[str, Any]) -> str:
    skipped = metrics["skipped_records"]
    of = f" of {skipped['seen']}" if skipped["seen"] else ""
    return f"{skipped['skipped']}{of} record(s) skipped (bad records; listed in metrics.json)"


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


def markdown(
    config: RunConfig,
    data: TaskData,
    metrics: Mapping[str, Any],
    figures: Sequence[tuple[str, str]],
    metric_names: Sequence[str],
    metrics_note: str = "Errors are on the test split; lower is better.",
) -> str:
    """The run's ``report.md``: what was run, the table, the plots, the configuration."""
    columns = [*metric_names, "trainable params", "s/epoch", "step MiB", "epochs run (best, from 1)"]
    header = "| model | " + " | ".join(columns) + " |"
    lines = [
        f"# {config.task}: {config.method} vs {', '.join(map(str, config.baselines)) or 'no baselines'}",
        "",
        f"Data: `{data.source}` — {metrics['samples']['train']} training, {metrics['samples']['val']} validation, "
        f"{metrics['samples']['test']} test samples. Seed {config.seed}, device {config.device}.",
        "",
        header,
        "|" + "---|" * (len(metric_names) + 5),
    ]
    for label, values, cost in _rows(metrics):
        extra = "- | - | - | -"
        if cost:
            extra = (
                f"{cost['trainable_parameters']:,} | {cost['seconds_per_epoch']:.2f} | {_megabytes(cost)} | "
                f"{cost['epochs']} ({cost['best_epoch'] + 1})"
            )
        lines.append(f"| {label} | " + " | ".join(_value(values, m, ".3f") for m in metric_names) + f" | {extra} |")
    lines += ["", metrics_note, "", MEMORY_NOTE, "", EPOCHS_NOTE]
    skipped = metrics.get("skipped_records", {})
    if skipped.get("skipped"):
        lines += ["", "## Skipped records", "", _skipped_line(metrics) + ":", ""]
        lines += [f"- `{item['record']}`: {item['problem']}" for item in skipped["records"]]
    for caption, file_name in figures:
        lines += ["", f"## {caption}", "", f"![{caption}]({file_name})"]
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
