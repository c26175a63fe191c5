"""Masked patch reconstruction: how the shipped LaBraM foundations are made (``workbench pretrain --domain sleepedf``
and ``--domain motor-imagery``).

Paper: Jiang, Zhao & Lu, "Large Brain Model for Learning Generic Representations with Tremendous EEG Data in BCI",
ICLR 2024. LaBraM pretrains by masked EEG modelling: half of a window's channel-patches are replaced by a learned
mask token and the transformer predicts, for each masked patch, the code that its neural tokenizer (a vector-
quantised autoencoder of the patch's Fourier amplitude and phase) gives it. This recipe keeps the masking and leaves
out the tokenizer (a simplification, stated on the model card): one linear decoder maps the transformer's output at
every masked patch straight to that patch's own content,

    target(patch) = [ patch / s_time ,  log(1 + |rfft(patch)|) / s_amplitude ]     (patch_size + patch_size // 2 + 1)

where s_time and s_amplitude are the standard deviations of the two parts over the training corpus, and the loss is
the mean squared error over the masked patches only (target ``patch``, the shipped backbones'). Target ``spectrum``
keeps the log-amplitude part alone, of every patch (masked ones from their context, visible ones from themselves,
the two means weighted equally): a phase-free target, so that each token carries its patch's band power. Motor
imagery needs it: the shipped ``patch`` backbone's tokens keep waveform, full fine-tuning fits the training windows'
phases (training accuracy 1.0) and stays at chance on held-out subjects, while from a ``spectrum`` backbone it reads
the mu/beta desynchronisation (benchmarks/eeg_lbm_lora_probe.py; card labram-benchmark-backbones).

Masked patches are zeroed in the input as well, so that no statistic of the temporal convolution's GroupNorm (which
normalises over all tokens) carries them through.

Corpus: generated *source* subjects, disjoint from the embedded adaptation sets (another seed, `PRETRAIN_SEED`), read
by the task's own reader and scaled as the task scales (µV / 100): for ``sleepedf`` 20 synthetic nights
(`generate_sleep_edf`), every scored epoch of ``EEG Fpz-Cz`` and ``EEG Pz-Oz``; for ``motor-imagery`` 24 synthetic
EEGMMIDB subjects with imagery runs 4, 6, 8 and 10, every 4 s window of the 3 × 3 sensorimotor grid, rest included.
The labels are never used. The last two subjects are held out for validation (early stopping).

Optimisation: `workbench.core.trainer.Trainer` (Adam/AMSGrad, lr 1e-3, batch 32, EMA 0.99, plateau schedule, patience
20); a fresh random mask every training step (torch's generator, seeded by ``--seed``), the same masks at every
validation.

Saved: the backbone alone, in braindecode's ``Labram`` key layout, without the head ``final_layer`` (a task's
classes are its own), so it loads as any converted LaBraM state dict does (`workbench.models.eeg.load_labram_weights`,
which reports the head as freshly initialised). Provenance goes into the safetensors metadata.

Shapes:
    eeg (batch, n_chans, n_times); mask (batch, n_chans · n_patches) bool, channel-major (token c · n_patches + p is
    patch p of channel c, braindecode's order); predictions and targets (batch, n_chans · n_patches, target width).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn
from workbench.domains.eeg.readers import EegWindows
from workbench.domains.eeg.sleep_simulator import SleepCohort
from workbench.models.eeg import LabramClassifier

from workbench.core.checkpoint import save_tensors
from workbench.core.device import device_of, place, resolve
from workbench.core.trainer import Trainer, TrainSettings

#: Seed of the generated pretraining subjects (the embedded adaptation sets use 2026).
PRETRAIN_SEED = 7
#: Share of a window's channel-patches masked (LaBraM's).
MASK_RATIO = 0.5
#: Subjects of the corpus held out for validation.
VAL_SUBJECTS = 2
#: What the decoder predicts (`MaskedPatchModel`): ``patch`` each masked patch's samples and log-amplitude spectrum;
#: ``spectrum`` the log-amplitude spectrum alone, of every patch (masked ones from their context, visible ones from
#: themselves) — a phase-free target that makes each token carry its patch's band power (what motor imagery reads).
TARGETS = ("patch", "spectrum")


def random_mask(batch: int, n_tokens: int, ratio: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """A boolean mask (batch, n_tokens) with exactly ``round(ratio · n_tokens)`` True entries per row, at random."""
    scores = torch.rand(batch, n_tokens, generator=generator)
    return scores.argsort(dim=1).argsort(dim=1) < round(ratio * n_tokens)


def patch_parts(eeg: torch.Tensor, patch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(samples (batch, n_tokens, patch_size), log-amplitude spectra (batch, n_tokens, patch_size // 2 + 1)) of each
    channel-patch, channel-major."""
    batch, n_chans, n_times = eeg.shape
    patches = eeg.reshape(batch, n_chans * (n_times // patch_size), patch_size)
    return patches, torch.log1p(torch.fft.rfft(patches, dim=-1).abs())


class MaskedPatchModel(nn.Module):
    """A `LabramClassifier`'s backbone with a learned mask token and a linear patch decoder (see the module docstring).

    Args:
        encoder: the model to pretrain (its ``labram`` is what is kept).
        time_scale, amplitude_scale: s_time and s_amplitude, the corpus SDs of the two target parts.

    Shapes:
        eeg (batch, n_chans, n_times), mask (batch, n_tokens) → predictions (batch, n_tokens, patch_size +
        patch_size // 2 + 1)
    """

    def __init__(
        self, encoder: LabramClassifier, time_scale: float = 1.0, amplitude_scale: float = 1.0, target: str = "patch"
    ):
        super().__init__()
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        self.encoder = encoder
        self.target = target
        self.patch_size = encoder.architecture["patch_size"]
        self.n_patches = encoder.architecture["n_times"] // self.patch_size
        width = encoder.labram.cls_token.shape[-1]
        self.mask_token = nn.Parameter(nn.init.trunc_normal_(torch.empty(width), std=0.02))
        samples = self.patch_size if target == "patch" else 0
        self.decoder = nn.Linear(width, samples + self.patch_size // 2 + 1)
        self.register_buffer("scales", torch.tensor([float(time_scale), float(amplitude_scale)]))

    def forward(self, eeg: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, n_chans, n_times = eeg.shape
        kept = ~mask.view(batch, n_chans, self.n_patches, 1)
        hidden = (eeg.view(batch, n_chans, self.n_patches, self.patch_size) * kept).view(batch, n_chans, n_times)

        def with_mask_tokens(module, inputs, tokens):
            return torch.where(mask[..., None], self.mask_token.to(tokens.dtype), tokens)

        labram = self.encoder.labram
        handle = labram.patch_embed.register_forward_hook(with_mask_tokens)
        try:
            tokens = labram.forward_features(hidden, input_chans=self.encoder.input_chans, return_patch_tokens=True)
        finally:
            handle.remove()
        return self.decoder(tokens)

    def targets(self, eeg: torch.Tensor) -> torch.Tensor:
        """Each channel-patch's scaled samples (``patch`` target only) and log-amplitude spectrum (batch, n_tokens,
        target width)."""
        samples, amplitude = patch_parts(eeg, self.patch_size)
        if self.target == "spectrum":
            return amplitude / self.scales[1]
        return torch.cat([samples / self.scales[0], amplitude / self.scales[1]], dim=-1)

    def loss(self, eeg: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean squared error of the predictions over the masked patches (``patch``), or over every patch with the
        masked and the visible ones weighted equally (``spectrum``)."""
        error = (self(eeg, mask) - self.targets(eeg)).pow(2).mean(dim=-1)
        if self.target == "spectrum":
            return 0.5 * (error[mask].mean() + error[~mask].mean())
        return error[mask].mean()


@dataclass(frozen=True)
class Corpus:
    """Unlabelled windows for pretraining: train and validation signals (n, n_chans, n_times), model inputs scaled
    by ``scaling`` (`workbench.domains.eeg.window_task.scale_windows`)."""

    train: np.ndarray
    val: np.ndarray
    windows: EegWindows
    description: str
    scaling: str


def _corpus(windows: EegWindows, scaling: str, description: str) -> Corpus:
    from workbench.domains.eeg.window_task import scale_windows

    signals = scale_windows(windows.signals_uv, scaling)
    subjects = sorted(set(windows.subjects.tolist()))
    val = np.isin(windows.subjects, subjects[-VAL_SUBJECTS:])
    return Corpus(signals[~val], signals[val], windows, description, scaling)


def sleep_corpus(
    work: Path, scaling: str, subjects: int = 20, progress: bool = False, cohort: SleepCohort | None = None
) -> Corpus:
    """20 generated nights (seed `PRETRAIN_SEED`; ``cohort``: their configuration, default the embedded set's) read
    as the ``sleepedf`` task reads Sleep-EDF."""
    from workbench.domains.eeg.generate import generate_sleep_edf
    from workbench.domains.eeg.sleep_simulator import DEFAULT_SLEEP_COHORT
    from workbench.domains.eeg.sleepedf import SLEEP_EDF_CHANNELS, read_sleep_edf

    cohort = cohort or DEFAULT_SLEEP_COHORT
    root = generate_sleep_edf(work / "sleep", seed=PRETRAIN_SEED, subjects=subjects, cohort=cohort, progress=progress)
    windows = read_sleep_edf(root, channels=SLEEP_EDF_CHANNELS, on_error="raise")
    text = f"{subjects} generated Sleep-EDF nights (seed {PRETRAIN_SEED}), {len(windows)} epochs of 30 s"
    if cohort != DEFAULT_SLEEP_COHORT:
        text += f", generator configuration {cohort}"
    return _corpus(windows, scaling, text)


def motor_corpus(
    work: Path,
    scaling: str,
    subjects: int = 24,
    progress: bool = False,
    runs: Sequence[int] = (4, 6, 8, 10),
    trials_per_run: int = 6,
    difficulty: float | None = None,
) -> Corpus:
    """24 generated EEGMMIDB subjects (seed `PRETRAIN_SEED`, imagery runs 4, 6, 8, 10 of 6 trials, the generator's
    default difficulty unless given), every window incl. rest."""
    from workbench.domains.eeg.generate import generate_motor_imagery
    from workbench.domains.eeg.motor import read_eegmmidb
    from workbench.domains.eeg.motor_simulator import DEFAULT_DIFFICULTY
    from workbench.domains.eeg.task import SENSORIMOTOR_CHANNELS

    difficulty = DEFAULT_DIFFICULTY if difficulty is None else difficulty
    root = generate_motor_imagery(
        work / "motor",
        seed=PRETRAIN_SEED,
        subjects=subjects,
        runs=runs,
        trials_per_run=trials_per_run,
        difficulty=difficulty,
        progress=progress,
    )
    windows = read_eegmmidb(root, rest=True, channels=SENSORIMOTOR_CHANNELS, on_error="raise")
    text = f"{subjects} generated EEGMMIDB subjects (seed {PRETRAIN_SEED}), {len(windows)} windows of 4 s"
    if (tuple(runs), trials_per_run, difficulty) != ((4, 6, 8, 10), 6, DEFAULT_DIFFICULTY):
        text += f" (runs {tuple(runs)} of {trials_per_run} trials, difficulty {difficulty})"
    return _corpus(windows, scaling, text)


def pretrain_labram(
    corpus: Corpus,
    out: str | Path,
    channel_map: dict[str, str] | None,
    *,
    epochs: int = 200,
    seed: int = 0,
    device: str | torch.device = "auto",
    progress: bool = False,
    label: str = "pretrain",
    target: str = "patch",
    **architecture: Any,
) -> dict[str, float]:
    """Pretrain a fresh `LabramClassifier` of the corpus' sizes and write its backbone to ``out``; ``target`` is the
    decoder's (`TARGETS`).

    Returns the validation loss of the masked patches before and after (the fresh model's and the saved one's).
    """
    windows = corpus.windows
    torch.manual_seed(seed)
    encoder = LabramClassifier(
        windows.n_chans,
        len(windows.classes),
        windows.n_times,
        windows.sfreq,
        windows.ch_names,
        channel_map=channel_map,
        **architecture,
    )
    patch_size = encoder.architecture["patch_size"]
    samples, amplitude = patch_parts(torch.as_tensor(corpus.train), patch_size)
    model = place(MaskedPatchModel(encoder, float(samples.std()), float(amplitude.std()), target), resolve(device))

    def loss(model: MaskedPatchModel, batch: torch.Tensor, training: bool) -> torch.Tensor:
        generator = None if training else torch.Generator().manual_seed(seed)
        mask = random_mask(len(batch), model.n_patches * batch.shape[1], MASK_RATIO, generator)
        return model.loss(batch, mask.to(batch.device))

    def collate(signals: Sequence[np.ndarray], where: torch.device) -> torch.Tensor:
        return torch.as_tensor(np.stack(signals), device=where)

    val = list(corpus.val)

    def val_loss() -> float:
        model.eval()
        with torch.no_grad():
            return float(loss(model, collate(val, device_of(model)), False))

    before = val_loss()
    settings = TrainSettings(epochs=epochs, batch_size=32, learning_rate=1e-3, patience=20, seed=seed)
    Trainer(
        model, loss, collate, list(corpus.train), val, settings, progress=progress, label=label
    ).fit()
    after = val_loss()
    backbone = {k: v for k, v in encoder.labram.state_dict().items() if not k.startswith("final_layer.")}
    provenance = {
        "recipe": "workbench.domains.eeg.pretrain (masked patch reconstruction)",
        "corpus": corpus.description,
        "scaling": corpus.scaling,
        "epochs": str(epochs),
        "seed": str(seed),
        "target": target,
        "architecture": json.dumps({k: v for k, v in encoder.architecture.items() if k != "n_outputs"}),
        "val_masked_mse_before": f"{before:.4f}",
        "val_masked_mse_after": f"{after:.4f}",
    }
    save_tensors(out, backbone, metadata=provenance)
    return {"val_masked_mse_before": round(before, 4), "val_masked_mse_after": round(after, 4)}


def pretrain(
    task_name: str,
    out: str | Path,
    *,
    scaling: str,
    channel_map: dict[str, str] | None,
    epochs: int = 200,
    seed: int = 0,
    device: str = "auto",
    quiet: bool = False,
) -> dict[str, float]:
    """``workbench pretrain --domain sleepedf|motor-imagery``: generate the corpus in a temporary folder, pretrain,
    write ``out``."""
    read = {"sleepedf": sleep_corpus, "motor-imagery": motor_corpus}[task_name]
    with tempfile.TemporaryDirectory() as work:
        corpus = read(Path(work), scaling, progress=not quiet)
    return pretrain_labram(
        corpus, out, channel_map, epochs=epochs, seed=seed, device=device, progress=not quiet, label=task_name
    )
