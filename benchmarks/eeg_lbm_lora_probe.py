"""Why LaBraM read motor imagery at chance while ShallowFBCSPNet read it (benchmark eeg_lbm_lora_motor): the
measurement, on the benchmark's 30-subject motor-imagery cohort (left vs right fist, 9 sensorimotor channels).

1. Where the information is (frozen models, logistic regression on standardised features, 3 subject folds — every
   third subject tested): log mu (8–13 Hz) and beta (16–26 Hz) band power of each channel (Welch, 1-s segments: the
   ceiling of a band-power reader, what ShallowFBCSPNet's square-pool-log computes); and for each backbone the CLS
   token the head reads, the mean patch token of each channel, and the log energy of each channel's patch-embedding
   tokens (before the transformer).
2. What fine-tuning does with it (test = subjects 0, 3, 6, … of the sorted list; the others train): full
   fine-tuning, Adam lr 1e-3 (the task's), batch 16, 10 epochs, seed 0, from each backbone: training and test
   accuracy after epochs 5 and 10.

Backbones: the task's shipped one (``labram_motor_small``, masked patch reconstruction with the ``patch`` target:
samples + log-amplitude spectrum of each masked patch), the benchmark's (``labram_motor_spectrum``, the ``spectrum``
target: the log-amplitude spectrum of every patch, no phase), and a fresh LaBraM (probes only).

    python benchmarks/eeg_lbm_lora_probe.py      # ≈ 10 min of one CPU core; writes results/eeg_lbm_lora_probe.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workbench.models.eeg as eeg_models  # noqa: E402  (imports braindecode the workbench's way)
from eeg_lbm_lora import HERE, cohort  # noqa: E402

from workbench.core.checkpoint import write_json  # noqa: E402

CHECKPOINTS = {
    "shipped (patch target)": eeg_models.CHECKPOINTS / "labram_motor_small.safetensors",
    "benchmark (spectrum target)": eeg_models.CHECKPOINTS / "labram_motor_spectrum.safetensors",
    "fresh": None,
}
BANDS_HZ = {"mu": (8.0, 13.0), "beta": (16.0, 26.0)}


def windows(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """(µV windows (n, 9, 640), model inputs (µV / 100), labels, subjects, channels) of the left/right fists."""
    from workbench.domains.eeg.motor import read_eegmmidb
    from workbench.domains.eeg.task import SENSORIMOTOR_CHANNELS, _keep_classes
    from workbench.domains.eeg.window_task import scale_windows

    read = read_eegmmidb(root, channels=SENSORIMOTOR_CHANNELS, on_error="raise")
    read = _keep_classes(read, ("left_fist", "right_fist"), "other class")
    inputs = scale_windows(read.signals_uv, "uv100")
    return read.signals_uv, inputs, read.labels, np.asarray(read.subjects), read.ch_names


def cross_subject_accuracy(features: np.ndarray, labels: np.ndarray, subjects: np.ndarray) -> float:
    """Mean test accuracy of standardised logistic regression over 3 folds of every third subject."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    names = sorted(set(subjects))
    scores = []
    for fold in range(3):
        test = np.isin(subjects, names[fold::3])
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
        clf.fit(features[~test], labels[~test])
        scores.append(float((clf.predict(features[test]) == labels[test]).mean()))
    return round(float(np.mean(scores)), 4)


def backbone(name: str, channels) -> eeg_models.LabramClassifier:
    torch.manual_seed(0)
    model = eeg_models.LabramClassifier(9, 2, 640, 160.0, list(channels))
    if CHECKPOINTS[name] is not None:
        eeg_models.load_labram_weights(model, CHECKPOINTS[name])
    return model


def frozen_features(model: eeg_models.LabramClassifier, x: np.ndarray) -> dict[str, np.ndarray]:
    """CLS token (n, 80), mean patch token per channel (n, 9 · 80), log energy of each channel's patch embedding
    (n, 9)."""
    model.eval()
    parts = {"CLS token": [], "mean patch token per channel": [], "patch-embedding log energy per channel": []}
    with torch.no_grad():
        for start in range(0, len(x), 64):
            batch = torch.as_tensor(x[start : start + 64])
            n = len(batch)
            parts["CLS token"].append(model.features(batch).numpy())
            tokens = model.labram.forward_features(batch, input_chans=model.input_chans, return_patch_tokens=True)
            parts["mean patch token per channel"].append(tokens.reshape(n, 9, 4, -1).mean(2).reshape(n, -1).numpy())
            embedded = model.labram.patch_embed(batch).reshape(n, 9, 4, -1)
            parts["patch-embedding log energy per channel"].append(torch.log(embedded.pow(2).mean((2, 3))).numpy())
    return {key: np.concatenate(value) for key, value in parts.items()}


def fine_tune(model: torch.nn.Module, x, y, subjects, epochs: int = 10) -> list[dict[str, float]]:
    """Full fine-tuning on the training subjects; accuracies after epochs 5 and 10."""
    names = sorted(set(subjects))
    test = np.isin(subjects, names[0::3])
    x_train, y_train = torch.as_tensor(x[~test]), torch.as_tensor(y[~test])
    x_test, y_test = torch.as_tensor(x[test]), torch.as_tensor(y[test])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)

    def accuracy(inputs, labels) -> float:
        model.eval()
        with torch.no_grad():
            return round(float((model(inputs).argmax(1) == labels).float().mean()), 4)

    rows = []
    for epoch in range(1, epochs + 1):
        model.train()
        order, losses = torch.randperm(len(x_train), generator=generator), []
        for start in range(0, len(order), 16):
            batch = order[start : start + 16]
            loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
        if epoch % 5 == 0:
            rows.append(
                {
                    "epoch": epoch,
                    "steps": epoch * -(-len(order) // 16),
                    "train_loss": round(float(np.mean(losses)), 4),
                    "train_accuracy": accuracy(x_train, y_train),
                    "test_accuracy": accuracy(x_test, y_test),
                }
            )
    return rows


def main() -> None:
    from scipy.signal import welch

    torch.set_num_threads(1)
    os.chdir(HERE.parent)
    started = time.time()
    root = cohort("motor-imagery")
    signals_uv, x, y, subjects, channels = windows(root)
    f, power = welch(signals_uv, fs=160, nperseg=160, axis=-1)
    band_power = np.concatenate(
        [np.log(power[..., (f >= low) & (f <= high)].mean(-1)) for low, high in BANDS_HZ.values()], axis=1
    )
    probes = {"log mu and beta band power per channel": cross_subject_accuracy(band_power, y, subjects)}
    for name in CHECKPOINTS:
        features = frozen_features(backbone(name, channels), x)
        probes |= {f"{name}: {key}": cross_subject_accuracy(value, y, subjects) for key, value in features.items()}
    print(json.dumps(probes, indent=1), flush=True)
    tuned = {name: fine_tune(backbone(name, channels), x, y, subjects) for name in CHECKPOINTS if CHECKPOINTS[name]}
    print(json.dumps(tuned, indent=1))
    write_json(
        HERE / "results" / "eeg_lbm_lora_probe.json",
        {
            "script": "eeg_lbm_lora_probe.py",
            "data": str(root),
            "windows": len(y),
            "subjects": len(set(subjects)),
            "frozen_probe_accuracy": probes,
            "full_fine_tuning": tuned,
            "seconds": round(time.time() - started),
        },
    )


if __name__ == "__main__":
    main()
