"""Next-patch pretraining of the shipped PhysioPFM backbone on a generated physiological corpus.

    workbench pretrain --domain physio --out models/checkpoints/patch_gpt_physio.safetensors --epochs 60

(or ``python -m workbench.domains.physio.pretrain --out ...``). Corpus (`physio_corpus`), every series at
`BACKBONE_RATE_HZ` in 4 s segments, each z-scored on its own (the backbone reads shapes, not units):

- ECG of the synthetic sites' recipe (`workbench.domains.physio.generate`, seed `PRETRAIN_SEED` — other subjects
  than the embedded set's 2026), 4 sites × 6 subjects × 2 min, resampled to 250 Hz (polyphase);
- neurokit2 0.2.13: ECG (ECGSYN, 50–110 bpm), PPG (50–110 bpm), respiration (8–22 breaths/min), EDA (1–6 skin
  conductance responses a minute), 8 recordings of 60 s each;
- EEG: the Fpz-Cz and Pz-Oz channels of 4 synthetic nights (`workbench.domains.eeg.simulate_night`),
  100 Hz resampled to 250 Hz, at most 400 segments.

Objective: causal next-patch prediction, as a GPT is pretrained on text: a linear decoder maps the backbone's
output at patch t to patch t + 1, mean squared error over the segment. Optimisation: `workbench.core.trainer.Trainer`
(Adam/AMSGrad lr 1e-3, batch 64, EMA 0.99, plateau schedule, patience 15), 10 % of the segments (every tenth)
for validation. Saved: the backbone without its head, in `PatchGPT`'s key layout, the architecture and provenance
in the safetensors metadata (`workbench.models.physio.load_patch_gpt_backbone` reads it).

Shapes: segments (n, 1000) float32, z-scored; patches (n, 40, 25).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from scipy.signal import resample_poly
from torch import nn
from workbench.models.physio import BACKBONE_RATE_HZ, PatchGPT

from workbench.core.checkpoint import save_tensors
from workbench.core.device import device_of, place, resolve
from workbench.core.trainer import Trainer, TrainSettings

#: Seed of the generated corpus (the embedded sites use 2026).
PRETRAIN_SEED = 7
SEGMENT_S = 4.0


def _segments(series: np.ndarray, fs_hz: float, segment_s: float = SEGMENT_S) -> np.ndarray:
    """Consecutive z-scored segments (n, segment samples) of a series resampled from ``fs_hz`` to 250 Hz."""
    from fractions import Fraction

    ratio = Fraction(BACKBONE_RATE_HZ / fs_hz).limit_denominator(100)
    x = resample_poly(series, ratio.numerator, ratio.denominator) if ratio != 1 else np.asarray(series, float)
    n = round(segment_s * BACKBONE_RATE_HZ)
    parts = x[: len(x) // n * n].reshape(-1, n)
    sd = parts.std(axis=1, keepdims=True)
    keep = sd[:, 0] > 1e-9
    return ((parts[keep] - parts[keep].mean(axis=1, keepdims=True)) / sd[keep]).astype(np.float32)


def physio_corpus(seed: int = PRETRAIN_SEED) -> dict[str, np.ndarray]:
    """The corpus of the module docstring: modality -> segments (n, 1000) float32."""
    import neurokit2 as nk
    from workbench.domains.eeg import PSG_RATE_HZ, draw_sleep_subjects, simulate_night
    from workbench.domains.physio.generate import SITES, draw_subjects, simulate_record

    rng = np.random.default_rng(seed)
    fs = int(BACKBONE_RATE_HZ)  # neurokit2 simulates at the backbone's rate directly
    corpus: dict[str, list[np.ndarray]] = {name: [] for name in ("ecg-sites", "ecg", "ppg", "rsp", "eda", "eeg")}
    for site in SITES:
        for subject in draw_subjects(site, 6, seed):
            corpus["ecg-sites"].append(_segments(simulate_record(subject, site, seed)[0], site.fs_hz))
    for _ in range(8):
        state, heart_rate = int(rng.integers(2**31)), float(rng.uniform(50, 110))
        common = {"duration": 60, "sampling_rate": fs, "random_state": state}
        recordings = {
            "ecg": nk.ecg_simulate(heart_rate=heart_rate, **common),
            "ppg": nk.ppg_simulate(heart_rate=heart_rate, **common),
            "rsp": nk.rsp_simulate(respiratory_rate=float(rng.uniform(8, 22)), **common),
            "eda": nk.eda_simulate(scr_number=int(rng.integers(1, 7)), **common),
        }
        for name, series in recordings.items():
            corpus[name].append(_segments(series, fs))
    for subject in draw_sleep_subjects(4, seed):
        night = simulate_night(subject, seed)
        corpus["eeg"] += [_segments(night[name], PSG_RATE_HZ) for name in ("EEG Fpz-Cz", "EEG Pz-Oz")]
    out = {name: np.concatenate(parts) for name, parts in corpus.items()}
    out["eeg"] = out["eeg"][rng.permutation(len(out["eeg"]))[:400]]
    return out


class NextPatchModel(nn.Module):
    """A `PatchGPT` and a linear decoder from each patch's output to the next patch (the loss in `loss`)."""

    def __init__(self, backbone: PatchGPT):
        super().__init__()
        self.backbone = backbone
        self.decoder = nn.Linear(backbone.architecture["width"], backbone.architecture["patch_size"])

    def loss(self, segments: torch.Tensor) -> torch.Tensor:
        """Mean squared error of every patch's prediction of the next. Shapes: segments (batch, n_times)."""
        patches = segments.reshape(len(segments), -1, self.backbone.architecture["patch_size"])
        predicted = self.decoder(self.backbone.hidden(segments)[:, :-1])
        return (predicted - patches[:, 1:]).pow(2).mean()


def pretrain_patch_gpt(
    corpus: dict[str, np.ndarray],
    out: str | Path,
    *,
    epochs: int = 60,
    seed: int = 0,
    device: str | torch.device = "auto",
    progress: bool = False,
    **architecture,
) -> dict[str, float]:
    """Pretrain a fresh `PatchGPT` on the corpus' segments and write its backbone (no head) to ``out``.

    Returns the validation loss (next-patch MSE of z-scored series) before and after.
    """
    segments = np.concatenate(list(corpus.values()))
    val_mask = np.arange(len(segments)) % 10 == 0
    torch.manual_seed(seed)
    backbone = PatchGPT(n_times=segments.shape[1], n_outputs=1, sfreq=BACKBONE_RATE_HZ, **architecture)
    model = place(NextPatchModel(backbone), resolve(device))

    def loss(model: NextPatchModel, batch: torch.Tensor, training: bool) -> torch.Tensor:
        return model.loss(batch)

    def collate(rows: Sequence[np.ndarray], where: torch.device) -> torch.Tensor:
        return torch.as_tensor(np.stack(rows), device=where)

    train, val = list(segments[~val_mask]), list(segments[val_mask])

    def val_loss() -> float:
        model.eval()
        with torch.no_grad():
            return float(model.loss(collate(val, device_of(model))))

    before = val_loss()
    settings = TrainSettings(epochs=epochs, batch_size=64, learning_rate=1e-3, patience=15, seed=seed)
    Trainer(model, loss, collate, train, val, settings, progress=progress, label="physio").fit()
    after = val_loss()
    kept = {k: v for k, v in backbone.state_dict().items() if not k.startswith("head.")}
    architecture = {k: v for k, v in backbone.architecture.items() if k not in ("n_times", "n_outputs")}
    provenance = {
        "recipe": "workbench.domains.physio.pretrain (next-patch prediction)",
        "corpus": json.dumps({name: len(part) for name, part in corpus.items()}),
        "corpus_seed": str(PRETRAIN_SEED),
        "epochs": str(epochs),
        "seed": str(seed),
        "architecture": json.dumps(architecture),
        "val_next_patch_mse_before": f"{before:.4f}",
        "val_next_patch_mse_after": f"{after:.4f}",
    }
    save_tensors(out, kept, metadata=provenance)
    return {"val_next_patch_mse_before": round(before, 4), "val_next_patch_mse_after": round(after, 4)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the backbone file (.safetensors)")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    corpus = physio_corpus()
    print({name: len(part) for name, part in corpus.items()})
    print(pretrain_patch_gpt(corpus, args.out, epochs=args.epochs, seed=args.seed, progress=not args.quiet))


if __name__ == "__main__":
    main()
