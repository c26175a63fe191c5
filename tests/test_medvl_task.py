"""The ``medvl`` task end to end: an H-LoRA run on a small generated folder (scores, the three stages, the plug-in
files, figures, the run's model answering), and the bad inputs that stop a run before its directory appears
(exit code 2 on the command line)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import cli

pytest.importorskip("monai")
pytest.importorskip("transformers")

from PIL import Image  # noqa: E402
from workbench.adaptation import lora  # noqa: E402
from workbench.adaptation.hlora import HLoRA  # noqa: E402
from workbench.domains.medvl.generate import generate  # noqa: E402
from workbench.domains.medvl.images import load_image  # noqa: E402

import workbench  # noqa: E402
from workbench.core.registry import tasks  # noqa: E402

TINY = {"epochs": 1, "train_size": 48, "val_size": 16, "batch_size": 16, "quiet": True}


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("medvl") / "data"
    generate(folder, seed=3, train_subjects=8, test_subjects=2)
    return folder


def test_an_hlora_run_trains_three_stages_and_writes_scores_plugins_and_figures(small_folder, tmp_path):
    out = tmp_path / "run"
    run = workbench.adapt("medvl", "hlora", data=str(small_folder), out=str(out), baselines=["hlora-lora"], **TINY)
    metrics = run.metrics
    for key in ("closed_accuracy", "open_recall", "report_f1", "ssim_reconstruct", "psnr_db_modality_conversion"):
        assert 0 <= metrics["after"][key] <= (1 if not key.startswith("psnr") else 100), key
    assert metrics["data_summary"]["records"]["test"] == len(json.loads((small_folder / "test.json").read_text()))
    history = json.loads((out / "results" / "hlora.json").read_text())["history"]
    assert [h["stage"] for h in history] == ["align", "embed", "adapt"]
    assert {"scores.png", "generated.png"} <= {p.name for p in out.iterdir()}
    plugins = HLoRA().prepare(tasks.get("medvl")().load_model(None))
    for name in ("comprehension", "generation"):
        lora.load_plugin(plugins, name, out / "hlora" / f"{name}.safetensors")
    trained = dict(run.model.named_parameters())
    for key, value in lora.plugin_parameters(plugins, "generation").items():
        assert (value == trained[key]).all()
    image = load_image(sorted((small_folder / "images").glob("*.png"))[0])[None]
    answers = run.model.answer(image, ["how many lesions are there?"])
    assert len(answers) == 1 and isinstance(answers[0], str)


def write_png(path: Path, size: int = 64) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = (np.random.default_rng(0).random((size, size)) * 255).astype(np.uint8)
    Image.fromarray(pixels, mode="L").save(path)
    return path.name


def llava_record(i: int, **changes) -> dict:
    record = {
        "id": f"r{i}",
        "subject": f"s{i // 2}",
        "image": f"images/{i}.png",
        "conversations": [{"from": "human", "value": "<image>\nare there any lesions?"},
                          {"from": "gpt", "value": "yes" if i % 2 else "no"}],
    }  # fmt: skip
    record.update(changes)
    return record


def llava_folder(root: Path, bad: dict | None = None, image_px: int = 64) -> Path:
    """A tiny LLaVA-layout folder: 8 train, 2 test records; ``bad`` replaces fields of the first test record."""
    for i in range(10):
        write_png(root / "images" / f"{i}.png", image_px if i == 8 else 64)
    train = [llava_record(i) for i in range(8)]
    test = [llava_record(8, **(bad or {})), llava_record(9)]
    (root / "train.json").write_text(json.dumps(train))
    (root / "test.json").write_text(json.dumps(test))
    return root


def codes_answer(index: int) -> str:
    return "<start_index>" + "".join(f"<idx_{index if k == 5 else 1}>" for k in range(64)) + "<end_index>"


BAD = {
    "unknown task type": ({"task": "segmentation"}, "task"),
    "image tokens that differ from the images": (
        {"conversations": [{"from": "human", "value": "<image>\n<image>\nsame?"}, {"from": "gpt", "value": "no"}]},
        "<image>",
    ),
    "a missing image": ({"image": "images/none.png"}, "none.png"),
    "an image token beyond the codebook": (
        {
            "task": "reconstruct",
            "conversations": [
                {"from": "human", "value": "<image>\nreconstruct the image."},
                {"from": "gpt", "value": codes_answer(9999)},
            ],
        },  # fmt: skip
        "<idx_9999> is beyond the codebook",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_records_stop_the_run_with_exit_code_2_and_no_run_directory(tmp_path, case):
    changes, message = BAD[case]
    folder = llava_folder(tmp_path / "data", changes)
    out = tmp_path / "run"
    result = cli("adapt", "--domain", "medvl", "--data", str(folder), "--quiet", "--on-bad-record", "raise",
                 "--out", str(out))  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "test.json" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_a_too_small_image_and_a_rank_the_experts_do_not_divide_are_refused(tmp_path):
    command = ["adapt", "--domain", "medvl", "--quiet", "--on-bad-record", "raise"]
    folder = llava_folder(tmp_path / "small", image_px=20)
    result = cli(*command, "--data", str(folder), "--out", str(tmp_path / "a"))
    assert result.returncode == 2 and "8.png" in result.stderr and "32" in result.stderr, result.stderr
    result = cli(*command, "--rank", "6", "--out", str(tmp_path / "b"))
    assert result.returncode == 2 and "rank 6 must be a multiple of experts 4" in result.stderr, result.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
