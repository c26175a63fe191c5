"""Benchmarks as definitions on `workbench compare`, and the documentation's claim tables rendered from their results.

A method-comparison benchmark (``benchmarks/<name>.py``) is a `Benchmark`: what to compare, on what data, which
claims it tests and their margins. ``python benchmarks/<name>.py`` runs it (`run`: the comparison in
``benchmarks/runs/<name>/``, resumable) and writes ``benchmarks/results/<name>.json`` with every cell, the summary and
each claim's verdict (holds / does not hold / no verdict, Holm over the benchmark's claims:
`workbench.comparison.report.verdicts`). The page that discusses a benchmark (``docs/**/*.md``, or README.md) holds
its table and verdicts between ``<!-- rendered: <name> -->`` and ``<!-- end rendered -->``, each name on exactly one
page; ``python benchmarks/claims.py`` rewrites those blocks from the results files and ``--check`` fails when a page
and the results disagree or a block is on two pages (``tests/test_rendered_claims.py``).

Seeds: new reported numbers use seeds from `workbench.comparison.design.FIRST_REPORTED_SEED` (200) on; the results kept
here were measured on seeds 100-199, spent since. ``--dev`` runs seeds 0-1 into ``benchmarks/runs/dev/`` and writes
no results file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from workbench.comparison.design import CompareSpec
from workbench.comparison.execute import compare
from workbench.comparison.report import (
    Claim,
    dataset_line,
    decided,
    reference_line,
    seeds_line,
    statistics_text,
    table,
)
from workbench.core.checkpoint import write_json, write_text

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ROOT = HERE.parent
BLOCK = re.compile(r"(<!-- rendered: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end rendered -->)", re.S)


@dataclass(frozen=True)
class Benchmark:
    """A comparison and the claims it tests."""

    #: ``results/<name>.json`` and the rendered block's name.
    name: str
    spec: CompareSpec
    claims: tuple[Claim, ...]
    #: Metrics the rendered table shows (default: the task's first two).
    metrics: tuple[str, ...] = ()
    #: What the benchmark leaves out or cuts on this machine (rendered under the table).
    note: str = ""
    #: Display names of the compared entries in the table (default: the labels).
    names: dict[str, str] = field(default_factory=dict)
    #: The benchmark file that defines it, as the rendered block names it (default: ``<name>.py``).
    script: str = ""


def run(benchmark: Benchmark, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run ``benchmark`` (``--workers N``, ``--dev``) and write its results; returns the results file's content."""
    parser = argparse.ArgumentParser(description=f"benchmark {benchmark.name}: {benchmark.spec.domain}")
    parser.add_argument("--workers", type=int, default=1, help="cells at a time")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per cell")
    parser.add_argument("--dev", action="store_true", help="development seeds 0-1 (no results file)")
    parser.add_argument("--epochs", type=int, help="with --dev: fewer epochs, to see that it runs")
    args = parser.parse_args(argv)
    if args.epochs is not None and not args.dev:
        parser.error("--epochs changes the benchmark: only with --dev")
    spec = benchmark.spec
    if args.dev:
        spec = dataclasses.replace(spec, seeds=(0, 1), epochs=args.epochs or spec.epochs)
    out = HERE / "runs" / ("dev" if args.dev else "") / (benchmark.name + (f"-e{args.epochs}" if args.epochs else ""))
    comparison = compare(spec, out, workers=args.workers, threads=args.threads)
    result = results(benchmark, comparison)
    if not args.dev:
        write_json(RESULTS / f"{benchmark.name}.json", result)
    print(rendered(result))
    return result


def results(benchmark: Benchmark, comparison: dict[str, Any]) -> dict[str, Any]:
    """What ``results/<name>.json`` holds: the comparison (cells with their split sizes, not their group lists)
    and each claim's verdict, the table's differences that a claim tests decided by it (`refreshed`)."""
    cells = [
        {**{k: v for k, v in cell.items() if k != "split"}, "split": {n: len(g) for n, g in cell["split"].items()}}
        for cell in comparison["cells"]
    ]
    return refreshed({
        "benchmark": benchmark.name,
        "script": benchmark.script or f"{benchmark.name}.py",
        "note": benchmark.note,
        "table_metrics": list(benchmark.metrics or comparison["metrics"][:2]),
        "names": dict(benchmark.names),
        "claims": [dataclasses.asdict(claim) for claim in benchmark.claims],
        "comparison": {**comparison, "cells": cells},
    })


def refreshed(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with its summary and claims computed again from its cells by the current statistics (what
    ``--refresh`` writes: the results never hold a number the cells do not give)."""
    comparison = result["comparison"]
    stored = comparison["spec"]
    spec = CompareSpec.from_dict(stored)
    facts = {key: comparison[key] for key in ("group_kind", "groups_per_seed", "metrics", "lower_is_better",
                                              "metrics_note", "unit", "fixed_data") if key in comparison}  # fmt: skip
    names = {f.name for f in dataclasses.fields(Claim)}
    claims = [Claim(**{key: value for key, value in claim.items() if key in names}) for claim in result["claims"]]
    summary, verdicts = decided(spec, facts, comparison["cells"], claims)
    claimed = [{**dataclasses.asdict(claim), **verdict} for claim, verdict in zip(claims, verdicts)]
    return {**result, "claims": claimed, "comparison": summary}


def rendered(result: dict[str, Any]) -> str:
    """The rendered block of one results file: how it was measured, the table, the claims' verdicts (or, for the
    coverage simulation, `coverage_summary`)."""
    if result.get("script") == "interval_coverage.py":
        return coverage_summary(result)
    if result.get("script") == "conformal_shift.py":
        return conformal_shift_summary(result)
    comparison = result["comparison"]
    if result.get("withdrawn"):  # a withdrawn table's differences stay as numbers; none of them is a verdict
        comparison = without_verdicts(comparison)
    spec = comparison["spec"]
    seeds = spec["seeds"]
    if len(seeds) == 1:
        seed_text = f"seed {seeds[0]}"
    elif seeds == list(range(seeds[0], seeds[-1] + 1)):
        seed_text = f"seeds {seeds[0]}–{seeds[-1]}"
    else:
        seed_text = "seeds " + ", ".join(str(seed) for seed in seeds)
    lines = [
        f"`python benchmarks/{result.get('script') or result['benchmark'] + '.py'}`: "
        f"`workbench compare --domain {spec['domain']}`, "
        f"{spec['folds']} grouped folds (groups: {comparison['group_kind']}) × {seed_text}, budget {spec['budget']} "
        f"({comparison['budget_note']}). Δ: paired difference to {spec['reference']} — " + statistics_text(comparison),
        "",
        _named(table(comparison, result["table_metrics"]), result["names"]),
        "",
    ]
    lines += [reference_line(comparison, result["table_metrics"][0]), ""]
    lines += [line for text in (seeds_line(comparison), dataset_line(comparison)) if text for line in (text, "")]
    if result.get("withdrawn"):  # kept as a record of what ran; its claims are not verdicts
        lines += [f"**Withdrawn:** {result['withdrawn']} Its claims are not listed.", ""]
        result = {**result, "claims": []}
    tested = sum(not math.isnan(claim["p_holm"]) for claim in result["claims"])
    if result["claims"]:
        conditional = "; conditional on this dataset" if comparison.get("fixed_data") else ""
        lines += [f"Claims ({tested} of {len(result['claims'])} tested; Holm over those, for and against alike: a "
                  "one-sided claim holds when its adjusted p < 0.025 and does not hold when its adjusted p against "
                  f"it is < 0.025, an equivalence by TOST at 0.025 per side{conditional}):", ""]  # fmt: skip
    for claim in result["claims"]:
        verdict, detail = claim["line"].split(":", 1)
        lines.append(f"- {claim['text']} — **{verdict}**:{detail}")
    if result["note"]:
        lines += ["", result["note"]]
    return "\n".join(lines) + "\n"


def without_verdicts(comparison: dict[str, Any]) -> dict[str, Any]:
    """``comparison`` with every entry's verdict against the reference replaced by "withdrawn: no verdict"."""
    summary = {}
    for name, entry in comparison["summary"].items():
        metrics = {
            metric: {**values, "vs_reference": {**values["vs_reference"], "verdict": "withdrawn: no verdict"}}
            if values.get("vs_reference") else values
            for metric, values in entry["metrics"].items()
        }
        summary[name] = {**entry, "metrics": metrics}
    return {**comparison, "summary": summary}


def coverage_summary(result: dict[str, Any]) -> str:
    """The rendered block of ``results/interval_coverage.json``: per procedure and shape (seeds × folds), the lowest
    coverage of the nominal 95 % interval and the highest rate of false "better" verdicts over the fold correlations
    and noises simulated."""
    rows = result["rows"]
    procedures = list(dict.fromkeys(row["procedure"] for row in rows))
    shapes = list(dict.fromkeys((row["units"], row["folds"]) for row in rows))
    correlations = ", ".join(f"{c:g}" for c in sorted({row["correlation"] for row in rows}))
    head = ["procedure", *(f"{units} × {folds}" for units, folds in shapes)]
    lines = [
        f"`python benchmarks/interval_coverage.py`: {result['reps']} simulated comparisons per shape (seeds × folds), "
        f"fold correlation {correlations}, normal and heavy-tailed noise (seed {result['seed']}). Each cell: the "
        'lowest coverage of the nominal 95 % interval / the highest share of false "better" verdicts (true '
        "difference 0; nominal 2.5 %) over those settings; – where a procedure gives no interval.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for procedure in procedures:
        cells = [procedure]
        for shape in shapes:
            mine = [row for row in rows if row["procedure"] == procedure and (row["units"], row["folds"]) == shape]
            coverage = [row["coverage"] for row in mine if row["coverage"] is not None]
            low = f"{min(coverage):.3f}" if coverage else "–"
            cells.append(f"{low} / {max(row['false_holds'] for row in mine):.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def conformal_shift_summary(result: dict[str, Any]) -> str:
    """The rendered block of ``results/conformal_shift.json``: target coverage, set size and empty sets of each kind
    of conformal set, the same for weights fitted on service-size batches, the beat-level and patient-level shift
    alarms' rates, the claims' verdicts (`benchmarks/conformal_shift.py`)."""
    summary, seeds = result["summary"], result["seeds"]

    def cell(value: dict[str, float], digits: int = 3) -> str:
        return f"{value['mean']:.{digits}f} [{value['low']:.{digits}f}, {value['high']:.{digits}f}]"

    lines = [
        f"`python benchmarks/conformal_shift.py`: physio generator, source {result['source_noisy']:.0%} / target "
        f"{result['target_noisy']:.0%} noisy subjects ({result['noise_mv']['clean']} / {result['noise_mv']['noisy']} "
        f"mV RMS), {result['subjects']['calibration']} calibration and {result['subjects']['target']} target subjects "
        f"per unit; {len(seeds)} units (seeds {seeds[0]}–{seeds[-1]}); nominal coverage {1 - result['alpha']:.0%}. "
        f"Mean over units [95 % t interval over units]; {result['seconds']:.0f} s in all.",
        "",
        "| conformal sets (weights from all target beats) | target coverage | mean set size | empty sets |",
        "|---|---|---|---|",
    ]
    for name, c in summary["coverage"].items():
        lines.append(f"| {name} | {cell(c)} | {cell(summary['set_size'][name], 2)} | "
                     f"{cell(summary['empty_set_rate'][name])} |")  # fmt: skip
    lines += ["", f"Weights at service size: weighted ({result['density_ratio']}) sets whose weights are fitted "
                  f"between the calibration beats and one batch of random target beats alone (no window: a service "
                  f"request of b items with w items in its caller's window is a batch of b + w here); "
                  f"{result['service_batches']} batches per size and unit; seconds per batch (weights, quantiles, "
                  "sets; mean over units, a shared 2-core machine): " + ", ".join(
                      f"{_mean_seconds(result, f'weights_per_batch_{size}'):.2f} ({size})"
                      for size in summary["service_size"]) + ".", "",
              "| batch (target beats) | target coverage | mean set size | empty sets |",
              "|---|---|---|---|"]  # fmt: skip
    for size, facts in summary["service_size"].items():
        lines.append(f"| {size} | {cell(facts['coverage'])} | {cell(facts['mean_set_size'], 2)} | "
                     f"{cell(facts['empty_set_rate'])} |")  # fmt: skip
    name = "weighted (logistic DRE)"
    beats = [u["beats"]["target"] for u in result["units"]]
    lines.append(f"| all (~{round(sum(beats) / len(beats), -2):,.0f}) | "
                 f"{cell(summary['coverage'][name])} | {cell(summary['set_size'][name], 2)} | "
                 f"{cell(summary['empty_set_rate'][name])} |")  # fmt: skip
    pool = result["subjects"]["pool"]
    smaller = dict.fromkeys(key.split(" | ")[0] for key in summary["alarm_rate"] if ", pool of " in key)
    lines += ["", f"Shift alarm (MMD², α = {result['alarm_alpha']}, {result['permutations']} draws): beat-level "
                  "(`mmd_test`: null by relabelling reference and batch beats; reference: 500 training beats) and "
                  f"patient-level (`patient_test`: null from pseudo-batches drawn from the batch's subjects and {pool} "
                  "held-out source subjects, none in training or calibration"
                  + "".join(f"; \"{test}\": calibrated on {test.split()[-1]} of them only" for test in smaller)
                  + "). Random-beat rows: "
                  f"{result['batches']} batches per unit (beat-level), "
                  f"{result['patient_batches']} (patient-level); subject rows: {result['patient_batches']}. Alarm "
                  "rate: mean over units [the union of the 95 % t interval over units and the exact interval of "
                  "all batches] (alarms of batches). Seconds per test (mean over units): beat-level "
                  f"{_mean_seconds(result, 'beat-level_per_test'):.2f}, patient-level "
                  f"{_mean_seconds(result, 'patient-level_per_test'):.2f}.", "",
              "| alarm | batches | data | alarm rate |", "|---|---|---|---|"]  # fmt: skip
    rows = [key.split(" | ") for key in summary["alarm_rate"]]  # test, data, batch; grouped by data, then batch
    first = {value: index for index, value in reversed(list(enumerate(v for row in rows for v in row)))}
    for test, data, batch in sorted(rows, key=lambda row: (first[row[1]], first[row[2]], first[row[0]])):
        a = summary["alarm_rate"][f"{test} | {data} | {batch}"]
        lines.append(f"| {test} | {batch} | {data} | {cell(a)} ({a['alarms']} of {a['batches']}) |")
    lines += ["", f"Claim: weighted (logistic DRE) coverage within {result['band'] * 100:.0f} points of nominal "
                  f"where split coverage misses by more — **{summary['verdict']}**.", "",
              f"Claim: patient-level false alarms ≤ {result['alarm_alpha']:.0%} on new subjects of the source site "
              f"({summary['patient_claim'].split(' | ')[2]}, null from {pool} held-out subjects; holds when the "
              f"interval's upper end is ≤ {result['alarm_alpha']}, does not hold when its lower end is above) — "
              f"**{summary['patient_verdict']}**."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _mean_seconds(result: dict[str, Any], key: str) -> float:
    """Mean over a results file's units of one of their ``seconds`` entries."""
    return sum(u["seconds"][key] for u in result["units"]) / len(result["units"])


def _named(text: str, names: dict[str, str]) -> str:
    """The table with each entry's label replaced by its display name."""
    for label, name in names.items():
        text = text.replace(f"| {label} |", f"| {name} |")
    return text


def pages() -> list[Path]:
    """The files that may hold rendered blocks: README.md and every page of ``docs/``."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def render(text: str, results_dir: Path = RESULTS, page: str = "the page") -> str:
    """``text`` (a page) with every rendered block rewritten from its results file."""

    def block(match: re.Match) -> str:
        path = results_dir / f"{match['name']}.json"
        if not path.is_file():
            raise SystemExit(f"{page} renders {match['name']}, but {path} does not exist (run the benchmark)")
        return match.group(1) + rendered(json.loads(path.read_text())) + match.group(4)

    return BLOCK.sub(block, text)


def placed() -> dict[str, list[Path]]:
    """Each rendered block's name and the pages that hold it (one page, unless a block was copied)."""
    where: dict[str, list[Path]] = {}
    for page in pages():
        for match in BLOCK.finditer(page.read_text()):
            where.setdefault(match["name"], []).append(page)
    return where


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="render the claim tables in docs/ from benchmarks/results/")
    parser.add_argument("--check", action="store_true", help="exit 1 when a page differs from the results")
    parser.add_argument("--refresh", action="store_true",
                        help="first recompute every results file's summary and claims from its cells")  # fmt: skip
    args = parser.parse_args(argv)
    if args.refresh:
        for path in sorted(RESULTS.glob("*.json")):
            result = json.loads(path.read_text())
            if "comparison" in result:
                write_json(path, refreshed(result))
    twice = {name: where for name, where in placed().items() if len(where) > 1}
    if twice:
        for name, where in twice.items():
            listed = ", ".join(str(page.relative_to(ROOT)) for page in where)
            print(f"block {name} is rendered on {len(where)} pages ({listed}): keep it on one page")
        return 1
    differing, count = [], 0
    for page in pages():
        text = page.read_text()
        new = render(text, page=str(page.relative_to(ROOT)))
        count += len(BLOCK.findall(text))
        if new != text:
            differing.append(page.relative_to(ROOT))
            if not args.check:
                write_text(page, new)
    if args.check:
        if differing:
            print(f"rendered blocks differ from benchmarks/results/ in {', '.join(map(str, differing))}: run python "
                  "benchmarks/claims.py")  # fmt: skip
            return 1
        print(f"README.md and docs/ agree with benchmarks/results/ ({count} rendered blocks)")
        return 0
    print(f"rendered {count} block(s); rewrote {len(differing)} page(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
