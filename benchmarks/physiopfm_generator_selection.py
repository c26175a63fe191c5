"""PhysioPFM's generator settings, chosen on the grid bank alone by leaving whole sites out (never on a target site).

The grid bank (`models/checkpoints/physiopfm_grid_bank.safetensors`, card ``physiopfm-grid-bank``: 36 grid sites ×
6 patient pairs) is cut by site into `FOLDS` folds (the sites shuffled with seed 0); for each fold the generator is
fitted on the other folds' entries only — every entry of a held-out site left out — and, at each of `CHECKPOINTS`
iterations, generates the held-out entries' LoRAs from their descriptors (the mean of `DRAWS` DDIM draws, as the
benchmark does). Score: the cosine between the generated and the fitted update ΔW = (α/r) B A over all adapted
layers, averaged over the held-out entries — the cross-site held-out ΔW cosine — beside the same cosine of the two
bank baselines (the mean of the fitted entries; the entry with the nearest descriptor). The size (width, depth) and
iterations with the highest mean cosine are chosen; `benchmarks/physiopfm.py` reads them from the results file.

    python benchmarks/physiopfm_generator_selection.py             # every fold, then results/...selection.json
    python benchmarks/physiopfm_generator_selection.py --fold 0    # one fold into runs/physiopfm-selection/ (to run
    python benchmarks/physiopfm_generator_selection.py --merge     # folds side by side), then merge them
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from workbench.adaptation.physiopfm.bank import delta_of, load_bank, lora_scale
from workbench.adaptation.physiopfm.descriptors import task_descriptor
from workbench.adaptation.physiopfm.generator import fit_weight_generator

from workbench.core.checkpoint import write_json

HERE = Path(__file__).resolve().parent
BANK = HERE.parent / "models" / "checkpoints" / "physiopfm_grid_bank.safetensors"
RESULTS = HERE / "results" / "physiopfm_generator_selection.json"
PARTS = HERE / "runs" / "physiopfm-selection"
FOLDS = 3
SIZES = ({"width": 32, "depth": 1}, {"width": 64, "depth": 2})
CHECKPOINTS = (250, 500, 1000)
DRAWS = 4
SAMPLING_STEPS = 50
SEED = 0


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a, b, dim=0))


def run_fold(fold: int) -> dict:
    """One fold: its held-out sites, the per-entry cosines of each size at each checkpoint and of the baselines."""
    torch.set_num_threads(1)
    bank = load_bank(BANK)
    entries, scale = bank.entries, lora_scale()
    vectors = torch.stack([e.vector() for e in entries])
    conditions = torch.as_tensor(np.stack([task_descriptor(e.prototypes, e.counts) for e in entries]))
    deltas = torch.stack([e.delta(scale) for e in entries])
    sites = np.array([e.provenance["site"] for e in entries])
    order = np.random.default_rng(SEED).permutation(sorted(set(sites.tolist())))
    held_sites = sorted(np.array_split(order, FOLDS)[fold].tolist())
    held = np.flatnonzero(np.isin(sites, held_sites))
    fit = np.flatnonzero(~np.isin(sites, held_sites))
    mean_delta = delta_of(bank.factors_of(vectors[fit].mean(0)), scale)
    distance = torch.cdist(conditions[held], conditions[fit])
    part = {"fold": fold, "held_out_sites": held_sites, "held_out_entries": len(held), "fit_entries": len(fit),
            "baselines": {"mean_of_bank": [cosine(mean_delta, deltas[i]) for i in held],
                          "nearest_descriptor": [cosine(deltas[fit[int(distance[r].argmin())]], deltas[i])
                                                 for r, i in enumerate(held)]},
            "generated": {}, "fit_seconds": {}}  # fmt: skip
    for size in SIZES:
        key = f"width{size['width']}-depth{size['depth']}"
        per_checkpoint = part["generated"][key] = {str(c): [] for c in CHECKPOINTS}

        def score(iterations: int, model: torch.nn.Module) -> None:
            made = torch.stack([model.generate(conditions[held], SAMPLING_STEPS, seed=SEED * 1000 + k)
                                for k in range(DRAWS)]).mean(0)  # fmt: skip
            per_checkpoint[str(iterations)] = [cosine(delta_of(bank.factors_of(row), scale), deltas[i])
                                               for row, i in zip(made, held)]  # fmt: skip

        start = time.perf_counter()
        fit_weight_generator("diffusion", vectors[fit], conditions[fit], iterations=max(CHECKPOINTS), seed=SEED,
                             checkpoints=CHECKPOINTS, callback=score, **size)  # fmt: skip
        part["fit_seconds"][key] = time.perf_counter() - start
        print(fold, key, {c: round(float(np.mean(v)), 3) for c, v in per_checkpoint.items()}, flush=True)
    write_json(PARTS / f"fold{fold}.json", part)
    return part


def merge() -> dict:
    """Pool the folds' held-out entries, choose the size and iterations of the highest mean cosine, write results."""
    parts = [json.loads((PARTS / f"fold{fold}.json").read_text()) for fold in range(FOLDS)]
    pooled = {key: {c: sum((p["generated"][key][c] for p in parts), []) for c in parts[0]["generated"][key]}
              for key in parts[0]["generated"]}  # fmt: skip
    table = {key: {c: float(np.mean(v)) for c, v in by.items()} for key, by in pooled.items()}
    key, iterations = max(((k, c) for k, by in table.items() for c in by), key=lambda kc: table[kc[0]][kc[1]])
    size = next(s for s in SIZES if f"width{s['width']}-depth{s['depth']}" == key)
    result = {
        "script": Path(__file__).name,
        "bank": str(BANK.relative_to(HERE.parent)),
        "entries": sum(p["held_out_entries"] for p in parts),
        "folds": [p["held_out_sites"] for p in parts],
        "draws": DRAWS,
        "sampling_steps": SAMPLING_STEPS,
        "held_out_delta_cosine": table,
        "held_out_delta_cosine_sd": {k: {c: float(np.std(v)) for c, v in by.items()} for k, by in pooled.items()},
        "baselines_delta_cosine": {
            name: float(np.mean(sum((p["baselines"][name] for p in parts), []))) for name in parts[0]["baselines"]
        },  # fmt: skip
        "fit_seconds_per_fold": {k: float(np.mean([p["fit_seconds"][k] for p in parts])) for k in pooled},
        "chosen": {**size, "iterations": int(iterations), "draws": DRAWS},
        "chosen_delta_cosine": table[key][iterations],
    }
    write_json(RESULTS, result)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fold", type=int, help="run one fold only")
    parser.add_argument("--merge", action="store_true", help="merge the folds' files into the results")
    args = parser.parse_args()
    if args.fold is not None:
        run_fold(args.fold)
    elif args.merge:
        merge()
    else:
        for fold in range(FOLDS):
            run_fold(fold)
        merge()
