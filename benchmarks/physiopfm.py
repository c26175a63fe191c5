"""PhysioPFM at new sites off the bank's grid (issue 26): does a LoRA generated from a site's class shapelets, with no
backprop at the site, beat picking from the bank?

Sites are drawn procedurally from continuous morphology and recording parameters (card ``physio-procedural``:
electrical axis, QRS width, P and T waves, ectopy rates, noise, heart rate, sampling rate), each patient with its
own morphology around its site's. The bank (card ``physiopfm-grid-bank``) holds 216 LoRAs fitted on sub-tasks of 36
sites on a grid of those parameters, each covering all four classes; the four target sites T1-T4
(``domains/physio/procedural_sites``) lie off the grid. One `workbench compare` per target site (2 folds over its
6 patients: 3 tested, 1 validating, 2 training — the labelled pair; seed 100 + i on site T(i+1)); the cells of the
four runs are pooled into one table (their (fold, seed) pairs are distinct), so every difference is paired within a
site and fold.

Compared (every bank method chooses from the same 216 entries; none is held out): no LoRA (the frozen backbone with
the ETF head, the reference); the generated LoRA (``physiopfm``: the mean of `DRAWS` DDIM draws; its size and
iterations chosen by leaving grid sites out of the bank, `physiopfm_generator_selection.py`); the mean of the
bank; the nearest-descriptor entry; the bank entry with the best forward-pass balanced accuracy on the labelled
patients (``physiopfm-nearest:select``, the backprop-free selection baseline); and the same LoRA trained by
backprop at the site (``physiopfm-local``, 10 epochs).

    python benchmarks/physiopfm.py              # 6 entries × 4 sites × 2 folds (seeds 100-103), pooled
    python benchmarks/physiopfm.py --site T1    # one site's comparison (sites side by side), then
    python benchmarks/physiopfm.py --pool       # pool the four into results/physiopfm.json
    python benchmarks/physiopfm.py --dev        # seeds 0-3 (development; no results file)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from claims import HERE, RESULTS, Benchmark, rendered, results

from workbench.comparison.design import CompareSpec
from workbench.comparison.execute import compare
from workbench.comparison.report import Claim, summarise
from workbench.core.checkpoint import write_json

ROOT = HERE.parent
TARGETS = ROOT / "domains" / "physio" / "procedural_sites"
BANK = ROOT / "models" / "checkpoints" / "physiopfm_grid_bank.safetensors"
SITES = ("T1", "T2", "T3", "T4")
SEEDS = (100, 101, 102, 103)  # seed SEEDS[i] on site SITES[i]
SELECTION = json.loads((RESULTS / "physiopfm_generator_selection.json").read_text())["chosen"]
DRAWS = SELECTION["draws"]
CACHE = HERE / "runs" / "physiopfm-generators"

BANK_OPTIONS = {"bank": str(BANK), "held_out": 0.0}
GENERATED = {**BANK_OPTIONS, "width": SELECTION["width"], "depth": SELECTION["depth"],
             "iterations": SELECTION["iterations"], "generator_cache": str(CACHE)}  # fmt: skip
METHODS = ("physiopfm-none", "physiopfm", "physiopfm-mean", "physiopfm-nearest", "physiopfm-nearest:select",
           "physiopfm-local")  # fmt: skip
METHOD_OPTIONS = {
    "physiopfm-none": BANK_OPTIONS,
    "physiopfm": {**GENERATED, "draws": DRAWS},
    "physiopfm-mean": BANK_OPTIONS,
    "physiopfm-nearest": BANK_OPTIONS,
    "physiopfm-nearest:select": {**BANK_OPTIONS, "choose_by": "labelled_accuracy"},
}


def site_spec(site: str, seed: int) -> CompareSpec:
    """The comparison on one target site."""
    return CompareSpec("physio", METHODS, folds=2, seeds=(seed,), epochs=10, data=str(TARGETS / f"site-{site}"),
                       method_options=METHOD_OPTIONS)  # fmt: skip


BENCHMARK = Benchmark(
    name="physiopfm",
    spec=CompareSpec(
        "physio", METHODS, folds=2, seeds=SEEDS, epochs=10, data=str(TARGETS), method_options=METHOD_OPTIONS
    ),  # fmt: skip
    metrics=("balanced_accuracy", "macro_f1"),
    names={
        "physiopfm-none": "no LoRA (frozen + ETF head)",
        "physiopfm": f"generated (diffusion, mean of {DRAWS} draws)",
        "physiopfm-mean": "mean of bank",
        "physiopfm-nearest": "nearest-descriptor entry",
        "physiopfm-nearest:select": "bank entry best on labelled beats (selection)",
        "physiopfm-local": "local LoRA (backprop)",
    },  # fmt: skip
    claims=(
        Claim("physiopfm", "balanced_accuracy", text="The generated LoRA beats no LoRA"),
        Claim(
            "physiopfm",
            "balanced_accuracy",
            against="physiopfm-mean",
            text="The generated LoRA beats the mean of the bank",
        ),  # fmt: skip
        Claim(
            "physiopfm",
            "balanced_accuracy",
            against="physiopfm-nearest",
            text="The generated LoRA beats the bank entry with the nearest descriptor",
        ),  # fmt: skip
        Claim(
            "physiopfm",
            "balanced_accuracy",
            against="physiopfm-nearest:select",
            text="The generated LoRA beats the bank entry chosen by forward passes on the labelled patients",
        ),
        Claim(
            "physiopfm",
            "balanced_accuracy",
            against="physiopfm-local",
            kind="not_worse",
            margin=0.05,
            text="The generated LoRA is not worse than the same LoRA trained at the site by more than 0.05",
        ),  # fmt: skip
    ),
    note="Seed 100 + i is site T(i+1): one compare run per off-grid target site, pooled (8 cells per entry, each "
    "difference paired within a site and fold). Every bank method uses all 216 entries of the 36 grid sites; the "
    "generator's size and iterations were chosen by leaving grid sites out of the bank "
    "(results/physiopfm_generator_selection.json), never on a target. The bank methods take 0 optimizer steps, and "
    "train s does not count the generator's fit on the bank (once per site run, kept in "
    "benchmarks/runs/physiopfm-generators; `generator_fit_seconds` in the fitting cell's metrics). Cut on this "
    "2-core machine: full fine-tuning, the generated draw chosen on the labelled beats (`--draw-choice select`, "
    "tested, not benchmarked), the regressor and raw-series ablations, bank-size ablations, a third fold and more "
    "seeds per site, and the Sleep-EDF staging problem (not built).",
)


def site_out(site: str, dev: bool) -> Path:
    return HERE / "runs" / ("dev" if dev else "") / f"physiopfm-{site}"


def main(argv=None) -> dict | None:
    parser = argparse.ArgumentParser(description="benchmark physiopfm: off-grid procedural ECG sites")
    parser.add_argument("--workers", type=int, default=1, help="cells at a time")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per cell")
    parser.add_argument("--dev", action="store_true", help="development seeds 0-3 (no results file)")
    parser.add_argument("--site", choices=SITES, help="run one target site's comparison only (no results file)")
    parser.add_argument("--pool", action="store_true", help="pool the sites' finished comparisons into the results")
    args = parser.parse_args(argv)
    seeds = tuple(range(len(SITES))) if args.dev else SEEDS
    if not args.pool:
        for site, seed in zip(SITES, seeds):
            if args.site in (None, site):
                compare(site_spec(site, seed), site_out(site, args.dev), workers=args.workers, threads=args.threads)
        if args.site:
            return None
    records, groups, facts = [], {}, {}
    for site in SITES:
        comparison = json.loads((site_out(site, args.dev) / "comparison.json").read_text())
        records += comparison["cells"]
        groups.update(comparison["groups_per_seed"])
        facts = {key: comparison[key] for key in ("group_kind", "metrics", "lower_is_better", "metrics_note")}
    spec = dataclasses.replace(BENCHMARK.spec, seeds=seeds)
    facts = {**facts, "groups_per_seed": groups, "unit": "target site: one per seed", "fixed_data": False}
    result = results(BENCHMARK, summarise(spec, facts, records))
    if not args.dev:
        write_json(RESULTS / f"{BENCHMARK.name}.json", result)
    print(rendered(result))
    return result


if __name__ == "__main__":
    main()
