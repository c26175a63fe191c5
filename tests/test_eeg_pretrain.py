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

from workbench.core.registry import models, tasks  # noqa: E402

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


def test_the_spectrum_target_is_phase_free_and_scores_every_patch():
    """``target="spectrum"`` (the motor-imagery backbone's): the decoder predicts each patch's log-amplitude spectrum
    alone — the same for a rhythm at any phase, so the tokens must carry band power rather than waveform — and the
    loss scores the visible patches too; the ``patch`` target (samples + spectrum) changes with the phase."""
    t = torch.arange(480, dtype=torch.float64) / 160.0
    one, other = (torch.sin(2 * torch.pi * 10.0 * t + phase).expand(1, 9, 480) for phase in (0.0, 1.3))
    spectrum = MaskedPatchModel(small_encoder(), target="spectrum").double()
    patch = MaskedPatchModel(small_encoder()).double()
    assert spectrum.decoder.out_features == 81 and patch.decoder.out_features == 160 + 81
    torch.testing.assert_close(spectrum.targets(one), spectrum.targets(other))
    assert not torch.allclose(patch.targets(one), patch.targets(other))
    mask = torch.zeros(1, 27, dtype=torch.bool)
    mask[0, :3] = True
    spectrum.eval()
    with torch.no_grad():
        error = (spectrum(one, mask) - spectrum.targets(one)).pow(2).mean(dim=-1)[0]
        expected = 0.5 * (error[:3].mean() + error[3:].mean())
        torch.testing.assert_close(spectrum.loss(one, mask), expected)
    with pytest.raises(ValueError, match="target"):
        MaskedPatchModel(small_encoder(), target="phase")


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


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", ["labram_motor_spectrum.safetensors"])
def test_full_fine_tuning_reads_motor_imagery_from_the_spectrum_backbone(tmp_path, checkpoint):
    """The motor-imagery fix (card labram-benchmark-backbones, benchmarks/eeg_lbm_lora_probe.py): from the backbone
    pretrained with the phase-free ``spectrum`` target, full fine-tuning reads left vs right imagery of held-out
    generated subjects well above chance — from the shipped ``patch``-target backbone (labram_motor_small) the same
    run fits its training windows and stays at chance on the held-out ones."""
    from workbench.domains.eeg.generate import generate_motor_imagery
    from workbench.domains.eeg.motor import read_eegmmidb
    from workbench.domains.eeg.task import SENSORIMOTOR_CHANNELS, _keep_classes
    from workbench.domains.eeg.window_task import scale_windows
    from workbench.models.eeg import CHECKPOINTS, load_labram_weights

    torch.set_num_threads(1)
    root = generate_motor_imagery(tmp_path / "mi", seed=11, subjects=16, runs=(4, 8, 12), trials_per_run=16)
    windows = _keep_classes(read_eegmmidb(root, channels=SENSORIMOTOR_CHANNELS), ("left_fist", "right_fist"), "x")
    x, y = torch.as_tensor(scale_windows(windows.signals_uv, "uv100")), torch.as_tensor(windows.labels)
    test = torch.as_tensor(np.isin(windows.subjects, sorted(set(windows.subjects))[::4]))  # 4 held-out subjects
    torch.manual_seed(0)
    model = LabramClassifier(9, 2, 640, 160.0, SENSORIMOTOR_CHANNELS)
    load_labram_weights(model, CHECKPOINTS / checkpoint)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    train = torch.nonzero(~test)[:, 0]
    for _ in range(16):  # 16 epochs of 36 steps
        model.train()
        for batch in train[torch.randperm(len(train), generator=generator)].split(16):
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x[test]).argmax(1) == y[test]).float().mean())
    assert accuracy >= 0.65, accuracy
