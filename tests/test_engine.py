"""Registry, configuration resolution, data-card checks and atomic writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workbench.core.checkpoint import load_tensors, save_tensors, write_text
from workbench.core.config import MethodEntry, RunConfig, RunRequest, resolve_config
from workbench.core.datacard import DataCard, check_fields, load_card
from workbench.core.errors import UserError
from workbench.core.registry import Registry, methods, models, tasks


def test_builtin_plugins_are_found_through_entry_points():
    assert {"rmd17"} <= set(tasks.names())
    assert {"mace"} <= set(models.names())
    assert {"elora", "full", "readout", "mace-lora"} <= set(methods.names())


def test_registry_rejects_duplicates_and_names_the_known():
    registry = Registry("thing", "workbench.no-such-group")

    @registry.register
    class First:
        name = "a"

    with pytest.raises(ValueError, match="registered twice"):

        @registry.register
        class Second:
            name = "a"

    with pytest.raises(UserError, match="unknown thing 'b'; known: a"):
        registry.get("b")


def test_resolve_config_fills_defaults_and_warns():
    request = RunRequest("rmd17", baselines=("full", "elora"), train_size=30, device="cpu", out="runs/x")
    config, warnings = resolve_config(request)
    assert config.method == "elora" and config.baselines == (MethodEntry("full"),)
    assert config.val_size == 10 and config.epochs == 40 and config.patience == 15
    assert config.task_options["molecule"] == "ethanol"
    assert {k: config.method_options[k] for k in ("rank", "alpha", "init")} == {
        "rank": 16,
        "alpha": 16.0,
        "init": "kaiming",
    }
    assert any("runs once" in w for w in warnings)
    assert RunConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"epochs": 0}, "--epochs must be at least 1"),
        ({"train_size": 4, "batch_size": 5}, "--batch-size 5 is larger than --train-size 4"),
        ({"method_options": {"rank": 4}, "method": "full"}, "method 'full' has no option"),
        ({"task_options": {"molecule": 3, "colour": 1}}, "task 'rmd17' has no option"),
        ({"baselines": ("full@no-such-model",)}, "unknown model 'no-such-model'"),
        ({"method": "full@gcn"}, "choose the model with --model"),
    ],
)
def test_resolve_config_refuses(kwargs, message):
    with pytest.raises(UserError, match=message):
        resolve_config(RunRequest("rmd17", device="cpu", **kwargs))


def test_a_pickled_checkpoint_needs_trust(tmp_path):
    from workbench.domains.atomistic.task import Rmd17

    path = tmp_path / "x.model"
    path.write_bytes(b"not looked at")
    with pytest.raises(UserError, match="--trust-checkpoint"):
        Rmd17().load_model(str(path))


def test_card_fields_are_checked():
    card = DataCard(
        "toy",
        "toy",
        {
            "x": {"dtype": "float", "shape": ["n", 3], "checks": ["finite"]},
            "z": {"dtype": "int", "shape": ["n"], "checks": ["positive"]},
        },
        {},
    )
    sizes = check_fields(card, "toy.npz", {"x": np.zeros((4, 3)), "z": np.ones(4, dtype=int)})
    assert sizes == {"n": 4}
    with pytest.raises(UserError, match="toy.npz: field 'z': expected shape"):
        check_fields(card, "toy.npz", {"x": np.zeros((4, 3)), "z": np.ones(5, dtype=int)})
    with pytest.raises(UserError, match="toy.npz: field 'z': expected positive values"):
        check_fields(card, "toy.npz", {"x": np.zeros((4, 3)), "z": np.zeros(4, dtype=int)})
    assert load_card("rmd17").fields["energies"]["units"] == "kcal/mol"


def test_writes_are_atomic_and_damaged_files_named(tmp_path):
    import torch

    save_tensors(tmp_path / "a.safetensors", {"w": torch.ones(3)})
    assert torch.equal(load_tensors(tmp_path / "a.safetensors")["w"], torch.ones(3))
    (tmp_path / "b.safetensors").write_bytes(b"\x00" * 40)
    with pytest.raises(UserError, match="b.safetensors: not a readable safetensors file"):
        load_tensors(tmp_path / "b.safetensors")
    write_text(tmp_path / "c.txt", "hello")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "b.safetensors", "c.txt"]  # no temp left


def test_importing_the_atomistic_stack_keeps_torch_load_safe():
    import os

    import workbench.domains.atomistic.task  # noqa: F401  (imports mace-torch, which sets the variable)
    from conftest import small_mace
    from workbench.models.mace import calculator

    calculator(small_mace())
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ


def test_every_card_is_complete_and_every_plugin_card_exists():
    from importlib import resources

    names = [p.name[:-5] for p in resources.files("workbench.data_cards").iterdir() if p.name.endswith(".yaml")]
    assert names
    for name in names:
        card = load_card(name)
        assert card.name == name
        for key in ("title", "description", "format", "source", "license", "citation"):
            assert card.content.get(key), f"card {name} lacks '{key}'"
    for _, cls in tasks.items():
        assert cls.card in names and set(cls.reads) <= set(names)
    for _, cls in models.items():
        assert cls.card is None or cls.card in names


def test_tensor_memory_counts_live_allocations_exactly():
    """A (1000, 1000) float32 tensor is 4e6 bytes; views and in-place results are not new memory; freed ones leave."""
    import torch

    from workbench.core.memory import TensorMemory

    before = torch.ones(1000)  # made before the block: never counted, even when an operator returns it
    with TensorMemory(torch.device("cpu")) as memory:
        x = torch.ones(1000, 1000)
        x.add_(1).view(-1)[:10].mul_(2)
        before.add_(1)
        assert memory.live_bytes == memory.peak_bytes == 4_000_000
        y = x.sum(dim=0)  # 4000 bytes more
        assert memory.live_bytes == 4_004_000
        del x
        assert memory.live_bytes == 4000 and memory.peak_bytes == 4_004_000
        memory.reset_peak()
        with torch.inference_mode():
            torch.zeros(500, 1000)  # 2e6 bytes, freed at once
        assert memory.peak_bytes == 2_004_000 and memory.live_bytes == 4000
        del y
        assert memory.live_bytes == 0


def test_training_step_bytes_sees_gradients_and_optimizer_state():
    """A step of a bias-free (1000, 1000) linear layer holds its gradient; Adam's two more weight-sized tensors."""
    import torch

    from workbench.core.memory import training_step_bytes

    weight_bytes = 4_000_000

    def train(optimizer_class, steps=3):
        model = torch.nn.Linear(1000, 1000, bias=False)
        optimizer = optimizer_class(model.parameters(), lr=1e-3)
        batch = torch.randn(4, 1000)

        def run():
            for _ in range(steps):
                optimizer.zero_grad(set_to_none=True)
                model(batch).square().mean().backward()
                optimizer.step()

        return training_step_bytes(run, torch.device("cpu"))

    sgd, adam = train(torch.optim.SGD), train(torch.optim.Adam)
    assert len(sgd) == len(adam) == 2  # 3 steps, the first a warm-up
    assert all(weight_bytes <= b < 1.1 * weight_bytes for b in sgd), sgd  # the gradient (+ small activations)
    # + exp_avg and exp_avg_sq, kept between steps (and the update's own temporaries at its peak)
    assert all(a >= s + 2 * weight_bytes and a < 6 * weight_bytes for a, s in zip(adam, sgd)), (adam, sgd)
    with pytest.raises(ValueError, match="warm-up"):
        train(torch.optim.SGD, steps=1)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="the per-block peak needs Linux /proc")
def test_peak_memory_is_per_block_not_the_process_high_water_mark():
    """A 64 MiB block is seen by its own measurement and not by a later, small one."""
    import torch

    from workbench.core.memory import PeakMemory

    with PeakMemory(torch.device("cpu")) as big:
        x = torch.ones(16 * 2**20)  # 64 MiB of float32, written (resident)
        del x
    with PeakMemory(torch.device("cpu")) as small:
        y = torch.ones(2**20)  # 4 MiB
        del y
    assert 60 * 2**20 <= big.added_bytes <= 100 * 2**20, big.added_bytes
    assert small.added_bytes < 30 * 2**20, small.added_bytes
    assert big.peak_bytes > big.added_bytes


def test_the_architecture_stage_table_names_every_stage_field():
    """ARCHITECTURE.md's Stage table is the list of a method's training hooks: it names every `Stage` field."""
    import dataclasses
    import re

    from workbench.core.method import Stage

    text = (Path(__file__).parents[1] / "ARCHITECTURE.md").read_text()
    section = text.split("### A method owns its training plan", 1)[1].split("\n\n|", 1)[1].split("\n\n", 1)[0]
    named = {name for row in section.splitlines() for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert named == {field.name for field in dataclasses.fields(Stage)}
