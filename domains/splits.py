"""Splits by subject, shared by the domains whose samples belong to people (EEG windows, heartbeats): no subject's
samples are ever in two splits."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from workbench.core.errors import UserError
from workbench.core.task import held_out_groups


def split_subjects(subjects: Sequence[str], val_subjects: int, test_subjects: int, seed: int) -> dict[str, list[str]]:
    """Subjects shuffled with ``seed``: the first ``test_subjects`` test, the next ``val_subjects`` validation, the
    rest train (each list sorted).

    Raises:
        UserError: a count below 1, or too few subjects to keep one for training.
    """
    unique = sorted(set(subjects))
    if val_subjects < 1 or test_subjects < 1:
        raise UserError(f"--val-subjects and --test-subjects must be at least 1, got {val_subjects}, {test_subjects}")
    if len(unique) < val_subjects + test_subjects + 1:
        raise UserError(
            f"the data has {len(unique)} subject(s) ({', '.join(unique)}): holding out {val_subjects} validation and "
            f"{test_subjects} test subject(s) leaves none to train on; lower --val-subjects / --test-subjects"
        )
    order = [unique[i] for i in np.random.default_rng(seed).permutation(len(unique))]
    return {
        "train": sorted(order[test_subjects + val_subjects :]),
        "val": sorted(order[test_subjects : test_subjects + val_subjects]),
        "test": sorted(order[:test_subjects]),
    }


def held_out_subjects(
    groups: Sequence[str], split: Mapping[str, Sequence[str]], where: str, kind: str
) -> dict[str, list[str]]:
    """`workbench.core.task.held_out_groups` for the tasks that stop training early on held-out subjects (EEG, physio): the
    fold must name validation ``kind``s too (``split["val"]``); none is taken from the training ones.

    Raises:
        UserError: (naming ``where``, the data) no validation group, or any problem `held_out_groups` finds.
    """
    if not split.get("val"):
        raise UserError(
            f"{where}: the split names no validation {kind}s ('val'): this task stops training early on held-out "
            f"{kind}s, so a fold holds out 'val' {kind}s beside its 'test' ones"
        )
    return held_out_groups(groups, split, where, kind)
