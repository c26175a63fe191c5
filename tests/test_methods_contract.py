"""One contract for every registered method: identity at start, a step moves only what it owns,
its state saves and loads, merging changes nothing. A method without a case here fails the suite."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import outputs_on, randomize_trainable, small_mace
from workbench.domains.atomistic.frames import Frame, collate, to_graphs

from workbench.checkpoint import load_tensors, save_tensors
from workbench.registry import methods
from workbench.testing import assert_identity_at_init, assert_merge_equivalent, assert_only_trainable_change

#: method -> (options, builder of a base model it fits)
CASES = {
    "elora": ({"rank": 4, "alpha": 4.0}, small_mace),
    "full": ({}, small_mace),
    "readout": ({}, small_mace),
    "mace-lora": ({"rank": 2}, small_mace),
}


def test_every_method_has_a_case():
    assert set(methods.names()) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_method_contract(name, ethanol, tmp_path):
    options, build = CASES[name]
    z, coords = ethanol
    outputs = outputs_on(z, coords[:2])
    method = methods.get(name)(**options)
    base = build()
    prepared = assert_identity_at_init(base, method, outputs)

    batch = collate(to_graphs([Frame(z, c) for c in coords[:3]], [1, 6, 7, 8], 5.0))
    optimizer = torch.optim.Adam([p for p in prepared.parameters() if p.requires_grad], lr=1e-2)

    def step(model):
        out = model(batch.to_dict(), training=True, compute_force=True)
        optimizer.zero_grad()
        (out["energy"].sum() + out["forces"].square().sum()).backward()
        optimizer.step()

    step(prepared)  # low-rank methods start with B = 0: the first step moves B only
    assert_only_trainable_change(prepared, step)

    save_tensors(tmp_path / "state.safetensors", method.trainable_state(prepared))
    torch.manual_seed(123)
    reloaded = method.prepare(copy.deepcopy(base))
    method.load_trainable_state(reloaded, load_tensors(tmp_path / "state.safetensors"))
    torch.testing.assert_close(outputs(reloaded)["forces"], outputs(prepared)["forces"], rtol=0, atol=0)

    randomize_trainable(prepared, scale=0.05)
    assert_merge_equivalent(prepared, method, outputs, tol=1e-10)
