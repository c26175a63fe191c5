"""The ``lift`` method: masks re-chosen every ``update_interval`` steps through the stage's per-step hook, the Adam
moments of entries that left a mask zeroed at the next optimiser step, refusals."""

from __future__ import annotations

import pytest
import torch
from test_lora_variants_options import Net
from torch.optim import optimizer as torch_optimizer
from workbench.adaptation import lift

from workbench.core.errors import UserError
from workbench.core.method import PlanInputs
from workbench.core.registry import methods
from workbench.core.trainer import TrainSettings


def setup(interval: int = 3):
    torch.manual_seed(0)
    method = methods.get("lift")(rank=2, budget_rank=1, update_interval=interval, targets="conv,fc", head="frozen")
    model = method.prepare(Net().double())
    x = torch.randn(6, 3, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)

    def step(index: int) -> None:  # the trainer's step: zero_grad, the stage's hooks around backward, optimiser step
        optimizer.zero_grad()
        assert method.step_hook(model, x, index) is None
        (model(x) ** 2).sum().backward()
        method.before_step(model, optimizer, index)
        optimizer.step()

    return method, model, optimizer, step


def test_masks_are_rechosen_every_update_interval_steps_and_left_moments_are_dropped():
    method, model, optimizer, step = setup(interval=3)
    hooks = len(torch_optimizer._global_optimizer_pre_hooks)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {"conv.weight", "fc.weight"}
    for index in range(3):
        step(index)
    mask = model.fc.lift_mask.clone()
    with torch.no_grad():  # a large rank-1 change moves the principal weights elsewhere
        generator = torch.Generator().manual_seed(9)
        model.fc.weight.add_(
            3 * torch.outer(*(torch.randn(n, generator=generator, dtype=torch.float64) for n in (7, 12)))
        )
    old_moment = optimizer.state[model.fc.weight]["exp_avg"].clone()
    before = model.fc.weight.detach().clone()
    step(3)  # a multiple of the interval: re-chosen before its gradient
    new = model.fc.lift_mask
    assert not torch.equal(new, mask) and (old_moment[mask & ~new] != 0).any()
    assert torch.equal(new, lift.principal_mask(before, 2, int(mask.sum())))
    assert (optimizer.state[model.fc.weight]["exp_avg"][~new] == 0).all()  # dropped before this step's update
    assert torch.equal(model.fc.weight[~new], before[~new])  # entries that left the mask stayed where they were
    assert len(torch_optimizer._global_optimizer_pre_hooks) == hooks  # no global optimizer hook
    with torch.no_grad():
        model.fc.weight.add_(3 * torch.outer(*(torch.randn(n, dtype=torch.float64) for n in (7, 12))))
    step(4)  # not a multiple: the masks stay
    assert torch.equal(model.fc.lift_mask, new)
    assert method.diagnostics(None, model, None) == {
        "principal_entries": float(lift.lora_budget(model.fc.weight, 1) + lift.lora_budget(model.conv.weight, 1))
    }
    merged = method.merge(model)
    assert not hasattr(merged.fc, "lift_mask")


def test_a_resumed_run_rechooses_its_masks_at_its_first_step():
    method, model, _, step = setup(interval=100)
    with torch.no_grad():
        model.fc.weight.add_(3 * torch.outer(*(torch.randn(n, dtype=torch.float64) for n in (7, 12))))
    before = model.fc.weight.detach().clone()
    step(7)  # the first step this process takes is not step 0: a resumed run
    assert torch.equal(model.fc.lift_mask, lift.principal_mask(before, 2, int(model.fc.lift_mask.sum())))


def test_lift_refuses_weight_decay_and_a_bad_interval():
    method, model, _, _ = setup()
    settings = TrainSettings(epochs=1, batch_size=2, learning_rate=1e-3, seed=0, weight_decay=0.01)

    class Data:
        train, val = [0, 1], [0]

    with pytest.raises(UserError, match="method 'lift': weight decay"):
        method.plan(None, model, Data, PlanInputs(settings))
    with pytest.raises(UserError, match="--update-interval must be a positive integer"):
        methods.get("lift")(update_interval=0)
