"""The physio task's PhysioPFM bank: rank-4 LoRAs of the shipped backbone fitted on sub-tasks of the embedded sites.

Stage (a) of PhysioPFM (`workbench.adaptation.physiopfm`), made by ``workbench pretrain --domain physio --stage
bank``. The paper's bank comes from public data sets and class subsets; ours from the four embedded synthetic sites
(card ``physio-synthetic``; a run leaves out its target site's entries): each site's six subjects are cut into
three pairs (shuffled with the seed), and every pair gives one sub-task per class subset of two or more of N, S, V,
F whose classes each have at least ``min_beats`` beats there. Each sub-task's LoRA is fitted from the shared
initialisation with the fixed ETF head (`workbench.adaptation.physiopfm.bank.fit_entry`).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from workbench.adaptation.physiopfm.bank import (
    HEAD_SETTINGS,
    LORA_SETTINGS,
    Bank,
    BankEntry,
    attach,
    backbone_fingerprint,
    fit_entry,
    save_bank,
    series_sha256,
)
from workbench.adaptation.physiopfm.descriptors import class_prototypes
from workbench.domains.physio.beats import read_beat_folder

log = logging.getLogger(__name__)

#: The shipped bank (card ``physiopfm-bank``).
SHIPPED_BANK = Path(__file__).resolve().parents[2] / "models" / "checkpoints" / "physiopfm_bank.safetensors"


def record_hashes(root: Path, records: list[str]) -> dict[str, str]:
    """sha256 of each record's ``.dat`` file under ``root`` (how a bank entry and a site are told apart)."""
    hashes = {}
    for record in records:
        found = sorted(Path(root).rglob(f"{record}.dat"))
        if found:
            hashes[record] = hashlib.sha256(found[0].read_bytes()).hexdigest()
    return hashes


def build_physio_bank(
    out: str | Path,
    sites: tuple[str, ...] = ("A", "B", "C", "D"),
    steps: int = 200,
    min_beats: int = 4,
    seed: int = 0,
    progress: bool = True,
) -> Bank:
    """Fit and write the bank (see the module); returns it."""
    from workbench.domains.physio.task import AFTER_S, BEFORE_S, CLASSES, EMBEDDED, _four_classes, model_inputs

    rng = np.random.default_rng(seed)
    tasks = []
    for site in sites:
        folder = EMBEDDED / f"site-{site}"
        beats = _four_classes(read_beat_folder(folder, lead="MLII", before_s=BEFORE_S, after_s=AFTER_S))
        inputs = model_inputs(beats.beats_mv, beats.fs_hz)
        subjects = rng.permutation(sorted(set(beats.subjects.tolist())))
        for pair in (sorted(subjects[i : i + 2].tolist()) for i in range(0, len(subjects) - 1, 2)):
            in_pair = np.isin(beats.subjects, pair)
            counts = np.bincount(beats.labels[in_pair], minlength=len(CLASSES))
            present = [k for k in range(len(CLASSES)) if counts[k] >= min_beats]
            for size in range(2, len(present) + 1):
                for subset in itertools.combinations(present, size):
                    keep = in_pair & np.isin(beats.labels, subset)
                    tasks.append((site, folder, pair, subset, inputs[keep], beats.labels[keep]))
    return _fit_bank(tasks, out, steps=steps, batch_size=64, seed=seed, progress=progress, card="physiopfm-bank")


def build_grid_bank(
    out: str | Path,
    steps: int = 80,
    batch_size: int = 32,
    patients_per_site: int = 4,
    min_beats: int = 4,
    seed: int = 0,
    progress: bool = True,
) -> Bank:
    """The procedural grid's bank (card ``physiopfm-grid-bank``): the 36 grid sites
    (`workbench.domains.physio.procedural.grid_sites`, ``patients_per_site`` patients each) written to a temporary
    folder and read back as the task reads a site; every pair of a site's patients is one sub-task of all four
    classes (each with ≥ ``min_beats`` beats; a pair short of one is left out and logged), its LoRA fitted for
    ``steps`` Adam steps on batches of ``batch_size``, stored in float16."""
    import tempfile

    from workbench.domains.physio.procedural import generate_procedural_sites, grid_sites
    from workbench.domains.physio.task import AFTER_S, BEFORE_S, CLASSES, _four_classes, model_inputs

    tasks = []
    with tempfile.TemporaryDirectory() as scratch:
        root = generate_procedural_sites(Path(scratch) / "grid", grid_sites(), patients_per_site, progress=progress)
        for site in grid_sites():
            folder = root / f"site-{site.name}"
            beats = _four_classes(read_beat_folder(folder, lead="MLII", before_s=BEFORE_S, after_s=AFTER_S))
            inputs = model_inputs(beats.beats_mv, beats.fs_hz)
            for pair in itertools.combinations(sorted(set(beats.subjects.tolist())), 2):
                in_pair = np.isin(beats.subjects, pair)
                counts = np.bincount(beats.labels[in_pair], minlength=len(CLASSES))
                if counts.min() < min_beats:
                    log.warning("grid bank: %s %s has %s beats per class; left out", site.name, pair, counts)
                    continue
                tasks.append((site.name, folder, list(pair), tuple(range(len(CLASSES))), inputs[in_pair],
                              beats.labels[in_pair]))  # fmt: skip
        return _fit_bank(tasks, out, steps=steps, batch_size=batch_size, seed=seed, progress=progress,
                         card="physiopfm-grid-bank", dtype=torch.float16)  # fmt: skip


def _fit_bank(tasks: list, out: str | Path, *, steps: int, batch_size: int, seed: int, progress: bool, card: str,
              dtype: torch.dtype = torch.float32) -> Bank:  # fmt: skip
    """Fit one LoRA per sub-task ``(site, folder, subjects, classes, series (n, T), labels (n,))`` from the shared
    initialisation and write the bank (factors stored as ``dtype``)."""
    from workbench.domains.physio.task import CLASSES
    from workbench.models.physio import BACKBONE_RATE_HZ, PatchGPTFamily

    def fresh():
        return PatchGPTFamily().load(None, n_times=len(tasks[0][4][0]), n_outputs=len(CLASSES),
                                     sfreq=BACKBONE_RATE_HZ)  # fmt: skip

    model = fresh()
    fingerprint = backbone_fingerprint(model, LORA_SETTINGS["targets"])
    entries = []
    for number, (site, folder, pair, subset, series, labels) in enumerate(
        tqdm(tasks, desc="bank sub-tasks", unit="LoRA", disable=not progress)
    ):
        model = attach(fresh(), len(CLASSES))
        factors, fit_score = fit_entry(
            model, series, labels, len(CLASSES), steps=steps, batch_size=batch_size, seed=seed + number
        )
        prototypes, counts = class_prototypes(series, labels, len(CLASSES))
        classes = "".join(CLASSES[k] for k in subset)
        provenance = {
            "name": f"{site}-{'+'.join(pair)}-{classes}",
            "site": site,
            "subjects": pair,
            "classes": [CLASSES[k] for k in subset],
            "beats": int(len(labels)),
            "seed": seed + number,
            "steps": steps,
            "batch_size": batch_size,
            "series_sha256": series_sha256(series, labels),
            "record_sha256": record_hashes(folder, pair),
            "fit_balanced_accuracy": round(float(fit_score), 4),
        }
        entries.append(BankEntry(factors, prototypes, counts, provenance))
    layers = list(entries[0].factors)
    settings = {"lora": LORA_SETTINGS, "head": HEAD_SETTINGS, "backbone": fingerprint, "n_classes": len(CLASSES),
                "n_times": int(len(tasks[0][4][0])), "classes": list(CLASSES), "card": card}  # fmt: skip
    bank = Bank(entries, settings, str(out), layers)
    save_bank(bank, out, dtype=dtype)
    return bank
