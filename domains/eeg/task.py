"""The EEG tasks: ``sleepedf`` (5-stage sleep staging) and ``motor-imagery`` (left vs right fist, or four classes).

The situation they model (GitHub issue 11): a sleep lab or a BCI group adapts a brainwave foundation model
(braindecode's ``Labram``, model ``labram``) to its own recordings with LoRA, and compares it with full fine-tuning,
head-only tuning and the small classic nets trained from scratch (``full@eegnet``, ``full@shallow``), on honest
subject-wise numbers.

Data (every layout read through MNE by `workbench.domains.eeg`, checked against its data card):

- ``sleepedf``: Sleep-EDF Expanded, sleep-cassette layout (``SC4ssNE0-PSG.edf`` + ``SC4ssNx-Hypnogram.edf``, card
  ``sleep-edf``); 30 s epochs of ``EEG Fpz-Cz`` and ``EEG Pz-Oz`` at 100 Hz, classes W, N1, N2, N3, REM. Default:
  the embedded synthetic nights of 6 subjects (card ``sleep-edf-synthetic``).
- ``motor-imagery``: PhysioNet EEGMMIDB (``S001/S001R04.edf``, card ``eegmmidb``), BCI Competition IV 2a GDF
  (``A01T.gdf``) or its BNCI ``.mat`` files (``A01T.mat``, card ``bci-iv-2a``), told apart by the files present;
  ``--class-set left-right`` (default) keeps the left and right hand/fist trials, ``all`` the four imagery
  classes. Default: the embedded synthetic EEGMMIDB imagery runs of 8 subjects, 9 sensorimotor channels at
  160 Hz, 4 s windows (card ``motor-imagery-synthetic``).

Model: with no ``--model``, the task's shipped LaBraM backbone (pretrained here by masked patch reconstruction on
generated source subjects, `workbench.domains.eeg.pretrain`; cards ``labram-sleepedf-small`` and
``labram-motor-small``) with a fresh head for the data's classes; ``--model labram`` is a fresh, untrained LaBraM,
``--model PATH`` a workbench or converted LaBraM checkpoint (matched / missing / unexpected tensors go into
``data_summary.model_load``).

LoRA: the ``lora`` method runs in the brainwave-LoRA study's setting (seed 001, `LBM_LORA`): ``conv`` and ``qkv``
adapted together, rank 8, alpha 8, dropout 0.5 on the adapters' input, conv ranks by the power-of-2 rule; any of
these flags given on the command line wins (``--targets conv,fc``, ``--dropout 0``).

Splits are by subject: the subjects are shuffled with ``--seed`` and ``--test-subjects`` (default 1) and
``--val-subjects`` (default 1) of them held out; every other subject trains. The subjects of each split go into
``metrics.json`` (``data_summary.split``); no window of a held-out subject is ever trained on. For data of too few
subjects (one EEGMMIDB subject's runs), ``--split-by record`` holds out whole records (runs, nights) instead, the
two counts then counting records: a within-subject, cross-record score, not a cross-subject one.

Grouped folds (``workbench compare``, `EegTask.hold_out`): a fold holds out what the split holds out whole — subjects,
or records with ``--split-by record`` (`EegTask.group_kind`) — and replaces the seeded split: the fold's ``test``
subjects (records) are scored, its ``val`` ones are the validation split (early stopping, the best epoch) and every
other one trains. A fold must name validation subjects: none is taken from the training ones.

Bad records (a file MNE cannot read, an EDF whose size is not what its header says, a hypnogram of another night, a
missing channel, ...) are skipped into ``task.skipped`` (with how many records were looked at) or raised, as
``--on-bad-record`` says, in `read` and `info` alike.

Inputs (`scale_windows`): ``--scaling uv100`` (default) divides the µV signals by 100 (units of 0.1 mV), what the
LaBraM authors' fine-tuning code feeds the model (``samples / 100`` in their ``engine_for_finetuning.py``;
braindecode's ``Labram`` takes any scale) and what keeps absolute amplitude, which sleep staging reads (N3 is
defined by slow waves above 75 µV); ``--scaling zscore`` standardises each channel of each window (mean 0, SD 1),
which removes amplitude differences between amplifiers and subjects and with them that information.

Loss: cross-entropy over the classes; ``--balanced-loss`` weights each class by the inverse of its training
frequency (normalised to a mean weight of 1 over the windows).

Metrics (test split, higher is better): ``balanced_accuracy`` (headline), ``cohen_kappa``, ``macro_f1`` (over the
classes present in the test split), ``accuracy``, and per class ``f1_<class>`` (for sleep ``f1_W`` ... ``f1_REM``;
0 for a class absent from the test split and never predicted).

Shapes:
    a sample's ``signal`` (n_chans, n_times) float32 (scaled, see above); a batch (signals (batch, n_chans,
    n_times) float32, labels (batch,) int64); model output (batch, n_classes) logits.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from workbench.domains.eeg.motor import (
    BCI2A_CHANNELS,
    BCI2A_CLASSES,
    BCI2A_RENAME,
    EEGMMIDB_CHANNELS,
    EEGMMIDB_CLASSES,
    read_bci_iv_2a,
    read_bnci_2a_mat,
    read_eegmmidb,
)
from workbench.domains.eeg.readers import EegWindows
from workbench.domains.eeg.sleepedf import SLEEP_CLASSES, SLEEP_EDF_CHANNELS, read_sleep_edf
from workbench.domains.eeg.window_task import EegData, EegTask
from workbench.models.eeg import CHECKPOINTS

from workbench.core.errors import UserError
from workbench.core.options import Option
from workbench.core.registry import tasks
from workbench.core.task import Evaluation

EMBEDDED = Path(__file__).resolve().parent / "embedded"
EMBEDDED_SLEEP = EMBEDDED / "sleep-edf"
EMBEDDED_MOTOR = EMBEDDED / "eegmmidb"
#: The channels of the embedded motor-imagery set (the 3 x 3 sensorimotor grid), also the default for EEGMMIDB.
SENSORIMOTOR_CHANNELS: tuple[str, ...] = ("FC3", "FCz", "FC4", "C3", "Cz", "C4", "CP3", "CPz", "CP4")
#: Sleep-EDF's bipolar derivations -> the 10-20 electrode whose position a channel-aware model (Labram's
#: position embedding) uses for them: the first electrode of each pair (an explicit, reported approximation).
SLEEP_CHANNEL_MAP: dict[str, str] = {"EEG Fpz-Cz": "FPZ", "EEG Pz-Oz": "PZ"}
#: ``--class-set`` -> the classes kept, per layout.
CLASS_SETS = {
    "left-right": {"eegmmidb": ("left_fist", "right_fist"), "bci-iv-2a": ("left_hand", "right_hand")},
    "all": {"eegmmidb": EEGMMIDB_CLASSES, "bci-iv-2a": BCI2A_CLASSES},
}


@tasks.register
class SleepEdf(EegTask):
    """Five-stage sleep staging (W, N1, N2, N3, REM) on 30 s epochs of Fpz-Cz and Pz-Oz, Sleep-EDF layout."""

    name = "sleepedf"
    pretrained = CHECKPOINTS / "labram_sleepedf_small.safetensors"
    description = "Sleep staging (W/N1/N2/N3/REM) from EEG Fpz-Cz + Pz-Oz, 30 s epochs; Sleep-EDF cassette layout"
    card = "sleep-edf-synthetic"
    channel_map = SLEEP_CHANNEL_MAP
    reads = ("sleep-edf",)
    metrics = ("balanced_accuracy", "cohen_kappa", "macro_f1", "accuracy") + tuple(f"f1_{c}" for c in SLEEP_CLASSES)
    examples = (
        "workbench adapt --domain sleepedf                       # LoRA on Labram + full, readout, EEGNet, Shallow",
        "workbench adapt --domain sleepedf --targets conv,fc --rank 4   # LoRA on other target groups",
        "workbench adapt --domain sleepedf --data ~/sleep-edfx/sleep-cassette --test-subjects 10 --val-subjects 10",
        "workbench predict --run runs/sleep --input psg_folder/ --output stages.csv",
        "workbench data generate sleepedf --out my_nights --subjects 10",
    )
    options = EegTask.shared_options + (
        Option(
            "wake_margin_min",
            float,
            30.0,
            "keep wake epochs only within this many minutes of the sleep period (-1: keep every wake epoch)",
        ),
    )
    generate_options = (Option("subjects", int, 6, "subjects (one night each) of the generated set"),)

    def default_data(self, seed: int) -> Path:
        """The embedded folder of synthetic nights."""
        return EMBEDDED_SLEEP

    def _read_windows(self, data: str | Path | None) -> EegData:
        embedded = data is None
        root = EMBEDDED_SLEEP if embedded else Path(data)
        if not root.exists():
            raise UserError(f"{root}: no such folder (give --data a folder of SC4ssNE0-PSG.edf + hypnogram pairs)")
        allowed, resample_to = self._rates("sleep-edf")
        margin = self.config["wake_margin_min"]
        windows = read_sleep_edf(
            root,
            channels=SLEEP_EDF_CHANNELS,
            wake_margin_min=None if margin < 0 else margin,
            allowed_sfreqs=allowed,
            resample_to=resample_to,
            on_error=self.config["on_bad_record"],
        )
        self._class_names = windows.classes
        what = "embedded synthetic Sleep-EDF nights" if embedded else f"Sleep-EDF cassette layout at {root}"
        return EegData(windows, {}, str(root), what, {}, dict(SLEEP_CHANNEL_MAP))

    def figures(self, evaluations: Mapping[str, Evaluation], out_dir: Path) -> list[tuple[str, str]]:
        from workbench.domains.eeg import plots

        return super().figures(evaluations, out_dir) + [plots.hypnograms(evaluations, SLEEP_CLASSES, out_dir)]

    def generate(self, out: Path, seed: int | None = None, subjects: int = 6) -> str:
        """Synthetic nights in Sleep-EDF's sleep-cassette layout (`generate_sleep_edf`, card sleep-edf-synthetic)."""
        from workbench.domains.eeg.generate import generate_sleep_edf

        if subjects < 1:
            raise UserError(f"--subjects must be at least 1, got {subjects}")
        generate_sleep_edf(out, seed=2026 if seed is None else seed, subjects=subjects, progress=self.progress)
        return f"wrote {subjects} synthetic night(s) in Sleep-EDF's layout to {out} (read with --data {out})"


_GDF = re.compile(r"^A\d\d[TE]\.gdf$", re.IGNORECASE)
_MAT = re.compile(r"^A\d\d[TE]\.mat$", re.IGNORECASE)
_EEGMMIDB = re.compile(r"^S\d{3}R\d{2}\.edf$", re.IGNORECASE)


@tasks.register
class MotorImagery(EegTask):
    """Motor imagery: left vs right fist/hand (or four classes), EEGMMIDB or BCI Competition IV 2a layouts."""

    name = "motor-imagery"
    pretrained = CHECKPOINTS / "labram_motor_small.safetensors"
    description = "Motor imagery (left vs right fist, or 4 classes); EEGMMIDB, BCI IV 2a GDF or BNCI .mat layouts"
    card = "motor-imagery-synthetic"
    reads = ("eegmmidb", "bci-iv-2a")
    metrics = ("balanced_accuracy", "cohen_kappa", "macro_f1", "accuracy")
    examples = (
        "workbench adapt --domain motor-imagery                  # left vs right fist, LoRA + 4 baselines",
        "workbench adapt --domain motor-imagery --class-set all --model labram   # 4 classes, a fresh LaBraM",
        "workbench adapt --domain motor-imagery --data ~/BCICIV_2a_gdf --test-subjects 2",
        "workbench data generate motor-imagery --out my_mi --subjects 20 --difficulty 0.5",
    )
    options = EegTask.shared_options + (
        Option(
            "class_set",
            str,
            "left-right",
            "classes: left vs right fist/hand, or all four imagery classes of the layout",
            choices=tuple(CLASS_SETS),
        ),
        Option(
            "channels",
            str,
            "",
            "comma-separated 10-20 channels of the model ('' : the 3x3 sensorimotor grid for EEGMMIDB, the 22 of BCI "
            "IV 2a; 'all': every channel of the layout)",
        ),
        Option("interpolate_channels", bool, False, "interpolate missing 10-20 channels (logged) instead of refusing"),
    )
    generate_options = (
        Option("subjects", int, 8, "subjects of the generated set"),
        Option("runs", str, "4,6", "imagery runs per subject (4/8/12: left vs right fist; 6/10/14: fists vs feet)"),
        Option("trials_per_run", int, 6, "imagery trials per run (even)"),
        Option("difficulty", float, 0.35, "0 (deep desynchronisation, little noise) ... 1 (shallow, much noise)"),
    )

    def default_data(self, seed: int) -> Path:
        """The embedded folder of synthetic EEGMMIDB runs."""
        return EMBEDDED_MOTOR

    def _layout(self, root: Path) -> str:
        """'bci-iv-2a-gdf', 'bci-iv-2a-mat' or 'eegmmidb', by the files present under ``root``."""
        names = [path.name for path in root.rglob("*")] if root.is_dir() else [root.name]
        if any(_GDF.match(name) for name in names):
            return "bci-iv-2a-gdf"
        if any(_MAT.match(name) for name in names):
            return "bci-iv-2a-mat"
        if any(_EEGMMIDB.match(name) for name in names):
            return "eegmmidb"
        raise UserError(
            f"{root}: no motor-imagery layout found: expected EEGMMIDB (S001/S001R04.edf), BCI Competition IV 2a GDF "
            "(A01T.gdf, A01E.gdf + A01E.mat) or BNCI 001-2014 (A01T.mat, A01E.mat) files"
        )

    def _channels(self, layout: str, embedded: bool) -> tuple[str, ...]:
        text = self.config["channels"].strip()
        everything = BCI2A_CHANNELS if layout.startswith("bci") else EEGMMIDB_CHANNELS
        if text == "all":
            return SENSORIMOTOR_CHANNELS if embedded else everything
        if text:
            return tuple(name.strip() for name in text.split(",") if name.strip())
        return BCI2A_CHANNELS if layout.startswith("bci") else SENSORIMOTOR_CHANNELS

    def _read_windows(self, data: str | Path | None) -> EegData:
        embedded = data is None
        root = EMBEDDED_MOTOR if embedded else Path(data)
        if not root.exists():
            raise UserError(f"{root}: no such folder (give --data an EEGMMIDB or BCI IV 2a folder)")
        layout = "eegmmidb" if embedded else self._layout(root)
        channels = self._channels(layout, embedded)
        card = "bci-iv-2a" if layout.startswith("bci") else "eegmmidb"
        allowed, resample_to = self._rates(card)
        common = {
            "channels": channels,
            "allowed_sfreqs": allowed,
            "resample_to": resample_to,
            "allow_interpolation": self.config["interpolate_channels"],
            "on_error": self.config["on_bad_record"],
        }
        reader = {"bci-iv-2a-gdf": read_bci_iv_2a, "bci-iv-2a-mat": read_bnci_2a_mat}.get(layout, read_eegmmidb)
        windows = reader(root, **common)
        kept = CLASS_SETS[self.config["class_set"]][card]
        windows = _keep_classes(windows, kept, f"class outside --class-set {self.config['class_set']}")
        self._class_names = windows.classes
        what = {
            "eegmmidb": "EEGMMIDB imagery runs",
            "bci-iv-2a-gdf": "BCI Competition IV 2a GDF",
            "bci-iv-2a-mat": "BCI IV 2a, BNCI .mat",
        }[layout]
        description = f"embedded synthetic {what}" if embedded else f"{what} at {root}"
        rename = BCI2A_RENAME if layout == "bci-iv-2a-gdf" else {}
        return EegData(windows, {}, str(root), f"{description}, classes {', '.join(kept)}", dict(rename), None)

    def generate(
        self,
        out: Path,
        seed: int | None = None,
        subjects: int = 8,
        runs: str = "4,6",
        trials_per_run: int = 6,
        difficulty: float = 0.35,
    ) -> str:
        """Synthetic imagery runs in EEGMMIDB's layout (`generate_motor_imagery`, card motor-imagery-synthetic)."""
        from workbench.domains.eeg.generate import generate_motor_imagery

        try:
            run_numbers = tuple(int(run) for run in runs.split(",") if run.strip())
        except ValueError:
            raise UserError(f"--runs {runs!r}: expected comma-separated run numbers, e.g. 4,6") from None
        generate_motor_imagery(
            out,
            seed=2026 if seed is None else seed,
            subjects=subjects,
            runs=run_numbers,
            trials_per_run=trials_per_run,
            difficulty=difficulty,
            progress=self.progress,
        )
        return f"wrote {subjects} subject(s) of synthetic imagery runs in EEGMMIDB's layout to {out}"


def _keep_classes(windows: EegWindows, kept: Sequence[str], reason: str) -> EegWindows:
    """The windows of the classes ``kept`` (numbered in that order); the others are counted under ``reason``."""
    index = [windows.classes.index(name) for name in kept]
    mask = np.isin(windows.labels, index)
    if not mask.any():
        raise UserError(f"{windows.source}: no window of the classes {', '.join(kept)}")
    subset = windows.subset(mask)
    excluded = dict(windows.excluded)
    if (~mask).sum():
        excluded[reason] = int((~mask).sum())
    relabel = np.array([index.index(label) for label in subset.labels], np.int64)
    return replace(subset, labels=relabel, classes=tuple(kept), excluded=excluded)
