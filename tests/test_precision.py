"""``--precision``: float64 / float32 weights and samples, bf16 / fp16 mixed-precision steps (with loss scaling)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

import workbench
from workbench.core.config import RunRequest, resolve_config
from workbench.core.errors import UserError
from workbench.core.trainer import Trainer, TrainSettings


def regression(n: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=generator)
    y = x @ torch.linspace(-1.0, 1.0, 8) + 0.01 * torch.randn(n, generator=generator)
    return [(x[i], y[i]) for i in range(n)]


def collate(samples, device):
    return torch.stack([s[0] for s in samples]).to(device), torch.stack([s[1] for s in samples]).to(device)


class Recorded(nn.Module):
    """A small MLP that records the dtype its first layer computed in."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
        self.seen: set[torch.dtype] = set()

    def forward(self, x):
        hidden = self.net[0](x)
        self.seen.add(hidden.dtype)
        return self.net[2](self.net[1](hidden)).squeeze(-1)


def mse(model, batch, training):
    x, y = batch
    return ((model(x).float() - y) ** 2).mean()


SETTINGS = TrainSettings(epochs=8, batch_size=8, learning_rate=0.02, ema_decay=None, patience=50)


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_steps_run_under_autocast_and_learn(precision, dtype, tmp_path):
    model = Recorded()
    trainer = Trainer(
        model, mse, collate, regression(64, 1), regression(16, 2), replace(SETTINGS, precision=precision),
        tmp_path / "state.pt", progress=False,
    )  # fmt: skip
    history = trainer.fit()
    assert model.seen == {dtype}, "the forward must run in the mixed precision"
    assert all(p.dtype == torch.float32 for p in model.parameters()), "weights stay float32"
    assert history[-1]["val_loss"] < 0.5 * history[0]["val_loss"]
    assert (trainer.scaler is not None) == (precision == "fp16")
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    assert (state["scaler"] is not None) == (precision == "fp16")


def test_float32_steps_do_not_autocast():
    model = Recorded()
    Trainer(model, mse, collate, regression(32, 1), regression(8, 2), replace(SETTINGS, epochs=1), progress=False).fit()
    assert model.seen == {torch.float32}


def test_precision_is_resolved_against_the_task():
    config, _ = resolve_config(RunRequest(domain="rmd17"))
    assert config.precision == "float64"
    config, _ = resolve_config(RunRequest(domain="ptbxl"))
    assert config.precision == "float32"
    assert resolve_config(RunRequest(domain="ptbxl", precision="bf16"))[0].precision == "bf16"
    with pytest.raises(UserError, match="task 'rmd17' trains in float64, float32"):
        resolve_config(RunRequest(domain="rmd17", precision="bf16"))
    with pytest.raises(UserError, match="--precision float64"):
        resolve_config(RunRequest(domain="ptbxl", precision="float64"))


def test_rmd17_in_float32_trains_and_scores_like_float64(tiny_rmd17, tmp_path):
    """The potential's code paths are dtype-generic: samples follow the model's dtype, nothing is forced to float64."""
    runs = {}
    for precision in ("float32", "float64"):
        runs[precision] = workbench.adapt(
            domain="rmd17", method="readout", baselines=[], data=str(tiny_rmd17), epochs=1, train_size=10, val_size=5,
            out=str(tmp_path / precision), quiet=True, precision=precision,
        )  # fmt: skip
    single, double = runs["float32"], runs["float64"]
    assert single.config.precision == "float32"
    assert {p.dtype for p in single.model.parameters()} == {torch.float32}
    assert {p.dtype for p in double.model.parameters()} == {torch.float64}
    before32, before64 = single.metrics["before"], double.metrics["before"]
    # float32 rounding of energies of ~ -4200 eV: ~1e-3 eV; forces agree far better
    assert before32["energy_mae_mev"] == pytest.approx(before64["energy_mae_mev"], abs=5.0)
    assert before32["forces_mae_mev_per_a"] == pytest.approx(before64["forces_mae_mev_per_a"], rel=1e-3)
    assert np.isfinite(single.metrics["after"]["forces_mae_mev_per_a"])
