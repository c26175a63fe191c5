"""The rmd17 task's pieces that run without mace-torch (SevenNet's environment) equal mace-torch's own: the graphs
`plain_graphs` builds and the loss `energy_forces_loss` computes. Here mace-torch is installed and is the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mace.modules import WeightedEnergyForcesLoss
from mace.tools.torch_geometric import Batch as MaceBatch
from workbench.domains.atomistic.frames import Frame, plain_graphs, to_graphs
from workbench.domains.atomistic.task import energy_forces_loss

pytest.importorskip("torch_geometric", reason="plain_graphs builds PyTorch Geometric graphs (the graphs extra)")
from torch_geometric.data import Batch  # noqa: E402

ZS = [1, 6, 7, 8]


def _frames(ethanol, n=3, labelled=True):
    z, coords = ethanol
    rng = np.random.default_rng(0)
    return [Frame(z, c, -4200.0 + i, rng.normal(size=c.shape)) if labelled else Frame(z, c)
            for i, c in enumerate(coords[:n])]  # fmt: skip


@pytest.mark.parametrize("r_max", [1.2, 5.0])
def test_plain_graphs_equal_mace_graphs(ethanol, r_max):
    frames = _frames(ethanol) + _frames(ethanol, 1, labelled=False)
    for mine, theirs in zip(plain_graphs(frames, ZS, r_max), to_graphs(frames, ZS, r_max)):
        edges = lambda g: sorted(map(tuple, g["edge_index"].T.tolist()))  # noqa: E731
        assert edges(mine) == edges(theirs) and len(edges(mine)) > 0
        for key in ("positions", "node_attrs", "weight", "energy_weight", "forces_weight", "energy", "forces"):
            assert mine[key].dtype == theirs[key].dtype == torch.float64, key
            torch.testing.assert_close(mine[key], theirs[key], rtol=0, atol=0, msg=key)
        assert not mine["shifts"].any() and not theirs["shifts"].any()


@pytest.mark.parametrize("weights", [(1.0, 1000.0), (0.5, 10.0)])
def test_energy_forces_loss_equals_mace_loss(ethanol, weights):
    frames = _frames(ethanol, 4)
    batch = MaceBatch.from_data_list(to_graphs(frames, ZS, 5.0))
    generator = torch.Generator().manual_seed(1)
    pred = {"energy": batch["energy"] + torch.randn(4, generator=generator, dtype=torch.float64),
            "forces": batch["forces"] + torch.randn(batch["forces"].shape, generator=generator, dtype=torch.float64)}
    reference = WeightedEnergyForcesLoss(*weights)(ref=batch, pred=pred)
    torch.testing.assert_close(energy_forces_loss(batch, pred, *weights), reference.double(), rtol=1e-15, atol=0)
    plain = Batch.from_data_list(plain_graphs(frames, ZS, 5.0))
    torch.testing.assert_close(energy_forces_loss(plain, pred, *weights), energy_forces_loss(batch, pred, *weights),
                               rtol=1e-15, atol=0)  # fmt: skip
