"""A model card (Markdown) of a finished run, written from the run's own files (``workbench card RUN``).

Sections: the run (task, method, seal, hashes), data provenance (the data the run read, its fingerprint, its data
cards), the method, metrics on the held-out test split with the intervals ``metrics.json`` holds, calibration,
conformal coverage and the shift test (``clinical.json``; "not fitted" where a run has none), known limits (stated
from what the files show), and an "Intended use" section left for the person deploying the model to fill. Every
number is copied from a file the card names; nothing is measured again.

With ``--calibration LAYER`` (a layer of ``workbench calibrate``, verified with its run: `workbench.clinical.
site_calibration.check_layer`) the calibration, conformal and shift sections are the layer's, say that it was
fitted on the site's records, and a "Site calibration" section gives the data it was fitted on and its held-out
report.

The card is written outside every run folder (a run is sealed), atomically, and never over an earlier card unless
asked.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from workbench.core.errors import UserError

#: What the "Intended use" section asks the deploying person to write.
INTENDED_USE = """_To be written by the person responsible for the deployment, before any use:_

- _the clinical question the output answers, and the decision it informs (or must not inform);_
- _the population, setting and devices it is meant for, and those it is not;_
- _who sees the output, how they act on it, and who reviews it;_
- _how the shift alarm, the conformal sets and the audit log are monitored, and by whom._
"""


def default_output(run: Path) -> Path:
    """Where the card goes without ``--output``: ``card-<run folder name>.md`` in the current folder."""
    return Path(f"card-{Path(run).resolve().name}.md")


def write_card(run: str | Path, output: str | Path | None = None, *, overwrite: bool = False,
               calibration: str | Path | None = None) -> Path:  # fmt: skip
    """Write the model card of the finished run ``run`` (with the clinical layer ``calibration`` when given) to
    ``output`` (default `default_output`); returns its path.

    Raises:
        UserError: ``run`` is not a finished run, ``output`` lies inside a run folder, is not a ``.md`` file, or
            exists (without ``overwrite``); ``calibration`` does not verify or is another run's.
    """
    from workbench.core.checkpoint import write_text
    from workbench.core.seal import run_folder_above

    path = Path(output) if output is not None else default_output(Path(run))
    if path.suffix.lower() != ".md":
        raise UserError(f"--output {path}: a model card is a Markdown file: give a name ending in .md")
    inside = run_folder_above(path.parent)
    if inside is not None:
        raise UserError(f"--output {path}: inside the run folder {inside}; a card is never written into a run "
                        "folder: choose an --output outside it")  # fmt: skip
    if path.exists() and not overwrite:
        raise UserError(f"--output {path}: already exists; pass --overwrite to replace it, or choose another --output")
    text = card_text(run, calibration)
    write_text(path, text)
    return path


def card_text(run: str | Path, calibration: str | Path | None = None) -> str:
    """The model card of the finished run ``run`` (Markdown); its clinical sections from the layer ``calibration``
    when given, else from the run's own ``clinical.json``."""
    from workbench.core.finished import Run
    from workbench.core.seal import check_run

    run = Path(run)
    config = Run.read_config(run)
    metrics = _json(run / "metrics.json")
    adapter = _json(run / "adapter.json")
    sealed = _seal_state(run, check_run)
    layer = record = None
    if calibration is not None:
        from workbench.clinical.site_calibration import check_layer

        layer = Path(calibration)
        checked = check_layer(layer, run)
        clinical, record = checked.summary, checked.record
    else:
        clinical = _json(run / "clinical.json") if (run / "clinical.json").is_file() else None
    sections = [
        _header(run, config, sealed),
        _run_section(run, config, metrics, adapter, sealed),
        _data_section(run, config, metrics),
        _method_section(config, metrics, adapter),
        _metrics_section(config, metrics),
        *([_site_section(layer, record, clinical)] if layer is not None else []),
        _calibration_section(layer or run, clinical, adapter),
        _conformal_section(clinical, adapter),
        _shift_section(clinical),
        _limits_section(config, metrics, clinical, sealed),
        "## Intended use\n\n" + _intended_use(run),
    ]
    return "\n".join(sections)


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UserError(f"{path}: not readable JSON ({error}); is this a finished run?") from None


def _seal_state(run: Path, check_run: Any) -> dict[str, Any]:
    """What the run's seal says (`workbench.core.seal.check_run`, files that differ listed instead of refused)."""
    import logging

    logger = logging.getLogger("workbench")
    level = logger.level
    logger.setLevel(logging.ERROR)  # check_run warns about a modified run; the card says it
    try:
        return check_run(run, trust_modified=True)
    finally:
        logger.setLevel(level)


def _number(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _header(run: Path, config: Any, sealed: Mapping[str, Any]) -> str:
    import workbench

    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"# Model card: task `{config.task}` adapted with `{config.method}`\n\n"
            f"_Written by workbench {workbench.__version__} on {now} from the run folder `{run.resolve()}` "
            f"({sealed['status']}). Every number is copied from the run file named beside it; nothing was measured "
            "again._\n")  # fmt: skip


def _run_section(run: Path, config: Any, metrics: Mapping, adapter: Mapping, sealed: Mapping) -> str:
    from workbench.core.seal import SEAL, sha256_file

    seal = _json(run / SEAL) if (run / SEAL).is_file() else {}
    rows = [
        ("task", f"`{config.task}`"),
        ("method", f"`{adapter.get('method', config.method)}`"),
        ("base model", f"`{config.model}`" if config.model else "the task's default"),
        ("seed", config.seed),
        ("precision", config.precision),
        ("adapter.safetensors sha256", f"`{sha256_file(run / 'adapter.safetensors')}`"),
        ("sealed", f"{seal.get('sealed', '—')} by workbench {seal.get('workbench_version', '—')}"),
        ("seal check now", sealed["status"] + "".join(f"; {p}" for p in sealed.get("problems", []))),
    ]
    return "## The run\n\n| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def _data_section(run: Path, config: Any, metrics: Mapping) -> str:
    from workbench.core.datacard import load_card
    from workbench.core.registry import tasks

    lines = ["## Data provenance\n"]
    summary = metrics.get("data_summary") or {}
    lines.append(f"- Data read: {metrics.get('data') or config.data or 'the task default'} [metrics.json `data`]")
    if summary.get("data"):
        lines.append(f"- Described by the task as: {summary['data']} [metrics.json `data_summary`]")
    samples = metrics.get("samples") or {}
    if samples:
        lines.append("- Items per split: " + ", ".join(f"{k} {v}" for k, v in samples.items()) + " [metrics.json]")
    for key in ("train_class_counts", "test_class_counts"):
        if summary.get(key):
            counts = ", ".join(f"{k} {v}" for k, v in summary[key].items())
            lines.append(f"- {key.replace('_', ' ').capitalize()}: {counts}")
    skipped = metrics.get("skipped_records") or {}
    if skipped:
        lines.append(f"- Records skipped as bad: {skipped.get('skipped', 0)} of {skipped.get('seen', '?')} seen")
    if (run / "fingerprint.json").is_file():
        fingerprint = _json(run / "fingerprint.json")
        files = fingerprint.get("data_files") or {}
        lines.append(f"- Data fingerprint: `{fingerprint.get('data_fingerprint', '—')}` over {len(files)} file(s) "
                     f"of `{fingerprint.get('data_source', '—')}` [fingerprint.json]")  # fmt: skip
    try:
        task = tasks.get(config.task)
        names = [task.card] if config.data is None else list(task.reads or (task.card,))
    except Exception:  # a task whose plug-in is not installed here: the card still says what the files hold
        names = []
    for name in filter(None, names):
        card = load_card(name)
        source = " ".join(str(card.content.get("source", "")).split())
        source = source if len(source) <= 300 else source[:299] + "…"
        lines.append(f"- Data card `{card.name}`: {card.title}; licence: {card.content.get('license', '—')}"
                     + (f"; source: {source}" if source else ""))  # fmt: skip
    return "\n".join(lines) + "\n"


def _method_section(config: Any, metrics: Mapping, adapter: Mapping) -> str:
    from workbench.core.registry import methods

    method = adapter.get("method", config.method)
    try:
        description = methods.get(method).description
    except Exception:
        description = "(its plug-in is not installed here)"
    options = adapter.get("options") or {}
    cost = (metrics.get("costs") or {}).get(method, {})
    lines = [
        "## Method\n",
        f"- `{method}`: {description}",
        "- Options: " + (", ".join(f"{k}={v}" for k, v in options.items()) if options else "its defaults"),
        f"- Trainable parameters: {metrics.get('trainable_parameters', '—')} of {metrics.get('total_parameters', '—')}",
        f"- Epochs: {cost.get('epochs', config.epochs)} (best {_from_one(cost.get('best_epoch'))}, counted from 1 as "
        "on the console), training time "
        f"{_number(metrics.get('train_seconds'), 1)} s",
        "- Baselines run beside it: " + (", ".join(f"`{b}`" for b in metrics.get("baselines") or {}) or "none"),
    ]
    return "\n".join(lines) + "\n"


def _from_one(epoch: Any) -> str:
    """A 0-based epoch of ``metrics.json`` counted from 1 (the console's count); "—" when unknown."""
    return str(epoch + 1) if isinstance(epoch, int) else "—"


def _standing(config: Any, metrics: Mapping) -> str:
    """The run's method against the best baseline, in the console's words (`workbench.core.verdicts.verdict`);
    "" without baselines or when the task's plug-in is not installed here."""
    from workbench.core.registry import tasks
    from workbench.core.verdicts import verdict

    try:
        task = tasks.get(config.task)
    except Exception:  # a task whose plug-in is not installed here: no metric order to read
        return ""
    return verdict(metrics, list(task.metrics), task.lower_is_better)


def _metrics_section(config: Any, metrics: Mapping) -> str:
    after, before = metrics.get("after") or {}, metrics.get("before") or {}
    intervals = metrics.get("intervals") or {}
    difference = (metrics.get("differences") or {}).get("after − before", {})
    units = metrics.get("test_units") or {}
    lines = ["## Metrics on the held-out test split\n"]
    if units:
        lines.append(f"{units.get('items')} {units.get('item_kind', 'item')}(s) in {units.get('groups')} "
                     f"{units.get('group_kind', 'group')}(s); 95 % intervals from {units.get('resamples')} "
                     f"bootstrap resamples of the {units.get('resampled')} [metrics.json `intervals`, "
                     "`differences`].\n")  # fmt: skip
    else:
        lines.append("This run's files hold no intervals (written before they were computed).\n")

    def cell(values: Mapping, bounds: Mapping, name: str) -> str:
        if name not in values:
            return "—"
        low_high = bounds.get(name)
        return _number(values[name]) + (f" [{_number(low_high[0])}, {_number(low_high[1])}]" if low_high else "")

    lines += ["| metric | before adaptation | after | after − before |", "|---|---|---|---|"]
    for name in after:
        change = difference.get(name)
        delta = (f"{_number(change['estimate'])} [{_number(change['low'])}, {_number(change['high'])}]"
                 if change else "—")  # fmt: skip
        lines.append(f"| {name} | {cell(before, intervals.get('before', {}), name)} | "
                     f"{cell(after, intervals.get('after', {}), name)} | {delta} |")  # fmt: skip
    standing = _standing(config, metrics)
    if standing:
        lines.append(f"\nAgainst the baselines run beside it: {standing} [metrics.json `differences`]")
    elif metrics.get("baselines"):
        lines.append("\nAgainst the baselines run beside it: no paired interval in this run's files.")
    return "\n".join(lines) + "\n"


def _not_fitted(what: str) -> str:
    return (f"Not fitted: this run has no clinical.json ({what} is fitted at the end of `workbench adapt` for tasks "
            "whose evaluation gives probabilities; older runs have none).\n")  # fmt: skip


def _calibration_section(run: Path, clinical: Mapping | None, adapter: Mapping) -> str:
    title = "## Calibration\n\n"
    if clinical is None or not clinical.get("calibration"):
        return title + _not_fitted("calibration")
    c = clinical["calibration"]
    classes = (adapter.get("task_state") or {}).get("classes") or []
    temperatures = c.get("temperatures") or []
    named = (", ".join(f"{k} {_number(t, 2)}" for k, t in zip(classes, temperatures))
             if len(classes) == len(temperatures) else ", ".join(_number(t, 2) for t in temperatures))  # fmt: skip
    site = "site_report" in clinical
    held_out = "held-out site items (the conformal part)" if site else "held-out validation items"
    lines = [
        (f"- Fitted on the site's own records by `workbench calibrate` (layer `{Path(run).resolve()}`), not on the "
         "run's validation split" if site else "- Fitted on the run's validation split at the end of "
         "`workbench adapt`"),
        f"- {c.get('method')} [clinical.json `calibration`]",
        f"- Temperatures: {named}" + _unfitted(c, classes, len(temperatures)),
        f"- Expected calibration error ({c.get('ece_bins')}), on {c.get('ece_items')} {held_out}: "
        f"{_number(c.get('ece_before'))} before, {_number(c.get('ece_after'))} after "
        + (f"(temperatures fitted on {c.get('fit_items')} others)" if len(c.get("unfitted_classes") or []) <
           len(temperatures) else "(nothing fitted: the same probabilities)"),  # fmt: skip
    ]
    if clinical.get("split"):
        lines.append(f"- {'Site records' if site else 'Validation split'} use: {clinical['split']}")
    if (run / "reliability.png").is_file():
        lines.append(f"- Reliability diagram: `{(run / 'reliability.png').resolve()}`")
    return title + "\n".join(lines) + "\n"


def _unfitted(c: Mapping, classes: list, count: int) -> str:
    """Which temperatures were not fitted, and why (too few items; a class absent from the fitting items)."""
    unfitted = c.get("unfitted_classes") or []
    if not unfitted:
        return ""
    minimum, items = c.get("min_fit_items"), c.get("fit_items")
    if len(unfitted) == count and isinstance(minimum, int) and isinstance(items, int) and items < minimum:
        return (f" — no temperature was fitted: {items} fitting item(s), below the {minimum} that fitting needs, so "
                "the probabilities are the model's own")  # fmt: skip
    names = [classes[k] if isinstance(k, int) and k < len(classes) else str(k) for k in unfitted]
    return f" (kept at 1: {', '.join(map(str, names))}, each with one label value only among the fitting items)"


def _conformal_section(clinical: Mapping | None, adapter: Mapping) -> str:
    title = "## Conformal prediction sets\n\n"
    if clinical is None or not clinical.get("conformal"):
        return title + _not_fitted("conformal calibration")
    k = clinical["conformal"]
    alpha = k.get("alpha")
    nominal = f"{100 * (1 - alpha):.0f} %" if isinstance(alpha, (int, float)) else "—"
    report = clinical.get("site_report")
    where = "the held-out site records" if report else "the test split"
    lines = [
        f"- Nominal coverage {nominal} (α = {alpha}); {k.get('kind')} [clinical.json `conformal`]",
        f"- Calibration items: {k.get('calibration_items')}" + (" (the site's)" if report else ""),
        f"- Empirical coverage on {where}: {_number(k.get('test_coverage'))} over {k.get('test_items')} "
        f"items; mean set size {_number(k.get('test_mean_set_size'), 2)}",
    ]
    classes = (adapter.get("task_state") or {}).get("classes") or []
    if report:
        low, high = report["coverage_interval"]
        lines.append(f"- On the held-out site records: coverage {_number(report['coverage'])} "
                     f"[{_number(low)}, {_number(high)}] ({report['covered']} of {report['trials']} true labels, one "
                     f"per {report['trial']}; {report['interval']}), empty sets {_number(report['empty_rate'])}, "
                     f"sets holding every class {_number(report['all_classes_rate'])} [clinical.json "
                     "`site_report`]")  # fmt: skip
    frequency = _set_frequency(k, report, classes)
    if frequency:
        lines.append(f"- How often each class is in a set on {where}: {frequency}")
    quantiles = k.get("quantiles")
    if isinstance(quantiles, list) and quantiles and all(q is None for q in quantiles):
        lines.append(f"- Every set holds every class{f' ({len(classes)})' if classes else ''}: "
                     f"{k.get('calibration_items')} calibration item(s) are too few for a finite threshold at α = "
                     f"{alpha} (split conformal needs at least (1 − α)/α of them), so the coverage above says "
                     "nothing about the model")  # fmt: skip
    elif classes and k.get("test_mean_set_size") == len(classes):
        lines.append(f"- Every set holds all {len(classes)} classes on the test split: the sets do not narrow the "
                     "answer at this level")  # fmt: skip
    return title + "\n".join(lines) + "\n"


def _set_frequency(k: Mapping, report: Mapping | None, classes: list) -> str:
    """How often each class is in a conformal set ("NORM 0.42, MI 0.61, ..."), from the site report or the test
    split's ``test_set_frequency``; "" where the file has neither."""
    if report and isinstance(report.get("set_frequency"), Mapping):
        return ", ".join(f"{name} {_number(share)}" for name, share in report["set_frequency"].items())
    shares = k.get("test_set_frequency")
    if not isinstance(shares, list) or not shares:
        return ""
    names = classes if len(classes) == len(shares) else [str(i) for i in range(len(shares))]
    return ", ".join(f"{name} {_number(share)}" for name, share in zip(names, shares))


def _site_section(layer: Path, record: Mapping, clinical: Mapping) -> str:
    """The layer: where it is, the site's data it was fitted on, its parts, and its held-out report per class."""
    data, parts = record.get("data") or {}, record.get("parts") or {}
    report = clinical.get("site_report") or {}
    lines = [
        "## Site calibration\n",
        f"- Clinical layer `{layer.resolve()}`, fitted on the site's own labelled records by `workbench calibrate`; "
        "its seal verified and it was found to belong to this run (the sha256 of adapter.safetensors and "
        "adapter.json match) [layer.json]",
        f"- Site data: `{data.get('folder')}`, {data.get('files')} file(s), fingerprint `{data.get('fingerprint')}`",
        f"- {record.get('group_kind', 'group')}s dealt at random (seed {record.get('seed')}) into disjoint parts: "
        + ", ".join(f"{name} {part.get('items')} items of {len(part.get('groups') or [])} group(s)"
                    for name, part in parts.items()),  # fmt: skip
    ]
    per_class = report.get("per_class_coverage") or {}
    if per_class:
        lines += ["", "Held-out site records, per class [clinical.json `site_report`]:", "",
                  "| class | in a set | coverage [95 % exact interval] |", "|---|---|---|"]  # fmt: skip
        for name, c in per_class.items():
            lines.append(f"| {name} | {_number((report.get('set_frequency') or {}).get(name))} | "
                         f"{_number(c['coverage'])} [{_number(c['interval'][0])}, {_number(c['interval'][1])}] |")
    return "\n".join(lines) + "\n"


def _shift_section(clinical: Mapping | None) -> str:
    title = "## Shift test\n\n"
    if clinical is None or not clinical.get("shift"):
        return title + _not_fitted("the shift alarm's reference")
    s = clinical["shift"]
    check = s.get("test_split") or {}
    where = ("the held-out site records (the reference's site" if "site_report" in clinical else
             "the test split (same data as training")  # fmt: skip
    lines = [
        f"- {s.get('test')} [clinical.json `shift`]",
        f"- Reference sample: {s.get('reference_items')} {s.get('reference_kind', 'training items')}",
        f"- On {where}, so no shift expected): verdict {check.get('verdict', '—')}, "
        f"statistic {_number(check.get('statistic'), 4)}, p = {_number(check.get('p_value'), 3)} "
        f"({check.get('batch', '—')} items)",
    ]
    return title + "\n".join(lines) + "\n"


def _limits_section(config: Any, metrics: Mapping, clinical: Mapping | None, sealed: Mapping) -> str:
    units = metrics.get("test_units") or {}
    source = metrics.get("data") or config.data or "the task's default data"
    lines = [
        "## Known limits\n",
        f"- The metrics come from {units.get('items', '?')} held-out items of the data the model was adapted on "
        f"({source}). They say nothing about another site, device or population until measured there.",
        "- Intervals cover resampling of the test items only: not the choice of seed, of split, or of the data.",
    ]
    if config.data is None:
        lines.append("- The run used the task's shipped default data (see its data card above), not data from the "
                     "setting where the model would be used.")  # fmt: skip
    if clinical is not None:
        lines += [
            "- Conformal coverage holds on average over items exchangeable with the calibration items (per class "
            "where each class is its own set); weighted sets assume the inputs shifted but not how labels follow "
            "from them. It is not a guarantee for any one patient.",
            "- A shift verdict of \"no shift\" is a failure to detect one at the batch size tested, not proof that "
            "the inputs match the training data.",
        ]
    else:
        lines.append("- No calibration, conformal sets or shift alarm: the probabilities are the model's raw outputs.")
    if sealed.get("problems"):
        lines.append("- The run's files differ from its seal: " + "; ".join(sealed["problems"]))
    skipped = (metrics.get("skipped_records") or {}).get("skipped")
    if skipped:
        lines.append(f"- {skipped} record(s) were skipped as bad while reading the data.")
    return "\n".join(lines) + "\n"


def _intended_use(run: Path) -> str:
    """The run's ``intended_use.md`` when it has one, else the `INTENDED_USE` prompt."""
    written = run / "intended_use.md"
    return written.read_text() if written.is_file() else INTENDED_USE
