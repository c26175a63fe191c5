"""Masked patch reconstruction (workbench.domains.eeg.pretrain) and the shipped LaBraM backbones it made: masks,
patch order, that masked patches cannot leak into the predictions, that pretraining lowers the masked loss, and
that the EEG tasks adapt the shipped backbones by default (a fresh model, with a warning, at another rate)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

pytest.importorskip("braindecode")
pytest.importorskip("edfio")

from safetensors import safe_open  # noqa: E402
from workbench.domains.eeg.pretrain import (  # noqa: E402
    MaskedPatchModel,
    _corpus,
    patch_parts,
    pretrain_labram,
    random_mask,
)
from workbench.domains.eeg.sleepedf import SLEEP_EDF_CHANNELS, read_sleep_edf  # noqa: E402
from workbench.domains.eeg.task import EMBEDDED_SLEEP, SLEEP_CHANNEL_MAP  # noqa: E402
from workbench.models.eeg import LabramClassifier  # noqa: E402

from workbench.registry import models, tasks  # noqa: E402

MOTOR_9 = ["FC3", "FCz", "FC4", "C3", "Cz", "C4", "CP3", "CPz", "CP4"]


def small_encoder(n_times=480, sfreq=160.0) -> LabramClassifier:
    torch.manual_seed(0)
    return LabramClassifier(9, 2, n_times, sfreq, MOTOR_9, num_layers=1)


def test_random_mask_hides_exactly_the_ratio_in_every_row():
    mask = random_mask(50, 27, 0.5, torch.Generator().manual_seed(0))
    assert mask.shape == (50, 27) and mask.dtype == torch.bool
    assert (mask.sum(dim=1) == 14).all()  # round(13.5) = 14 (Python rounds half to even)
    assert len({tuple(row.tolist()) for row in mask}) > 40  # the rows are drawn independently


def test_patch_parts_are_channel_major_and_their_spectrum_is_the_patch_fft():
    x = torch.randn(2, 9, 480, dtype=torch.float64)
    samples, amplitude = patch_parts(x, 160)
    assert samples.shape == (2, 27, 160) and amplitude.shape == (2, 27, 81)
    torch.testing.assert_close(samples[1, 2 * 3 + 1], x[1, 2, 160:320])  # token c · n_patches + p
    expected = np.log1p(np.abs(np.fft.rfft(x[1, 2, 160:320].numpy())))
    np.testing.assert_allclose(amplitude[1, 7].numpy(), expected, rtol=1e-12)


def test_masked_patches_cannot_reach_the_predictions_and_visible_ones_do():
    model = MaskedPatchModel(small_encoder()).double().eval()
    x = torch.randn(3, 9, 480, dtype=torch.float64)
    mask = random_mask(3, 27, 0.5, torch.Generator().manual_seed(1))
    prediction = model(x, mask)
    assert prediction.shape == (3, 27, 160 + 81)
    token = int(torch.nonzero(mask[0])[0])
    channel, patch = divmod(token, 3)
    changed = x.clone()
    changed[0, channel, patch * 160 : (patch + 1) * 160] += 50.0  # a masked patch: invisible to the model
    torch.testing.assert_close(model(changed, mask), prediction, rtol=0, atol=0)
    visible = int(torch.nonzero(~mask[0])[0])
    channel, patch = divmod(visible, 3)
    changed[0, channel, patch * 160 : (patch + 1) * 160] += 50.0
    assert not torch.allclose(model(changed, mask), prediction)
    assert model.encoder.labram.patch_embed._forward_hooks == {}  # the mask hook never outlives a call


def test_pretraining_lowers_the_masked_loss_and_saves_a_headless_backbone(tmp_path):
    windows = read_sleep_edf(EMBEDDED_SLEEP, channels=SLEEP_EDF_CHANNELS, on_error="raise")
    corpus = _corpus(windows, "uv100", "embedded nights")
    out = tmp_path / "backbone.safetensors"
    scores = pretrain_labram(corpus, out, dict(SLEEP_CHANNEL_MAP), epochs=4, num_layers=1)
    assert scores["val_masked_mse_after"] < scores["val_masked_mse_before"]
    with safe_open(str(out), "pt") as handle:
        assert not [k for k in handle.keys() if k.startswith("final_layer.")]
        assert json.loads(handle.metadata()["architecture"])["sfreq"] == 100.0
        assert handle.metadata()["scaling"] == "uv100"
    sizes = {"n_chans": 2, "n_outputs": 5, "n_times": 3000, "sfreq": 100.0,
             "chs_info": [{"ch_name": n} for n in SLEEP_EDF_CHANNELS]}  # fmt: skip
    model = models.get("labram")().load(out, channel_map=dict(SLEEP_CHANNEL_MAP), **sizes)
    assert model.architecture["num_layers"] == 1  # read from the file
    assert model.load_report.missing == ("final_layer.weight", "final_layer.bias") and not model.load_report.unexpected


@pytest.mark.parametrize("name, rate", [("sleepedf", 100.0), ("motor-imagery", 160.0)])
def test_the_tasks_adapt_their_shipped_backbone_unless_told_otherwise(name, rate, caplog):
    task = tasks.get(name)()
    task.progress = False
    raw = task.read(None, 0)
    with safe_open(str(task.pretrained), "pt") as handle:
        assert json.loads(handle.metadata()["architecture"])["sfreq"] == rate
        assert handle.metadata()["scaling"] == "uv100"  # the task's default input units
    model = task.load_model(None)
    report = model.load_report
    assert report.source == str(task.pretrained) and report.missing == ("final_layer.weight", "final_layer.bias")
    assert not report.unexpected and len(report.matched) > 50
    data, _ = task.prepare(model, raw, 10_000, 10_000, 0)
    assert data.summary["model_load"]["matched"] == len(report.matched)
    assert not hasattr(task.load_model("labram"), "load_report")  # --model labram: a fresh LaBraM
    assert task.model_files(None) == [task.pretrained]
    with caplog.at_level(logging.WARNING):
        assert task._shipped_backbone(250.0) is None
    assert "a fresh, untrained LaBraM" in caplog.text
