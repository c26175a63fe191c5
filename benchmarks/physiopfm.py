"""PhysioPFM's claims (seed 003, issue 12) at a new site: does a LoRA generated from the site's class shapelets,
with no backprop at the site, do what a LoRA trained there does?

Each seed is a subject-wise fold of the target site (the seed shuffles its subjects: ``--test-subjects`` 2 for the
scores, ``--val-subjects`` 1 for the baselines' early stopping, the rest labelled; the descriptors use the labelled
and validation patients) and seeds the generator. On each fold one `workbench.adapt` run makes the generated LoRA
(``physiopfm``: diffusion transformer, PIP shapelets, every bank entry of the other sites) beside its baselines:
the frozen backbone with the ETF head (no LoRA), the mean of the bank, the nearest-descriptor bank entry, a linear
probe, the same LoRA trained by backprop at the site (``physiopfm-local``, the upper bound) and full fine-tuning.
Then one run per ablation: the plain conditional regressor instead of the diffusion model, raw class series
instead of shapelets as descriptors, and smaller banks (12 and 24 entries).

Targets (issue 12): the generated LoRA beats no-LoRA and mean-of-bank by more than the seed spread (the sum of the
two rows' standard deviations), closes at least half of the gap to local LoRA (gap closed = (generated − none) /
(local − none), per fold), at a tenth of local LoRA's adaptation time or less (the site stage's seconds vs local
LoRA's training seconds; the generator's fit on the bank, done once per bank and target, is shown beside it).

    python benchmarks/physiopfm.py                     # site D, seeds 0 1 2 (~25 min, 2 cores)
    python benchmarks/physiopfm.py --sites B D --seeds 0
    python benchmarks/physiopfm.py --table             # the tables of the saved results
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from workbench.domains.physio.task import PHYSIOPFM_BASELINES

import workbench

RESULTS = Path(__file__).parent / "results" / "physiopfm.json"
LABELS = {"physiopfm": "generated (diffusion)", "physiopfm-none": "no LoRA (frozen + ETF)",
          "physiopfm-mean": "mean of bank", "physiopfm-nearest": "nearest descriptor", "readout": "linear probe",
          "physiopfm-local": "local LoRA (backprop)", "full": "local full fine-tuning"}  # fmt: skip
ABLATIONS = {
    "ablation: regressor": {"generator": "regressor"},
    "ablation: raw series": {"descriptor": "raw"},
    "ablation: bank of 12": {"bank_size": 12},
    "ablation: bank of 24": {"bank_size": 24},
}


def run_fold(site: str, seed: int, runs: Path) -> list[dict]:
    """Every method and ablation on one fold of ``site``: one record each."""
    common = dict(domain="physio", target_site=site, seed=seed, quiet=True, test_subjects=2, val_subjects=1)
    metrics = workbench.adapt(method="physiopfm", baselines=list(PHYSIOPFM_BASELINES), out=str(runs / f"{site}{seed}"),
                              **common).metrics  # fmt: skip
    records = [_record(site, seed, LABELS["physiopfm"], metrics, "physiopfm", metrics["after"])]
    records += [_record(site, seed, LABELS[e], metrics, e, metrics["baselines"][e]) for e in PHYSIOPFM_BASELINES]
    for label, options in ABLATIONS.items():
        name = label.split(": ")[1].replace(" ", "-")
        run = workbench.adapt(method="physiopfm", baselines=[], method_options=options,
                              out=str(runs / f"{site}{seed}-{name}"), **common).metrics  # fmt: skip
        records.append(_record(site, seed, label, run, "physiopfm", run["after"]))
    return records


def _record(site: str, seed: int, label: str, metrics: dict, entry: str, scores: dict) -> dict:
    cost = metrics["costs"][entry]
    keep = ("balanced_accuracy", "macro_f1", "accuracy", "cohen_kappa", "site_adaptation_seconds",
            "site_adaptation_memory_bytes", "generator_fit_seconds", "delta_cosine_held_out",
            "delta_relative_error_held_out", "mean_of_bank_delta_cosine_held_out", "bank_entries")  # fmt: skip
    return {"site": site, "seed": seed, "method": label, "test_subjects": metrics["data_summary"]["split"]["test"],
            **{k: scores[k] for k in keep if k in scores}, "train_seconds": cost["train_seconds"],
            "training_memory_bytes": cost["training_memory_bytes"]}  # fmt: skip


def _stat(values: list[float], digits: int = 3) -> str:
    return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def table(records: list[dict]) -> str:
    """Per site and method: balanced accuracy, macro F1 (mean ± sd over folds), adaptation seconds; then the
    targets, each with what was measured and whether it holds."""
    lines = []
    for site in sorted({r["site"] for r in records}):
        rows = [r for r in records if r["site"] == site]
        by = {(r["method"], r["seed"]): r for r in rows}
        seeds = sorted({r["seed"] for r in rows})
        header = f"site {site} ({len(seeds)} folds){'':<16}{'bal. acc.':>16}{'macro F1':>16}{'adapt s':>9}{'MiB':>7}"
        lines += [header, "-" * len(header)]
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = [by[method, s] for s in seeds]
            seconds = [r.get("site_adaptation_seconds", r["train_seconds"]) for r in mine]
            memory = [r.get("site_adaptation_memory_bytes", r["training_memory_bytes"]) or 0 for r in mine]
            lines.append(f"{method:<38}{_stat([r['balanced_accuracy'] for r in mine]):>16}"
                         f"{_stat([r['macro_f1'] for r in mine]):>16}{np.mean(seconds):>9.2f}"
                         f"{np.mean(memory) / 2**20:>7.0f}")  # fmt: skip

        def accuracy(method: str) -> np.ndarray:
            return np.array([by[method, s]["balanced_accuracy"] for s in seeds])

        generated, none, mean = (
            accuracy(LABELS["physiopfm"]),
            accuracy(LABELS["physiopfm-none"]),
            accuracy(LABELS["physiopfm-mean"]),
        )
        local = accuracy(LABELS["physiopfm-local"])
        gap = (generated - none) / np.maximum(local - none, 1e-9)
        ours = [by[LABELS["physiopfm"], s] for s in seeds]
        site_s = np.mean([r["site_adaptation_seconds"] for r in ours])
        fit_s = np.mean([r["generator_fit_seconds"] for r in ours])
        local_s = np.mean([by[LABELS["physiopfm-local"], s]["train_seconds"] for s in seeds])

        def verdict(ok: bool) -> str:
            return "holds" if ok else "FAILS"

        margin = {name: (np.mean(generated - other), np.std(generated) + np.std(other))
                  for name, other in (("no LoRA", none), ("mean of bank", mean))}  # fmt: skip
        lines.append("")
        for name, (gain, spread) in margin.items():
            lines.append(f"  generated − {name}: {gain:+.3f} (seed spread {spread:.3f}): {verdict(gain > spread)}")
        lines.append(f"  gap closed to local LoRA: {_stat(list(gap), 2)}: {verdict(np.mean(gap) >= 0.5)}")
        ratio = site_s / local_s
        lines.append(f"  site adaptation {site_s:.2f} s vs local LoRA training {local_s:.1f} s = {ratio:.3f}x: "
                     f"{verdict(ratio <= 0.1)} (the generator's fit on the bank: {fit_s:.0f} s, once per bank and "
                     f"target; with it {(site_s + fit_s) / local_s:.1f}x)")  # fmt: skip
        cosine = [r["delta_cosine_held_out"] for r in ours]
        cosine_mean = [r["mean_of_bank_delta_cosine_held_out"] for r in ours]
        lines.append(f"  held-out bank entries: generated-vs-fitted ΔW cosine {_stat(cosine, 2)} (mean of bank: "
                     f"{_stat(cosine_mean, 2)}), relative error "
                     f"{_stat([r['delta_relative_error_held_out'] for r in ours], 2)}")  # fmt: skip
        lines.append("")
    lines.append("balanced accuracy and macro F1 on the fold's test patients, mean ± sd over folds; adapt s: the site "
                 "stage's seconds (generated, bank baselines) or training seconds (the others); MiB: what that stage "
                 "added to the process at its peak")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", nargs="+", default=["D"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--table", action="store_true", help="print the tables of the saved results")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(RESULTS.read_text())["records"]))
        return
    records = []
    with tempfile.TemporaryDirectory() as folder:
        for site in args.sites:
            for seed in args.seeds:
                records += run_fold(site, seed, Path(folder))
                print(f"site {site} seed {seed} done", flush=True)
    RESULTS.write_text(json.dumps({"sites": args.sites, "seeds": args.seeds, "records": records}, indent=1) + "\n")
    print(table(records))


if __name__ == "__main__":
    main()
