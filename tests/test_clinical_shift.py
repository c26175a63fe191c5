"""The shift alarm (`workbench.clinical.shift_alarm`): a valid permutation p-value (uniform under no shift), power
on a shifted toy, the MMD² against its definition, features from the model's head."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import kstest
from torch import nn

from workbench.clinical import shift_alarm
from workbench.core.model import ModelSpec


def test_the_statistic_is_the_biased_mmd2_by_its_definition():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 3)), rng.normal(0.5, 1, size=(7, 3))
    result = shift_alarm.mmd_test(x, y, permutations=10)
    sigma2 = result["bandwidth"] ** 2

    def k(a, b):
        return np.exp(-((a[:, None, :] - b[None, :, :]) ** 2).sum(-1) / (2 * sigma2))

    expected = k(x, x).mean() + k(y, y).mean() - 2 * k(x, y).mean()
    assert result["statistic"] == pytest.approx(expected, rel=1e-9)
    z = np.concatenate([x, y])
    distances = np.sqrt(((z[:, None] - z[None]) ** 2).sum(-1))[np.triu_indices(len(z), 1)]
    assert result["bandwidth"] == pytest.approx(np.median(distances), rel=1e-4)  # the middle two, averaged squared


def test_p_values_are_uniform_under_no_shift_and_the_size_is_at_most_alpha():
    rng = np.random.default_rng(1)
    p_values = []
    for trial in range(300):
        reference, batch = rng.normal(size=(80, 4)), rng.normal(size=(12, 4))
        p_values.append(shift_alarm.mmd_test(reference, batch, permutations=199, seed=trial)["p_value"])
    p_values = np.array(p_values)
    assert kstest(p_values, "uniform").pvalue > 0.01  # discrete steps of 1/200: close to uniform
    size = np.mean(p_values <= 0.05)
    assert size <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / len(p_values))


def test_the_alarm_rings_on_a_shifted_batch():
    rng = np.random.default_rng(2)
    rings = [shift_alarm.mmd_test(rng.normal(size=(200, 8)), rng.normal(0.6, 1, size=(30, 8)), seed=t)["verdict"]
             for t in range(20)]  # fmt: skip
    assert rings.count("shift") >= 18


def test_too_few_batch_items_give_no_verdict():
    result = shift_alarm.mmd_test(np.zeros((10, 2)), np.ones((shift_alarm.MIN_ITEMS - 1, 2)))
    assert result["verdict"] == "too few" and result["p_value"] is None


class _Net(nn.Module):
    def __init__(self, declare: bool):
        super().__init__()
        self.body = nn.Linear(5, 6)
        self.classifier = nn.Linear(6, 3)
        self.other = nn.Linear(3, 3)
        if declare:
            self.workbench_spec = ModelSpec(family="toy", head="classifier")

    def forward(self, x):
        return self.other(self.classifier(torch.relu(self.body(x))))


def test_features_are_what_the_declared_head_reads_else_the_last_linear_layer():
    torch.manual_seed(0)
    x = torch.randn(4, 5)
    net = _Net(declare=True)
    _, features = shift_alarm.model_features(net, lambda: net(x))
    assert np.allclose(features, torch.relu(net.body(x)).detach().numpy(), atol=1e-6)
    plain = _Net(declare=False)
    _, features = shift_alarm.model_features(plain, lambda: plain(x))
    assert features.shape == (4, 3)  # the input of `other`, the last Linear
    assert not plain.other._forward_pre_hooks  # the hook is removed afterwards


def test_the_reference_keeps_at_most_its_limit():
    features = np.arange(2000, dtype=np.float32).reshape(1000, 2)
    kept = shift_alarm.reference_sample(features, seed=0, limit=500)
    assert kept.shape == (500, 2) and len(np.unique(kept[:, 0])) == 500
