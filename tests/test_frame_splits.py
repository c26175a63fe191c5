"""Default splits of frames that come without one (`workbench.domains.atomistic.trajectory`): a time-ordered file is
split in contiguous blocks with a purge gap; a random split only when asked, and then labelled optimistic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mace")
import ase.io  # noqa: E402
from conftest import EMBEDDED_RMD17  # noqa: E402
from workbench.domains.atomistic.task import Rmd17  # noqa: E402
from workbench.domains.atomistic.trajectory import RANDOM_CAVEAT, FrameSplit, split_frames  # noqa: E402

from workbench.core.errors import UserError  # noqa: E402
from workbench.run import report  # noqa: E402

#: Real MD17 ethanol files (tests/data/real/atomistic/README.md); the npz: 300 frames 0.5 fs apart, sGDML's layout.
REAL = Path(__file__).parent / "data" / "real" / "atomistic"
REAL_MD17_NPZ = REAL / "md17_ethanol_first300.npz"


@pytest.fixture
def trajectory_npz(tmp_path):
    """A user's npz in rMD17's layout without its splits/ folder: the first 300 embedded ethanol frames, in order."""
    with np.load(EMBEDDED_RMD17 / "npz_data" / "rmd17_ethanol.npz") as data:
        arrays = {key: data[key][:300] if key != "nuclear_charges" else data[key] for key in data.files}
    path = tmp_path / "rmd17_ethanol_first300.npz"
    np.savez(path, **arrays)
    return path


def _nearest(a: np.ndarray, b: np.ndarray) -> int:
    """Fewest frames between a frame of ``a`` and one of ``b`` (brute force)."""
    return int(np.abs(a[:, None] - b[None, :]).min())


def test_a_time_ordered_npz_is_split_in_contiguous_blocks_with_a_purge_gap(trajectory_npz, caplog):
    with caplog.at_level("WARNING"):
        raw = Rmd17().read(trajectory_npz)
    train, test = raw.train_indices, raw.test_indices
    assert list(test) == list(range(150, 300))  # default block: half the frames; the second half tests
    assert _nearest(train, test) > 20 and list(train) == list(range(0, 130))  # the 20 frames before it purged
    assert raw.split == {"kind": "blocks", "block_frames": 150, "gap_frames": 20, "order": "the file's frame order",
                         "train_frames": 130, "test_frames": 150, "purged_frames": 20}  # fmt: skip
    assert "blocks of 150 frames" in caplog.text and "within 20 frames of a test frame" in caplog.text
    smaller = Rmd17(frame_block=50, frame_gap=10).read(trajectory_npz)
    assert _nearest(smaller.train_indices, smaller.test_indices) > 10
    assert set(smaller.test_indices) == {i for i in range(300) if (i // 50) % 2 == 1}
    assert len(smaller.train_indices) == 150 - 10 - 2 * 2 * 10  # block 0 loses 10, blocks 2 and 4 lose 10 each side


def test_a_random_split_only_when_asked_and_labelled(trajectory_npz, caplog):
    with caplog.at_level("WARNING"):
        raw = Rmd17(frame_split="random").read(trajectory_npz, seed=3)
    assert raw.split == {"kind": "random", "seed": 3, "time_ordered": True, "caveat": RANDOM_CAVEAT}
    assert len(raw.train_indices) == len(raw.test_indices) == 150 and _nearest(raw.train_indices, raw.test_indices) == 1
    assert "at random (seed 3); random split: optimistic" in caplog.text
    metrics = {"task": "rmd17", "method": "elora", "samples": {"train": 50, "val": 10, "test": 150},
               "before": {"mae": 2.0}, "after": {"mae": 1.0}, "baselines": {}, "costs": {"elora": None},
               "data_summary": {"caveat": RANDOM_CAVEAT}}  # fmt: skip
    metrics["costs"]["elora"] = {"trainable_parameters": 1, "seconds_per_epoch": 0.1, "training_step_bytes": None,
                                 "epochs": 1}  # fmt: skip
    title = report.table(metrics, ("mae",), "elora").splitlines()[0]
    assert title.endswith("; random split: optimistic (near-duplicate neighbouring frames)")


def test_the_published_sgdml_trajectory_is_split_in_blocks_and_rmd17_keeps_its_own_splits(tiny_rmd17):
    raw = Rmd17().read(REAL_MD17_NPZ)
    assert raw.split["kind"] == "blocks" and _nearest(raw.train_indices, raw.test_indices) > 20
    kept = Rmd17().read(tiny_rmd17)
    assert kept.split["kind"] == "the publisher's" and list(kept.test_indices) == list(range(40, 60))


def _frames(steps):
    """The 60 real MD17 ethanol extxyz frames (kcal/mol), each with its ``step`` (None: none), in the order given."""
    frames = ase.io.read(REAL / "ethanol_sampledata_first60.xyz", index=":")
    for atoms, step in zip(frames, steps):
        if step is not None:
            atoms.info["step"] = step
    return frames


def test_extxyz_with_a_step_field_is_ordered_by_it_and_one_without_is_split_at_random(tmp_path):
    steps = [*range(30, 60), *range(0, 30)]  # the file lists the later half first
    frames = _frames(range(60))
    ase.io.write(tmp_path / "md.xyz", frames[30:] + frames[:30], format="extxyz")
    raw = Rmd17(frame_gap=2, units="kcal/mol").read(tmp_path / "md.xyz")
    assert sorted(steps[i] for i in raw.test_indices) == list(range(30, 60))
    assert sorted(steps[i] for i in raw.train_indices) == list(range(0, 28))
    assert raw.split["order"] == "the frames' 'step' field"
    ase.io.write(tmp_path / "configs.xyz", _frames([None] * 60), format="extxyz")
    random = Rmd17(units="kcal/mol").read(tmp_path / "configs.xyz")
    assert random.split == {"kind": "random", "seed": 0, "time_ordered": False}  # independent configurations
    asked = Rmd17(frame_split="blocks", frame_gap=0, units="kcal/mol").read(tmp_path / "configs.xyz")
    assert list(asked.test_indices) == list(range(30, 60)) and asked.split["order"] == "the file's frame order"


def test_the_default_gap_is_at_most_a_quarter_of_a_block():
    train, test, record = split_frames(12, Path("short.npz"), FrameSplit(), np.arange(12), "the file's frame order")
    assert list(test) == list(range(6, 12)) and list(train) == list(range(0, 5)) and record["gap_frames"] == 1


def test_a_purge_that_leaves_no_training_frame_names_the_option(tmp_path):
    with pytest.raises(UserError, match="lower --frame-gap"):
        split_frames(30, tmp_path / "x.npz", FrameSplit(gap=20), np.arange(30), "the file's frame order")
    with pytest.raises(UserError, match="shuffled"):
        Rmd17(frame_split="shuffled")


def test_the_run_records_the_split_and_the_options_are_flags(trajectory_npz, tmp_path, capsys):
    from workbench.cli import run

    code = run(["adapt", "--domain", "rmd17", "--data", str(trajectory_npz), "--frame-split", "random", "--method",
                "readout", "--baselines", "", "--epochs", "1", "--train-size", "5", "--val-size", "2",
                "--out", str(tmp_path / "run")])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    labelled = "; random split: optimistic (near-duplicate neighbouring frames)"
    assert any(line.endswith(labelled) for line in out.splitlines())
    summary = json.loads((tmp_path / "run" / "metrics.json").read_text())["data_summary"]
    assert summary["split"] == {"kind": "random", "seed": 0, "time_ordered": True}
    assert summary["caveat"] == RANDOM_CAVEAT
    assert "frame_split: random" in (tmp_path / "run" / "config.yaml").read_text()
    assert f"**Caveat: {RANDOM_CAVEAT}.**" in (tmp_path / "run" / "report.md").read_text()


def test_an_ase_database_with_a_step_per_row_is_split_in_time(tmp_path):
    """schnetpack's 20 real MD17 rows (labels in row data, kcal/mol), each given a ``step`` key-value pair in reverse
    order: the rows with the later steps are the test frames."""
    import ase.db

    source = ase.db.connect(REAL / "test_ethanol.db")
    with ase.db.connect(tmp_path / "md.db") as target:
        for index, row in enumerate(source.select()):
            target.write(row.toatoms(), key_value_pairs={"step": 19 - index}, data=dict(row.data))
    raw = Rmd17(frame_gap=1, units="kcal/mol").read(tmp_path / "md.db")
    assert raw.split["order"] == "the frames' 'step' field" and sorted(raw.test_indices) == list(range(0, 10))
    assert sorted(raw.train_indices) == list(range(11, 20))  # step 9 (row 10) purged
