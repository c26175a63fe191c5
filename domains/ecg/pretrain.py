"""Pretraining of the shipped ECG teacher on the source site of the embedded data (``workbench pretrain``).

Recipe: an ``ECGEncoder()`` (defaults, ~195k parameters) trained from scratch on site 0 (`SOURCE_SITES`) of the
embedded synthetic PTB-XL, preprocessed as the ``ptbxl`` task does (100 Hz, 1000 samples), folds 1–8 for
training and 9–10 for validation; BCE with logits, Adam/AMSGrad lr 1e-3, batch 16, EMA 0.99, plateau schedule,
early stopping on the validation loss (patience 30); the best (EMA) weights are saved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from workbench.domains.ecg.readers import SUPERCLASSES, read_embedded
from workbench.domains.ecg.task import PREPROCESSING, SOURCE_SITES, PtbXl, _samples
from workbench.models.ecg import ECGEncoder, save_ecg_model

from workbench.core.metrics import multilabel_scores
from workbench.core.trainer import Trainer, TrainSettings


def pretrain(
    out: str | Path, epochs: int = 100, seed: int = 0, device: str = "auto", quiet: bool = False, **_: Any
) -> dict[str, float]:
    """Train the teacher and write ``out`` (+ ``.json``); returns its source-validation scores."""
    device = "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    records = read_embedded(PREPROCESSING)
    source = records.subset(np.isin(records.sites, SOURCE_SITES))
    splits = source.split({"train": range(1, 9), "val": (9, 10)})
    train, val = _samples(splits["train"]), _samples(splits["val"])
    task = PtbXl()
    torch.manual_seed(seed)
    model = ECGEncoder().to(device)
    settings = TrainSettings(epochs=epochs, batch_size=16, learning_rate=1e-3, patience=30, seed=seed)
    Trainer(model, task.loss, task.collate, train, val, settings, device=device, progress=not quiet).fit()
    truth, probabilities = task._predict(model, val, torch.device(device))
    scores = multilabel_scores(truth, probabilities, np.full(len(SUPERCLASSES), 0.5), SUPERCLASSES)
    save_ecg_model(model.cpu(), out)
    return {key: round(scores[key], 3) for key in ("macro_auroc", "macro_average_precision", "macro_f1")}
