"""Train/test splits of a file's frames when its publisher gives none (``--frame-split``).

Frames of one MD trajectory are correlated in time: at MD17's 0.5 fs steps, neighbouring frames are within 0.035 Å
of each other. A random split puts test frames next to near-copies that were trained on, and its errors measure
interpolation along the trajectory, not the model. By default (``auto``: ``blocks`` for time-ordered frames) the
frames, in time order, are cut into contiguous blocks of ``--frame-block`` frames (default: half the frames, so the
first half trains and the second tests), blocks alternating train, test, train, ...; training frames within
``--frame-gap`` frames of a test frame are left out (a purge: set it to the trajectory's correlation time, a few
hundred frames at MD17's 0.5 fs; by default 20 frames, 200 fs on the embedded data, at most a quarter of a block).
``random`` draws half the frames for testing (seeded), as before; on time-ordered frames its results are labelled
optimistic.

Time order is the file's frame order for npz trajectories (sGDML's MD17 / MD22, an rMD17 npz without its
``splits/`` folder); for files ase reads, the frames' ``time`` or ``step`` field where every frame has one (ase's
extxyz ``info``, an ase database row's key-value pairs). A file without one is taken as independent configurations
and split at random unless ``--frame-split blocks`` is given (then in the file's order).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from workbench.core.errors import UserError

log = logging.getLogger(__name__)

#: ``--frame-split`` values: contiguous blocks in time order with a purge gap, or a random half; ``auto``: blocks for
#: time-ordered frames, random for the others.
FRAME_SPLITS = ("auto", "blocks", "random")
#: ``--frame-gap`` by default (-1, "auto") [frames]: the embedded data's correlation time (200 fs), at most a quarter
#: of a block (a short file keeps training frames).
AUTO_GAP = 20

#: The frame fields that give a frame's place in time (extxyz ``info``, ase database key-value pairs).
TIME_FIELDS = ("time", "step", "md_step", "timestep")
#: What a console table's title says of a random split of time-ordered frames (`TaskData.summary` ``caveat``).
RANDOM_CAVEAT = "random split: optimistic (near-duplicate neighbouring frames)"


@dataclass(frozen=True)
class FrameSplit:
    """How to split frames that come without a split: ``kind`` in `FRAME_SPLITS`, ``block`` frames per block (0:
    half the frames), ``gap`` frames purged from training on each side of a test block (-1: `AUTO_GAP`, at most a
    quarter of a block), ``seed`` for ``random``."""

    kind: str = "auto"
    block: int = 0
    gap: int = -1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in FRAME_SPLITS:
            raise UserError(f"--frame-split {self.kind}: choose one of {', '.join(FRAME_SPLITS)}")
        if self.block < 0 or self.gap < -1:
            raise UserError(f"--frame-block must be 0 or more frames and --frame-gap -1 (auto) or more, got "
                            f"{self.block}, {self.gap}")  # fmt: skip


def frames_beyond_gap(n_frames: int, test: np.ndarray, gap: int) -> np.ndarray:
    """Indices of the ``n_frames`` frames more than ``gap`` frames away from every frame index in ``test``, shape
    (n_kept,), ascending (test frames themselves are never kept; ``gap`` 0 keeps every other frame)."""
    frames = np.arange(n_frames)
    if len(test) == 0:
        return frames
    test = np.sort(test)
    right = np.searchsorted(test, frames).clip(max=len(test) - 1)
    left = (right - 1).clip(min=0)
    nearest = np.minimum(np.abs(frames - test[left]), np.abs(frames - test[right]))
    return frames[nearest > gap]


def time_order(steps: Sequence[Any]) -> tuple[np.ndarray, str] | None:
    """(frame indices in time order, what gave it) from each frame's (field, value) of a `TIME_FIELDS` field, or
    None where a frame has none (or the frames disagree on the field)."""
    if not steps or any(step is None for step in steps) or len({field for field, _ in steps}) != 1:
        return None
    values = np.array([float(value) for _, value in steps])
    return np.argsort(values, kind="stable"), f"the frames' '{steps[0][0]}' field"


def split_frames(
    n_frames: int, path: Path, how: FrameSplit, order: np.ndarray | None, ordered_by: str
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(training indices, test indices, the split's record for ``metrics.json``) of ``n_frames`` frames of ``path``.

    ``order``: the frames in time order (None: not time-ordered: ``auto`` is then ``random``, and ``blocks``
    follows the file's order); ``ordered_by``: what gave that order (the record and the log say it).

    Raises:
        UserError: too few frames for a split, or a purge that leaves no training frame (naming --frame-gap).
    """
    if n_frames < 4:
        raise UserError(f"{path}: {n_frames} usable frames are too few to split into train and test")
    timed = order is not None
    if how.kind == "random" or (how.kind == "auto" and not timed):
        shuffled = np.random.default_rng(how.seed).permutation(n_frames)
        half = n_frames // 2
        train, test = np.sort(shuffled[:half]), np.sort(shuffled[half:])
        record = {"kind": "random", "seed": how.seed, "time_ordered": timed}
        if timed:
            record["caveat"] = RANDOM_CAVEAT
        why = f"; {RANDOM_CAVEAT}" if timed else f" (no frame has a {'/'.join(TIME_FIELDS)} field: not time-ordered)"
        log.warning("%s has no split: %d frames for training and %d for testing, at random (seed %d)%s", path,
                    len(train), len(test), how.seed, why)  # fmt: skip
        return train, test, record
    order = np.arange(n_frames) if order is None else np.asarray(order)
    block = how.block or -(-n_frames // 2)
    gap = how.gap if how.gap >= 0 else min(AUTO_GAP, block // 4)
    place = np.arange(n_frames)  # position in time order
    test_places = place[(place // block) % 2 == 1]
    train_places = frames_beyond_gap(n_frames, test_places, gap)
    if len(test_places) == 0 or len(train_places) < 2:
        raise UserError(
            f"{path}: {n_frames} frames in blocks of {block} with a {gap}-frame purge leave "
            f"{len(train_places)} training and {len(test_places)} test frames; lower --frame-gap or --frame-block "
            "(or --frame-split random)"
        )
    purged = n_frames - len(test_places) - len(train_places)
    record = {"kind": "blocks", "block_frames": block, "gap_frames": gap, "order": ordered_by,
              "train_frames": len(train_places), "test_frames": len(test_places), "purged_frames": purged}  # fmt: skip
    log.warning(
        "%s has no split: in %s, blocks of %d frames alternate train and test (%d test frames), and the %d training "
        "frames within %d frames of a test frame are left out (a purge; %d train): --frame-block, --frame-gap; "
        "--frame-split random for a random split", path, ordered_by, block, len(test_places), purged, gap,
        len(train_places),
    )  # fmt: skip
    return np.sort(order[train_places]), np.sort(order[test_places]), record
