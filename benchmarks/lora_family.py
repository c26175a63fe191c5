"""The LoRA family across scientific domains (issue 27 item 4, redesigned by issue 38): which refinement of LoRA helps
which kind of model, each at its authors' recipe, in cells where plain LoRA trains?

Compared on every domain, each against plain LoRA (``lora``, the reference; `workbench.adaptation.lora`), all at the
LoRA method's defaults (rank 16, alpha 16, every target group the model declares, head trained) but their recipe
(`RECIPES`): PiSSA initialisation; LoRA-One initialisation (one full-batch gradient of the cell's training samples)
with rsLoRA scaling, as its authors run it; rsLoRA scaling (alpha / sqrt(rank)); DoRA; RepLoRA (factors from a
light MLP: the project's reading of the paper's abstract, no code or full text being available — its row says so);
Flat-LoRA (loss at randomly perturbed merged weights, the authors' ρ = 0.05, `FLAT_MIN_STEPS` steps at least, else
"not tested"); GOAT with its derived scale (top-k routed experts from SVD segments, on the linear layers: its router
works per token, so convolutions are left out; sleepedf: the ``qkv`` group); and LIFT at its authors' budget (sparse
fine-tuning of the entries of largest magnitude in the rank-8 approximation — the paper's rule — with as many entries
as the domain's LoRA's factors, masks re-chosen every 400 steps; `workbench.adaptation.lift`).

Learning rates: every entry chooses per cell, on its validation loss, from `LR_GRID` (`CompareSpec.lr_grid`, one grid
for the comparison). A comparison has one grid, not one per entry: the grid is spaced ×4 around the task's rate for
LoRA (1e-3) so that rsLoRA-scaled entries (LoRA-One, rsLoRA: ×4 the update scale at rank 16, the same step at a 4×
smaller rate under Adam) and LIFT (its authors' 2e-4) find their own rate at its lower end, LoRA's at its middle.
Per-entry grids (three rates centred on each recipe's rate) would need one grid per entry in `CompareSpec`; a wider
shared grid gives each entry its three rates at the cost of one more run per cell.

Domains (`DOMAINS`), each the local LoRA of its model: ``ptbxl`` (12-lead ECG classifier adapted to the ambulance
site, macro AUROC) on a generated cohort per seed (`ptbxl_cohort`), ``sleepedf`` (LaBraM sleep staging, balanced
accuracy) on `eeg_lbm_lora`'s generated cohort per seed, ``physio`` (heartbeat classes at a new site, balanced
accuracy), ``medvl`` (closed-VQA accuracy of the VLM's comprehension records). Where the data are generated, each
seed reads its own dataset (``--data`` holding ``{seed}``), so the intervals cover new data, not only new partitions
of one dataset. rmd17 (ELoRA with the refinements) is `benchmarks/lora_family_rmd17.py`.

Sizes where the methods move (issue 38): a domain's training count (absolute, ``--train-size``) is chosen on
development seeds by `pilot` — plain LoRA (and LIFT, whose paired sd plans the seeds) at the domain's pilot counts,
smallest first, with at least `MIN_STEPS` optimizer steps; the smallest count where LoRA's after − before on the
headline metric is at least 3× the sd of its seeds' means (`reference_moved`'s ``unit_sd``) is the domain's count
(`COUNTS`; None: no pilot yet, the domain is not run), and `workbench compare --plan` on that pilot gives the seeds a
minimum detectable difference of 0.02 needs (`PLANNED_SEEDS`).

How it is measured: one `workbench compare` per domain at its count, named ``lora_family_<domain>_n<count>``, on 3
grouped folds × the domain's reported seeds (`SEEDS`: 3 independent units; `REPORTED_SEEDS` where the plan asked
for more and the machine afforded some), every entry on the same cells at the
same budget (``steps``: the same epochs, no early stopping, the best validation-loss epoch kept; epochs chosen so
that a cell takes at least `MIN_STEPS` steps). Beside the table, ``first_epoch`` in each results file: every cell's
validation loss after its first epoch, paired to plain LoRA's (LoRA-One's claim of a faster start).

Cut to fit this shared 2-core machine (issue 38 allowed 70 minutes of compute here): the learning-rate grid and two
entries without a claim on ptbxl and sleepedf (`AFFORDED_GRID`, `AFFORDED_ENTRIES`); physio and medvl have no pilot yet
(`COUNTS`), and need larger cohorts than their embedded sets for 3 validation subjects a fold.

    python benchmarks/lora_family.py --pilot --only ptbxl     # development seeds 0-2: choose the count
    python benchmarks/lora_family.py --only ptbxl --workers 2  # the benchmark at the chosen count
    python benchmarks/lora_family.py --only ptbxl --dev --epochs 1  # seeds 0, 1, a quick look (no results file)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

from claims import HERE, RESULTS, Benchmark, run
from eeg_lbm_lora import BACKBONES, VAL_WINDOWS
from eeg_lbm_lora import cohort as eeg_cohort
from eeg_lbm_lora import folder_of as eeg_folder_of
from medvl_hlora import subset

from workbench.comparison import statistics
from workbench.comparison.design import SEED_FIELD, CompareSpec
from workbench.comparison.execute import compare
from workbench.comparison.report import Claim
from workbench.core.checkpoint import write_json

ENTRIES = (
    "lora",
    "lora:pissa",
    "lora:lora-one",
    "lora:rslora",
    "lora:dora",
    "lora:replora",
    "lora:flat",
    "lora:goat",
    "lift",
)
#: The one option each refinement changes (the rest: the lora method's defaults); `lora_family_rmd17` applies them
#: to ELoRA.
VARIANTS = {
    "lora:pissa": {"init": "pissa"},
    "lora:lora-one": {"init": "lora-one"},
    "lora:rslora": {"lora_scaling": "rslora"},
    "lora:dora": {"dora": True},
    "lora:replora": {"reparam": "replora"},
    "lora:flat": {"objective": "flat-lora"},
    "lora:goat": {"init": "goat"},
}
#: Each refinement as its authors run it (METHODS.md, "The LoRA refinements as their authors run them"): LoRA-One
#: with rsLoRA scaling, GOAT with its derived scale; Flat-LoRA at ``flat_sigma`` 0.05 (the authors' ρ, the option's
#: default) and LIFT at its defaults (filter rank 8, budget of a rank-16 LoRA, masks re-chosen every 400 steps) are the
#: authors' already.
RECIPES = {
    **VARIANTS,
    "lora:lora-one": {"init": "lora-one", "lora_scaling": "rslora"},
    "lora:goat": {"init": "goat", "lora_scaling": "goat"},
}
#: Display names of the entries (`lora_family_rmd17` takes them for ELoRA's variants, which run `VARIANTS`).
NAMES = {
    "lora": "LoRA (`lora`)",
    "lora:pissa": "PiSSA (`lora:pissa`)",
    "lora:lora-one": "LoRA-One (`lora:lora-one`)",
    "lora:rslora": "rsLoRA (`lora:rslora`)",
    "lora:dora": "DoRA (`lora:dora`)",
    "lora:replora": "RepLoRA (`lora:replora`)",
    "lora:flat": "Flat-LoRA (`lora:flat`)",
    "lora:goat": "GOAT (`lora:goat`)",
    "lift": "LIFT (`lift`)",
}
#: Display names of this benchmark's entries, which run `RECIPES`: what each recipe sets, and RepLoRA's provenance.
RECIPE_NAMES = {
    **NAMES,
    "lora:lora-one": "LoRA-One, rsLoRA scale (`lora:lora-one`)",
    "lora:replora": "RepLoRA, the project's reading of its abstract (`lora:replora`)",
    "lora:flat": "Flat-LoRA, ρ 0.05 (`lora:flat`)",
    "lora:goat": "GOAT, derived scale (`lora:goat`)",
    "lift": "LIFT, LoRA's budget (`lift`)",
}
#: Learning rates every entry chooses from per cell on its validation loss (see the module docstring).
LR_GRID = (2.5e-4, 1e-3, 4e-3)
#: The grid each domain's benchmark runs, where this machine cannot afford `LR_GRID` (empty: every entry at the
#: task's rate, 1e-3 on ptbxl — LoRA's recipe, not the others'): a ptbxl cell took 60-125 s here under the load of
#: four other jobs, so the grid's 243 runs would take about 2.4 hours against the 81 runs' 50 minutes.
AFFORDED_GRID: dict[str, tuple[float, ...]] = {"ptbxl": (), "sleepedf": ()}  # sleepedf: as ptbxl, to fit one session
#: The entries each domain's benchmark runs, where this machine cannot afford them all: on ptbxl PiSSA and DoRA (no
#: claim under test, no recipe in question) are left out to fit the 70 minutes this benchmark was allowed; on sleepedf
#: too, to fit the session it ran in.
AFFORDED_ENTRIES = {
    domain: tuple(entry for entry in ENTRIES if entry not in ("lora:pissa", "lora:dora"))
    for domain in ("ptbxl", "sleepedf")
}
FOLDS = 3
#: Reported seeds (3 independent units: `workbench.comparison.statistics.MIN_UNITS`, all this machine affords).
SEEDS = (200, 201, 202)
#: Domains that run more seeds than `SEEDS` (sleepedf: its plan asked for 10, 5 fitted the session).
REPORTED_SEEDS = {"sleepedf": (200, 201, 202, 203, 204)}
#: Development seeds of `pilot`.
PILOT_SEEDS = (0, 1, 2)
#: Fewest optimizer steps of a cell (issue 38), and of a cell where Flat-LoRA is tested: its noise ramps up from 0
#: over the run (a cosine), so a few dozen steps barely perturb anything.
MIN_STEPS = FLAT_MIN_STEPS = 200
#: How far plain LoRA must move at a domain's count: after − before at least this many sds of its unit (seed) means.
MOVED_SDS = 3.0
#: The minimum detectable difference the seeds are planned for (headline metric, 80 % power).
TARGET_MDD = 0.02

#: The generated ptbxl cohort of each seed (`ptbxl_cohort`): the embedded target site's recipe (site 1, the ambulance
#: monitor the shipped teacher loses most on), `PTBXL_RECORDS` records of as many patients, the comparison's seed as
#: the generator's (the embedded set's is 2026). Sized to what the generator makes in about 10 minutes here (2.1 s a
#: record on an idle core: neurokit2's ECGSYN ODE per lead): 3 folds test 80 patients, validate on 32 and train on up
#: to 128.
PTBXL_RECORDS = 240
DATA = Path("benchmarks") / "runs" / "lora_family-data"
#: Where each seed's ptbxl cohort is written, a path holding `workbench.comparison.design.SEED_FIELD`.
PTBXL_DATA = str(DATA / f"ptbxl-site1-{PTBXL_RECORDS}records-seed{SEED_FIELD}")
#: Subjects of the embedded medvl data whose comprehension records are compared (5 records each).
MEDVL_SUBJECTS = 32
MEDVL_DATA = DATA / f"medvl-comprehension-subjects{MEDVL_SUBJECTS}"


def ptbxl_cohort(seed: int, records: int = PTBXL_RECORDS) -> Path:
    """The generated ptbxl cohort of ``seed`` in PTB-XL's layout (`generate_ptbxl_synthetic` with the embedded site 1's
    recipe, ``records`` records, generator seed ``seed``), written once (atomically: a folder that exists is complete);
    its path relative to the repository, as the spec records it."""
    from workbench.domains.ecg.generate import DEFAULT_SITES, generate_ptbxl_synthetic

    out = Path(PTBXL_DATA.replace(SEED_FIELD, str(seed)))
    if not (HERE.parent / out).is_dir():
        site = dataclasses.replace(next(s for s in DEFAULT_SITES if s.site == 1), n_records=records)
        generate_ptbxl_synthetic(HERE.parent / out, seed=seed, sites=(site,), progress=True)
    return out


def medvl_comprehension(seed: int) -> Path:
    """The comprehension records (closed / open VQA, reports) of `MEDVL_SUBJECTS` embedded subjects and their images,
    written once into `MEDVL_DATA` (`medvl_hlora.subset`); one set for every seed (embedded data)."""
    from workbench.domains.medvl.generate import COMPREHENSION_TASKS

    return subset(subjects=MEDVL_SUBJECTS, out=MEDVL_DATA, tasks=COMPREHENSION_TASKS)


def sleep_cohort(seed: int) -> Path:
    """`eeg_lbm_lora`'s generated 30-night sleep cohort of ``seed`` (written once there): 3 folds test 10 nights,
    validate on 4 and train on 16."""
    return eeg_cohort("sleepedf", seed)


#: Per domain: headline metrics, the task's batch size, the training pool of a fold (the count that is 100 %), the
#: counts a pilot tries, the data where set (``data``: the folder, holding `SEED_FIELD` where each seed reads its own;
#: ``make``: a function of the seed that writes that seed's folder once; None: the embedded data), the model and the
#: validation windows per cell. sleepedf runs on `eeg_lbm_lora`'s 30-night cohorts from its LaBraM pretrained on
#: another generator configuration (a fold's 16 training nights hold about 1,070 windows); physio and medvl keep the
#: embedded data's sizes: 6 patients a site give one validation subject a fold, which issue 38 asks to raise to 3 with a
#: larger cohort (not yet afforded on this machine).
DOMAINS: dict[str, dict[str, Any]] = {
    "ptbxl": {"metrics": ("macro_auroc", "macro_average_precision"), "batch": 8, "pool": 128,
              "pilot": (32, 64, 128), "data": PTBXL_DATA, "make": ptbxl_cohort},
    "sleepedf": {"metrics": ("balanced_accuracy", "cohen_kappa"), "batch": 16, "pool": 1070, "pilot": (40, 80, 160),
                 "data": eeg_folder_of("sleepedf"), "make": sleep_cohort, "model": str(BACKBONES["sleepedf"]),
                 "val_size": VAL_WINDOWS},
    "physio": {"metrics": ("balanced_accuracy", "macro_f1"), "batch": 32, "pool": 320, "pilot": (160, 320),
               "data": None},
    "medvl": {"metrics": ("closed_accuracy", "open_recall", "report_f1"), "batch": 16, "pool": 65, "pilot": (65,),
              "data": str(MEDVL_DATA), "make": medvl_comprehension, "common": {"targets": "language"}},
}  # fmt: skip
#: Each domain's training count, chosen by its pilot (None: no pilot yet; the domain is not run).
COUNTS: dict[str, int | None] = {"ptbxl": 32, "sleepedf": 40, "physio": None, "medvl": None}
#: Seeds `workbench compare --plan` asks for on the domain's pilot (a minimum detectable difference of `TARGET_MDD`
#: on the headline metric, for the largest paired sd of the pilot), and the MDD the domain's reported seeds reach there.
PLANNED_SEEDS: dict[str, tuple[int | None, float] | None] = {
    # pilot lift − lora on macro_auroc, seeds 0-2 at 32 records: sd of a seed's mean difference 0.00567
    "ptbxl": (3, 0.0185),
    # pilot lift − lora on balanced_accuracy, seeds 0-2 at 40 windows: sd of a seed's mean difference 0.0191
    "sleepedf": (10, 0.0322),
    **{domain: None for domain in ("physio", "medvl")},
}

#: LIFT's options per domain where the task sets LoRA's own (sleepedf: `workbench.domains.eeg.window_task.LBM_LORA`,
#: conv + qkv at rank 8): the same targets, and masks of as many entries as that LoRA's factors.
LIFT_OPTIONS = {"sleepedf": {"targets": "conv,qkv", "budget_rank": 8}}
#: GOAT's options per domain where LoRA's targets hold convolutions GOAT's per-token router cannot take (sleepedf's
#: conv + qkv): the linear ones (elsewhere GOAT takes the linear layers of the declared groups by itself).
GOAT_OPTIONS = {"sleepedf": {"targets": "qkv"}}


def entry_options(domain: str, entries: tuple[str, ...] = ENTRIES) -> dict[str, dict[str, Any]]:
    """The options of each of ``entries`` on ``domain``: its recipe and the domain's common ones (medvl: every entry
    adapts the language model's linears, the ``language`` group, as its comprehension records leave the last vision
    layer and the generation projector without gradient)."""
    common = DOMAINS[domain].get("common", {})
    options = {label: {**common, **recipe} for label, recipe in RECIPES.items()}
    options["lift"] = {**common, **LIFT_OPTIONS.get(domain, {})}
    options["lora:goat"] = {**options["lora:goat"], **GOAT_OPTIONS.get(domain, {})}
    options["lora"] = dict(common)
    return {label: chosen for label, chosen in options.items() if chosen and label in entries}


def epochs_for(domain: str, count: int) -> int:
    """Epochs that give a cell of ``count`` training samples at least `MIN_STEPS` optimizer steps."""
    batch = min(DOMAINS[domain]["batch"], count)
    return math.ceil(MIN_STEPS / math.ceil(count / batch))


def write_data(domain: str, seeds: tuple[int, ...]) -> None:
    """Write ``domain``'s data of each of ``seeds`` that is not written yet (nothing for the embedded data)."""
    make: Callable[[int], Path] | None = DOMAINS[domain].get("make")
    for seed in seeds if make else ():
        make(seed)


def spec(domain: str, count: int, entries: tuple[str, ...] = ENTRIES, seeds: tuple[int, ...] = SEEDS,
         grid: tuple[float, ...] = LR_GRID) -> CompareSpec:  # fmt: skip
    """The comparison of ``entries`` on ``domain`` with ``count`` training samples a cell (Flat-LoRA only where a
    cell takes `FLAT_MIN_STEPS` steps)."""
    batch = min(DOMAINS[domain]["batch"], count)
    epochs = epochs_for(domain, count)
    if epochs * math.ceil(count / batch) < FLAT_MIN_STEPS:
        entries = tuple(entry for entry in entries if entry != "lora:flat")
    return CompareSpec(
        domain,
        entries,
        reference="lora",
        folds=FOLDS,
        seeds=seeds,
        budget="steps",
        epochs=epochs,
        train_size=None if count >= DOMAINS[domain]["pool"] else count,
        batch_size=batch,
        lr_grid=grid,
        data=DOMAINS[domain]["data"],
        model=DOMAINS[domain].get("model"),
        val_size=DOMAINS[domain].get("val_size"),
        method_options=entry_options(domain, entries),
    )


def claims(domain: str) -> tuple[Claim, ...]:
    """The issue's claims, on the headline metric: RepLoRA's (low data), Flat-LoRA's (better generalisation) and
    LIFT's, each "better than LoRA"."""
    metric = DOMAINS[domain]["metrics"][0]
    return (
        Claim("lora:replora", metric, text="RepLoRA (the project's reading) beats LoRA with few training samples"),
        Claim("lora:flat", metric, text="Flat-LoRA generalises better than LoRA (higher test score)"),
        Claim("lift", metric, text="LIFT beats LoRA at the same parameter budget"),
    )


def note(domain: str, count: int) -> str:
    """How the benchmark of ``domain`` was designed and cut, rendered under its table."""
    settings = DOMAINS[domain]
    entries = AFFORDED_ENTRIES.get(domain, ENTRIES)
    chosen = spec(domain, count, entries)
    steps = chosen.epochs * math.ceil(count / chosen.batch_size)
    grid = AFFORDED_GRID.get(domain, LR_GRID)
    rates = (
        f"each entry's learning rate chosen per cell on validation loss from {', '.join(f'{r:g}' for r in grid)}"
        if grid else
        f"one learning rate for every entry, the task's 1e-3 (LoRA's recipe; 4× LoRA's step for the rsLoRA-scaled "
        f"LoRA-One and rsLoRA, 5× LIFT's authors' rate): the design's grid ({', '.join(f'{r:g}' for r in LR_GRID)}, "
        "chosen per cell on validation) would triple the runs, more than this machine afforded"
    )  # fmt: skip
    left_out = [NAMES[entry].split(" (")[0] for entry in ENTRIES if entry not in entries]
    cut = f" Left out to fit the machine: {', '.join(left_out)} (no claim under test)." if left_out else ""
    flat = "" if "lora:flat" in chosen.methods else f" Flat-LoRA not tested (fewer than {FLAT_MIN_STEPS} steps)."
    planned = PLANNED_SEEDS[domain]
    plan = "" if planned is None else (
        f" Seeds: `workbench compare --plan` on the development pilot (LIFT − LoRA's sd of a seed's mean difference) "
        f"asks for {planned[0] or 'more than 1000'} seeds for a minimum detectable difference (MDD) of {TARGET_MDD:g} "
        f"on {settings['metrics'][0]}; {len(REPORTED_SEEDS.get(domain, SEEDS))} seeds reach {planned[1]:.3f} there "
        "(each entry's own MDD is in the table; where it is above the target, a claim whose interval holds 0 gets no "
        "verdict)."
    )  # fmt: skip
    data = {
        "ptbxl": f"one generated cohort per seed (the seed is the generator's), {PTBXL_RECORDS} patients of one "
                 "record each by the embedded site 1's recipe: a fold tests 80 patients (fewer than the 200 issue 38 "
                 "asks: the generator made 240 records in 15 minutes here) and validates on 32",
        "sleepedf": "`eeg_lbm_lora`'s generated cohorts, one per seed (the seed is the generator's), of 30 nights (5 "
                    "sleep cycles each), from its LaBraM pretrained on another generator configuration: a fold tests "
                    f"10 nights (about 670 windows) and validates on {VAL_WINDOWS} windows of 4 nights; the pool of "
                    "1,070 is approximate (64-70 windows a night)",
        "medvl": f"the comprehension records (closed / open VQA, reports) of {MEDVL_SUBJECTS} of the 128 embedded "
                 "subjects, every entry adapting the language model's linears",
    }.get(domain, "the embedded data")  # fmt: skip
    return (
        f"{count} training samples a cell ({round(100 * count / settings['pool'])} % of a fold's training pool of "
        f"{settings['pool']}): the smallest count at which plain LoRA's after − before reached {MOVED_SDS:g}× the sd "
        f"of its seed means on development seeds; batch {chosen.batch_size}, {chosen.epochs} epochs ({steps} "
        f"optimizer steps, budget steps, the best validation-loss epoch kept); {rates}. Otherwise each method at its "
        "authors' recipe (`RECIPES`: LoRA-One with rsLoRA scaling, GOAT with its derived scale, Flat-LoRA ρ 0.05, "
        f"LIFT at LoRA's parameter budget); RepLoRA is the project's reading of its abstract (no code or full text)."
        f"{cut}{flat}{plan} Data: {data}. rmd17 (ELoRA with the refinements) is its own benchmark: "
        "`lora_family_rmd17`."
    )


def benchmark(domain: str, count: int) -> Benchmark:
    return Benchmark(
        name=f"lora_family_{domain}_n{count}",
        script=f"lora_family.py --only {domain}",
        spec=spec(domain, count, AFFORDED_ENTRIES.get(domain, ENTRIES), REPORTED_SEEDS.get(domain, SEEDS),
                  AFFORDED_GRID.get(domain, LR_GRID)),
        claims=claims(domain),
        metrics=DOMAINS[domain]["metrics"][:2],
        names=RECIPE_NAMES,
        note=note(domain, count),
    )


def pilot(domain: str, workers: int = 1) -> list[dict[str, Any]]:
    """Plain LoRA on development seeds `PILOT_SEEDS` at each pilot count of ``domain`` (at LoRA's rate, the task's; no
    grid; LIFT beside it at the smallest count, for the paired sd `workbench compare --plan` reads), into
    ``runs/dev/lora_family_<domain>_pilot_n<count>/``, from the smallest count up to the first where LoRA moved: per
    count, LoRA's after − before on the headline metric (mean, unit sd — of the seeds' fold means, as
    `reference_moved` — and cell-to-cell sd, steps) and whether the mean is `MOVED_SDS` unit sds."""
    metric = DOMAINS[domain]["metrics"][0]
    rows = []
    counts = DOMAINS[domain]["pilot"]
    for count in counts:
        entries = ("lora", "lift") if count == counts[0] else ("lora",)
        chosen = spec(domain, count, entries=entries, seeds=PILOT_SEEDS, grid=())
        write_data(domain, chosen.seeds)
        out = HERE / "runs" / "dev" / f"lora_family_{domain}_pilot_n{count}"
        comparison = compare(chosen, out, workers=workers, quiet=True)
        cells = [c for c in comparison["cells"] if c["method"] == "lora"]
        moves = [c["metrics"][metric] - c["before"][metric] for c in cells]
        moved = comparison["reference_moved"][metric]
        cell_sd = statistics.paired_units(moves, list(range(len(moves))))["unit_sd"]
        rows.append({"count": count, "out": str(out), "after_minus_before": moved["mean"],
                     "unit_sd": moved["unit_sd"], "cell_sd": cell_sd, "steps": moved["steps"],
                     "moved": moved["mean"] >= MOVED_SDS * moved["unit_sd"]})  # fmt: skip
        if "lift" in entries:
            paired = comparison["summary"]["lift"]["metrics"][metric]["vs_reference"]
            rows[-1].update({"lift_minus_lora": paired["mean"], "paired_unit_sd": paired["unit_sd"]})
        print(json.dumps(rows[-1]), flush=True)
        if rows[-1]["moved"]:  # the smallest count that moves: larger ones are not needed
            break
    return rows


def first_epoch(name: str, dev: bool) -> dict[str, Any]:
    """Each cell's validation loss after its first epoch, from its run's history, and per entry the paired difference
    to plain LoRA over the seeds (`first_epoch_summary`)."""
    folder = HERE / "runs" / ("dev" if dev else "") / name
    comparison = json.loads((folder / "comparison.json").read_text())
    losses: dict[str, dict[str, float]] = {}
    for cell in comparison["cells"]:
        method = cell["method"].split(":", 1)[0].split("@", 1)[0]
        history = json.loads((folder / cell["run"] / "results" / f"{method}.json").read_text())["history"]
        losses.setdefault(cell["method"], {})[f"fold{cell['fold']}-seed{cell['seed']}"] = history[0]["val_loss"]
    return first_epoch_summary(losses)


def first_epoch_summary(losses: dict[str, dict[str, float]]) -> dict[str, Any]:
    """``{"cells": losses, ENTRY: paired difference to lora}`` from each entry's first-epoch validation loss per cell
    (``fold<k>-seed<s>``): `workbench.comparison.statistics.paired_units` over the seeds."""
    reference = losses["lora"]
    out: dict[str, Any] = {"cells": losses}
    for method, cells in losses.items():
        if method != "lora":
            keys = sorted(cells)
            differences = [cells[k] - reference[k] for k in keys]
            out[method] = statistics.paired_units(differences, [k.rsplit("seed", 1)[1] for k in keys])
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=tuple(DOMAINS), help="one domain (default: every one with a chosen count)")
    parser.add_argument("--pilot", action="store_true", help="development seeds 0-2 at the pilot counts")
    args, rest = parser.parse_known_args(argv)
    os.chdir(HERE.parent)  # the data paths in the specs are relative to the repository
    dev = "--dev" in rest
    for domain in DOMAINS:
        if args.only not in (None, domain):
            continue
        if args.pilot:
            workers = int(next((rest[i + 1] for i, a in enumerate(rest) if a == "--workers"), 1))
            pilot(domain, workers)
            continue
        count = COUNTS[domain]
        if count is None:
            print(f"{domain}: no count chosen yet (run --pilot --only {domain} first): skipped")
            continue
        chosen = benchmark(domain, count)
        write_data(domain, (0, 1) if dev else chosen.spec.seeds)
        run(chosen, rest)
        epochs = next((rest[i + 1] for i, a in enumerate(rest) if a == "--epochs"), None)
        name = chosen.name + (f"-e{epochs}" if epochs else "")
        start = first_epoch(name, dev)
        print("validation loss after epoch 1, paired to lora:", json.dumps(
            {m: v for m, v in start.items() if m != "cells"}, indent=1))  # fmt: skip
        path = RESULTS / f"{chosen.name}.json"
        if not dev:
            write_json(path, {**json.loads(path.read_text()), "first_epoch": start})


if __name__ == "__main__":
    main(sys.argv[1:])
