"""Grouped folds of the ``rmd17`` task (trajectory blocks) and the ``medvl`` task (subjects or images): `hold_out`
puts exactly the held-out groups' samples in the test and validation splits, a bad split is refused naming the
data, and a run re-split by a fold is scored the same by `workbench.evaluate` (which re-applies the split)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("mace")
pytest.importorskip("monai")
pytest.importorskip("transformers")

from PIL import Image  # noqa: E402
from workbench.domains.atomistic.task import Rmd17  # noqa: E402
from workbench.domains.medvl.generate import generate  # noqa: E402
from workbench.domains.medvl.task import MedVLTask  # noqa: E402

import workbench  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402


@pytest.fixture(scope="module")
def rmd17_raw():
    """The embedded ethanol frames (400, one every 10 fs) in blocks of 40 (the default --fold-block)."""
    task = Rmd17()
    return task, task.read(None)


@pytest.fixture(scope="module")
def medvl_raw():
    """The embedded synthetic records: 96 training and 32 test subjects, 8 records each."""
    task = MedVLTask()
    return task, task.read(None)


# -- rmd17: trajectory blocks --------------------------------------------------------------------------------------
def test_rmd17_blocks_are_consecutive_frames_and_a_fold_holds_whole_blocks_out(rmd17_raw):
    task, raw = rmd17_raw
    assert task.split_groups(raw) == [f"block{k}" for k in range(10)]
    held = task.hold_out(raw, {"val": ["block2"], "test": ["block5", "block9"]})
    assert held.test_indices.tolist() == [*range(200, 240), *range(360, 400)]
    assert held.val_indices.tolist() == list(range(80, 120))
    assert held.train_indices.tolist() == [*range(0, 80), *range(120, 200), *range(240, 360)]
    blocks_of = {
        name: set(indices // 40)
        for name, indices in (("train", held.train_indices), ("val", held.val_indices), ("test", held.test_indices))
    }
    assert not blocks_of["test"] & (blocks_of["train"] | blocks_of["val"])
    assert held.frames is raw.frames and task.hold_out(raw, {"test": ["block0"]}).val_indices is None

    uneven = Rmd17(fold_block=64)  # 7 blocks: 6 of 64 frames, the last one holds the 16 left
    assert uneven.split_groups(raw)[-1] == "block6"
    assert uneven.hold_out(raw, {"test": ["block6"]}).test_indices.tolist() == list(range(384, 400))
    with pytest.raises(UserError, match="--fold-block must be at least 1"):
        Rmd17(fold_block=0)


def test_rmd17_fold_gap_purges_frames_next_to_test_blocks(rmd17_raw):
    """With --fold-gap G no training frame lies within G frames of a test frame (brute force over every pair), test
    and validation frames are unchanged, and training frames farther away are all kept."""
    _, raw = rmd17_raw
    split = {"val": ["block2"], "test": ["block3", "block5", "block9"]}
    plain = Rmd17().hold_out(raw, split)
    gapped = Rmd17(fold_gap=20).hold_out(raw, split)
    assert gapped.test_indices.tolist() == plain.test_indices.tolist()
    distance = np.abs(plain.train_indices[:, None] - plain.test_indices[None, :]).min(axis=1)
    assert gapped.train_indices.tolist() == plain.train_indices[distance > 20].tolist()
    assert gapped.val_indices.tolist() == plain.val_indices.tolist() == list(range(80, 120))
    # training blocks 0, 1, 4, 6, 7, 8: block4 lies between test blocks 3 and 5 (both edges: all 40 frames go), block6
    # and block8 lose the 20 frames next to test blocks 5 and 9
    assert len(gapped.train_indices) == len(plain.train_indices) - 20 * 4
    with pytest.raises(UserError, match="--fold-gap must be 0 or more"):
        Rmd17(fold_gap=-1)


@pytest.mark.parametrize(
    "split, message",
    [
        ({"test": ["block10"]}, "the test trajectory block(s) block10 of the split are not in the data"),
        ({"val": ["block1"], "test": ["block1", "block2"]}, "block1 are in both the validation and the test split"),
    ],
)
def test_rmd17_a_bad_split_is_refused_naming_the_data(rmd17_raw, split, message):
    task, raw = rmd17_raw
    with pytest.raises(UserError, match="rmd17_ethanol.npz") as error:
        task.hold_out(raw, split)
    assert message in str(error.value)


def test_an_rmd17_run_on_a_fold_is_rescored_the_same_by_evaluate(tmp_path):
    split = {"val": ["block1"], "test": ["block7"]}
    run = workbench.adapt(
        "rmd17",
        "readout",
        out=str(tmp_path / "run"),
        split=split,
        baselines=(),
        epochs=1,
        train_size=5,
        val_size=5,
        batch_size=5,
        quiet=True,
        fold_block=10,
        precision="float32",
    )
    assert run.config.split == split
    assert run.metrics["data_summary"]["frames"] == {"train": 5, "val": 5, "test": 10}
    assert workbench.evaluate(run.path, device="cpu") == pytest.approx(run.metrics["after"], rel=1e-9)


# -- medvl: subjects or images -------------------------------------------------------------------------------------
def test_medvl_a_fold_holds_out_every_record_of_its_subjects(medvl_raw):
    task, raw = medvl_raw
    groups = task.split_groups(raw)
    assert len(groups) == 128 and groups[0] == "s0001"
    test, val = ["s0003", "s0100"], ["s0050"]  # s0100 is a subject of test.json, the others of train.json
    held = task.hold_out(raw, {"val": val, "test": test})
    pooled = [s for part in raw.splits.values() for s in part]
    for name, wanted in (("test", test), ("val", val)):
        assert sorted(s.id for s in held.splits[name]) == sorted(s.id for s in pooled if s.subject in wanted)
    assert len(held.splits["test"]) == 16 and len(held.splits["val"]) == 8
    assert sum(len(part) for part in held.splits.values()) == len(pooled)
    images = {
        name: {str(p) for s in part for p in (s.image, s.target_image) if p} for name, part in held.splits.items()
    }
    assert not images["test"] & (images["train"] | images["val"])
    assert {s.subject for s in held.splits["train"]}.isdisjoint(test + val)


def test_medvl_records_sharing_an_image_are_one_group(tmp_path):
    """Records without a subject group by image; a generation record joins the group of the image it makes."""
    for name in ("a", "b", "c"):
        (tmp_path / "images").mkdir(exist_ok=True)
        pixels = (np.random.default_rng(0).random((64, 64)) * 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(tmp_path / "images" / f"{name}.png")

    def record(i: int, image: str, **more) -> dict:
        turns = [{"from": "human", "value": "<image>\nis there a lesion?"}, {"from": "gpt", "value": "yes"}]
        return {"id": f"r{i}", "image": f"images/{image}.png", "conversations": turns, **more}

    convert = [{"from": "human", "value": "<image>\nconvert the image to mr."}, {"from": "gpt", "value": "<x>"}]
    made = record(0, "a", task="modality-conversion", target_image="images/b.png", conversations=convert)
    (tmp_path / "train.json").write_text(json.dumps([made, record(1, "c")]))
    (tmp_path / "test.json").write_text(json.dumps([record(2, "b")]))
    task = MedVLTask()
    raw = task.read(str(tmp_path))
    assert task.split_groups(raw) == ["images/a.png", "images/c.png"]
    held = task.hold_out(raw, {"test": ["images/a.png"]})
    assert sorted(s.id for s in held.splits["test"]) == ["r0", "r2"] and [s.id for s in held.splits["train"]] == ["r1"]


@pytest.mark.parametrize(
    "split, message",
    [
        ({"test": ["s9999"]}, "the test subject or image(s) s9999 of the split are not in the data"),
        ({"val": ["s0001"], "test": ["s0001"]}, "s0001 are in both the validation and the test split"),
    ],
)
def test_medvl_a_bad_split_is_refused_naming_the_data(medvl_raw, split, message):
    task, raw = medvl_raw
    with pytest.raises(UserError, match="embedded") as error:
        task.hold_out(raw, split)
    assert message in str(error.value)


def test_a_medvl_run_on_a_fold_is_rescored_the_same_by_evaluate(tmp_path):
    data = tmp_path / "data"
    generate(data, seed=3, train_subjects=6, test_subjects=2)  # 8 subjects by the embedded set's generator
    split = {"val": ["s0008"], "test": ["s0003"]}  # s0008 is a subject of test.json, s0003 of train.json
    run = workbench.adapt(
        "medvl",
        "lora",
        data=str(data),
        out=str(tmp_path / "run"),
        split=split,
        baselines=(),
        epochs=1,
        train_size=16,
        val_size=8,
        batch_size=16,
        quiet=True,
        max_answer_words=4,
    )
    summary = run.metrics["data_summary"]
    assert summary["records"] == {"train": 16, "val": 8, "test": 8}
    assert summary["groups"] == {"train": 6, "val": 1, "test": 1}
    assert workbench.evaluate(run.path, device="cpu") == pytest.approx(run.metrics["after"], rel=1e-9)
