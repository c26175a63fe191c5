"""Next-patch pretraining of the PhysioPFM backbone (workbench.domains.physio.pretrain) and the shipped backbone:
segments, the loss, that pretraining lowers it, and how a headless backbone loads into a model of a task's sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("neurokit2")

from safetensors import safe_open  # noqa: E402
from workbench.domains.physio.pretrain import NextPatchModel, _segments, pretrain_patch_gpt  # noqa: E402
from workbench.models.physio import SHIPPED_BACKBONE, PatchGPT  # noqa: E402

from workbench.core.checkpoint import load_tensors, save_tensors  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.core.registry import models  # noqa: E402


def test_segments_are_resampled_to_250_hz_and_z_scored():
    t = np.arange(0, 20, 1 / 360)
    segments = _segments(np.sin(2 * np.pi * 7.0 * t), 360.0)
    assert segments.shape == (5, 1000)  # 20 s at 250 Hz in 4 s segments
    np.testing.assert_allclose(segments.mean(axis=1), 0, atol=1e-5)
    np.testing.assert_allclose(segments.std(axis=1), 1, rtol=1e-4)
    spectrum = np.abs(np.fft.rfft(segments[2]))
    assert np.fft.rfftfreq(1000, 1 / 250)[np.argmax(spectrum)] == pytest.approx(7.0, abs=0.25)
    assert len(_segments(np.zeros(2000), 250.0)) == 0  # a flat series has no shape to learn


def test_next_patch_loss_is_the_mse_of_each_patch_predicting_the_next():
    torch.manual_seed(0)
    model = NextPatchModel(PatchGPT(n_times=250, n_outputs=1, sfreq=250.0, n_layers=1)).double().eval()
    x = torch.randn(3, 250, dtype=torch.float64)
    hidden = model.backbone.hidden(x)
    patches = x.view(3, 10, 25)
    expected = ((model.decoder(hidden[:, :9]) - patches[:, 1:]) ** 2).mean()
    torch.testing.assert_close(model.loss(x), expected, rtol=0, atol=1e-12)


def test_pretraining_lowers_the_loss_and_the_backbone_loads_with_a_fresh_head(tmp_path):
    rng = np.random.default_rng(0)
    t = np.arange(1000) / 250
    series = [np.sin(2 * np.pi * rng.uniform(1, 8) * t + rng.uniform(0, 6)) for _ in range(96)]
    corpus = {"sines": np.stack([(s - s.mean()) / s.std() for s in series]).astype(np.float32)}
    out = tmp_path / "backbone.safetensors"
    scores = pretrain_patch_gpt(corpus, out, epochs=4, n_layers=1, width=32)
    assert scores["val_next_patch_mse_after"] < scores["val_next_patch_mse_before"]
    with safe_open(str(out), "pt") as handle:
        assert not [k for k in handle.keys() if k.startswith("head.")]
        assert json.loads(handle.metadata()["architecture"])["n_layers"] == 1
    family = models.get("patch-gpt")()
    model = family.load(out, n_times=175, n_outputs=5, sfreq=250.0)
    assert model.architecture["width"] == 32 and model.head.out_features == 5
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, load_tensors(out)["blocks.0.attn.qkv.weight"])
    with pytest.raises(UserError, match="pretrained on series at 250 Hz, the data is at 360 Hz"):
        family.load(out, n_times=175, n_outputs=5, sfreq=360.0)
    with pytest.raises(UserError, match="no options"):
        family.load(out, n_times=175, n_outputs=5, sfreq=250.0, width=64)
    broken = tmp_path / "broken.safetensors"
    with safe_open(str(out), "pt") as handle:
        metadata = handle.metadata()
    save_tensors(broken, {**load_tensors(out), "extra.weight": torch.zeros(2)}, metadata=metadata)
    with pytest.raises(UserError, match=r"do not match a patch-gpt backbone \(unexpected \['extra.weight'\]"):
        family.load(broken, n_times=175, n_outputs=5, sfreq=250.0)


def test_the_shipped_backbone_is_the_default():
    with safe_open(str(SHIPPED_BACKBONE), "pt") as handle:
        metadata = handle.metadata()
    assert json.loads(metadata["architecture"])["n_layers"] == 6  # PhysioPFM's depth
    assert float(metadata["val_next_patch_mse_after"]) < float(metadata["val_next_patch_mse_before"])
    family = models.get("patch-gpt")()
    model = family.load(n_times=175, n_outputs=4, sfreq=250.0)
    torch.testing.assert_close(model.position, load_tensors(SHIPPED_BACKBONE)["position"])
    assert family.files() == [SHIPPED_BACKBONE]
    fresh = family.load(n_times=175, n_outputs=4, sfreq=250.0, pretrained=False)
    assert not torch.equal(fresh.position, model.position)


@pytest.mark.slow
def test_workbench_pretrain_makes_a_loadable_backbone(tmp_path):
    from workbench.core.registry import tasks

    out = tmp_path / "backbone.safetensors"
    message = tasks.get("physio")().pretrain(out, epochs=1, quiet=True)
    assert "validation" in message and out.is_file()
    model = models.get("patch-gpt")().load(out, n_times=175, n_outputs=4, sfreq=250.0)
    assert model.architecture["n_layers"] == 6
