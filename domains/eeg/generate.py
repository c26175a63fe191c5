"""Synthetic EEG written as real EDF files in Sleep-EDF's and EEGMMIDB's layouts (cards sleep-edf-synthetic,
motor-imagery-synthetic); the signals come from `workbench.domains.eeg.sleep_simulator` and
`workbench.domains.eeg.motor_simulator`.

Files (edfio, EDF/EDF+; physical unit µV for EEG, EOG and EMG): ``sleep-cassette/SC4ssNE0-PSG.edf`` (plain EDF,
30 s data records: 3000 samples of each 100 Hz channel, 30 of each 1 Hz channel) + ``SC4ssNx-Hypnogram.edf``
(annotation-only EDF+, runs of equal stages merged, as the real files); ``Sss/SsssRrr.edf`` (EDF+ at 160 Hz,
1 s data records, T0 rest 4.2 s and T1/T2 imagery 4.1 s alternating). Each folder gets a ``generator.json``
(seed, versions, per-subject recipes) and is written beside its destination and moved in at the end (atomic).
Deterministic: the same seed and recipes write the same bytes (the simulators' seeding).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tqdm import tqdm
from workbench.domains.eeg.motor_simulator import (
    DEFAULT_DIFFICULTY,
    MI_RATE_HZ,
    MotorImagerySubject,
    draw_motor_imagery_subjects,
    simulate_run,
)
from workbench.domains.eeg.sleep_simulator import (
    DEFAULT_SLEEP_COHORT,
    EPOCH_S,
    STAGE_TEXT,
    SleepCohort,
    SleepSubject,
    draw_sleep_subjects,
    simulate_night,
)

from workbench.core.checkpoint import atomic_folder
from workbench.core.errors import UserError

# ---------------------------------------------------------------- sleep (Sleep-EDF Expanded, sleep cassette)

#: The sleep-cassette PSG channels: label -> (rate [Hz], physical dimension, physical range).
PSG_CHANNELS: dict[str, tuple[int, str, tuple[float, float]]] = {
    "EEG Fpz-Cz": (100, "uV", (-500.0, 500.0)),
    "EEG Pz-Oz": (100, "uV", (-500.0, 500.0)),
    "EOG horizontal": (100, "uV", (-1000.0, 1000.0)),
    "Resp oro-nasal": (1, "", (-2048.0, 2047.0)),
    "EMG submental": (1, "uV", (-5.0, 500.0)),
    "Temp rectal": (1, "DegC", (34.0, 40.0)),
    "Event marker": (1, "", (-2048.0, 2047.0)),
}


def _hypnogram_annotations(hypnogram: str):
    """Runs of equal stages as one annotation each (onset, duration [s], text), as the real hypnograms."""
    import edfio

    annotations, start = [], 0
    for k in range(1, len(hypnogram) + 1):
        if k == len(hypnogram) or hypnogram[k] != hypnogram[start]:
            text = STAGE_TEXT[hypnogram[start]]
            annotations.append(edfio.EdfAnnotation(start * EPOCH_S, (k - start) * EPOCH_S, text))
            start = k
    return annotations


def _write_night(folder: Path, subject: SleepSubject, seed: int) -> None:
    import edfio

    signals = simulate_night(subject, seed)
    stem = f"SC4{subject.subject:02d}{subject.night}"
    date, time = datetime.date.fromisoformat(subject.start[0]), datetime.time.fromisoformat(subject.start[1])
    edf_signals = []
    for label, (rate, unit, physical_range) in PSG_CHANNELS.items():
        data = np.clip(signals[label], *physical_range)  # the amplifier saturates at its range
        edf_signals.append(
            edfio.EdfSignal(data, rate, label=label, physical_dimension=unit, physical_range=physical_range)
        )
    patient = edfio.Patient(code=stem)
    psg = edfio.Edf(
        edf_signals,
        patient=patient,
        recording=edfio.Recording(startdate=date),
        starttime=time,
        data_record_duration=EPOCH_S,
    )
    psg.write(folder / f"{stem}E0-PSG.edf")
    hypnogram = edfio.Edf(
        [],
        patient=patient,
        recording=edfio.Recording(startdate=date),
        starttime=time,
        annotations=_hypnogram_annotations(subject.hypnogram),
    )
    hypnogram.write(folder / f"{stem}E{subject.scorer}-Hypnogram.edf")


def generate_sleep_edf(
    out_dir: str | Path,
    *,
    seed: int = 2026,
    subjects: int | Sequence[SleepSubject] = 6,
    cohort: SleepCohort = DEFAULT_SLEEP_COHORT,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write the synthetic sleep set in Sleep-EDF's sleep-cassette layout to ``out_dir`` and return it.

    Args:
        out_dir: the folder to create (``sleep-cassette/SC4ssNE0-PSG.edf`` + ``SC4ssNx-Hypnogram.edf`` per
            subject, ``generator.json``).
        seed: the one seed of every random choice.
        subjects: a number of subjects (recipes from `draw_sleep_subjects`; 6: ≈ 2.2 MB) or the recipes
            themselves (e.g. those of a ``generator.json``; a subject's signals depend only on seed and recipe).
        cohort: how a number of subjects is drawn (`SleepCohort`; default the embedded set's); recorded in
            ``generator.json`` (null when ``subjects`` are recipes).
        overwrite: replace an existing ``out_dir``.
        progress: show a progress bar.
    """
    import edfio
    import scipy

    drawn = isinstance(subjects, int)
    recipes = draw_sleep_subjects(subjects, seed, cohort) if drawn else tuple(subjects)
    for recipe in recipes:
        if set(recipe.hypnogram) - set(STAGE_TEXT):
            raise UserError(f"subject {recipe.subject}: hypnogram letters must be among {''.join(STAGE_TEXT)}")
    recipe_json = {
        "generator": "workbench.domains.eeg.generate.generate_sleep_edf",
        "seed": seed,
        "cohort": asdict(cohort) if drawn else None,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "edfio": edfio.__version__,
        "subjects": [asdict(recipe) for recipe in recipes],
    }
    with atomic_folder(out_dir, overwrite) as work:
        (work / "sleep-cassette").mkdir()
        for recipe in tqdm(recipes, desc="synthetic nights", unit="subject", disable=not progress):
            _write_night(work / "sleep-cassette", recipe, seed)
        (work / "generator.json").write_text(json.dumps(recipe_json, indent=2) + "\n")
    return Path(out_dir)


def sleep_subjects_from_json(path: str | Path) -> tuple[int, tuple[SleepSubject, ...]]:
    """The seed and subject recipes of a sleep set's ``generator.json`` (to regenerate it or part of it)."""
    recipe = json.loads(Path(path).read_text())
    subjects = []
    for s in recipe["subjects"]:
        gains = {"channel_gains": tuple(s["channel_gains"])} if "channel_gains" in s else {}
        subjects.append(SleepSubject(**dict(s, start=tuple(s["start"]), **gains)))
    return recipe["seed"], tuple(subjects)


# ---------------------------------------------------------------- motor imagery (PhysioNet EEGMMIDB)

#: The written subset of EEGMMIDB's 64 channels (their spelling and order): the 3 × 3 grid around C3, Cz, C4.
MI_CHANNELS = ("Fc3.", "Fcz.", "Fc4.", "C3..", "Cz..", "C4..", "Cp3.", "Cpz.", "Cp4.")
MI_PHYSICAL_RANGE_UV = (-1000.0, 1000.0)


def _write_run(folder: Path, subject: MotorImagerySubject, run: int, seed: int) -> None:
    import edfio

    eeg, annotations = simulate_run(subject, run, seed)
    start = datetime.datetime.fromisoformat(" ".join(subject.start)) + datetime.timedelta(minutes=3 * run)
    signals = [
        edfio.EdfSignal(
            np.clip(x, *MI_PHYSICAL_RANGE_UV),
            MI_RATE_HZ,
            label=label,
            physical_dimension="uV",
            physical_range=MI_PHYSICAL_RANGE_UV,
        )
        for label, x in zip(MI_CHANNELS, eeg)
    ]
    edf = edfio.Edf(
        signals,
        patient=edfio.Patient(code=f"S{subject.subject:03d}"),
        recording=edfio.Recording(startdate=start.date()),
        starttime=start.time(),
        data_record_duration=1,
        annotations=[edfio.EdfAnnotation(onset, duration, text) for onset, duration, text in annotations],
    )
    edf.write(folder / f"S{subject.subject:03d}R{run:02d}.edf")


def generate_motor_imagery(
    out_dir: str | Path,
    *,
    seed: int = 2026,
    subjects: int | Sequence[MotorImagerySubject] = 8,
    runs: Sequence[int] = (4, 6),
    trials_per_run: int = 6,
    difficulty: float = DEFAULT_DIFFICULTY,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write the synthetic motor-imagery set in EEGMMIDB's layout to ``out_dir`` and return it.

    Args:
        out_dir: the folder to create (``S001/S001R04.edf`` …, ``generator.json``).
        seed: the one seed of every random choice.
        subjects: a number of subjects (recipes from `draw_motor_imagery_subjects` with ``runs``,
            ``trials_per_run`` and ``difficulty``; 8 × runs 4, 6 × 6 trials: ≈ 2.3 MB) or the recipes themselves
            (then those three arguments are not used).
        runs: imagery runs per subject (4/8/12: left vs right fist; 6/10/14: both fists vs both feet).
        trials_per_run: imagery trials per run, even (EEGMMIDB's runs have 15; 6 keeps the shipped set small).
        difficulty: 0 (deep ERD, little noise) … 1 (shallow ERD, much noise); see the module docstring.
        overwrite: replace an existing ``out_dir``.
        progress: show a progress bar.
    """
    import edfio
    import scipy

    if isinstance(subjects, int):
        recipes = draw_motor_imagery_subjects(
            subjects, seed, runs=runs, trials_per_run=trials_per_run, difficulty=difficulty
        )
    else:
        recipes = tuple(subjects)
    recipe_json = {
        "generator": "workbench.domains.eeg.generate.generate_motor_imagery",
        "seed": seed,
        "difficulty": difficulty if isinstance(subjects, int) else None,
        "channels": list(MI_CHANNELS),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "edfio": edfio.__version__,
        "subjects": [asdict(recipe) for recipe in recipes],
    }
    with atomic_folder(out_dir, overwrite) as work:
        jobs = [(recipe, run) for recipe in recipes for run in recipe.runs]
        for recipe, run in tqdm(jobs, desc="synthetic imagery runs", unit="run", disable=not progress):
            folder = work / f"S{recipe.subject:03d}"
            folder.mkdir(exist_ok=True)
            _write_run(folder, recipe, run, seed)
        (work / "generator.json").write_text(json.dumps(recipe_json, indent=2) + "\n")
    return Path(out_dir)


def motor_imagery_subjects_from_json(path: str | Path) -> tuple[int, tuple[MotorImagerySubject, ...]]:
    """The seed and subject recipes of a motor-imagery set's ``generator.json``."""
    recipe = json.loads(Path(path).read_text())
    subjects = tuple(
        MotorImagerySubject(**dict(s, runs=tuple(s["runs"]), start=tuple(s["start"]))) for s in recipe["subjects"]
    )
    return recipe["seed"], subjects
