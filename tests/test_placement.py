"""Placement: one owner (`workbench.core.device`), no helper that defaults a device to the CPU, and a harness
(`workbench.core.placement_harness`) under which a tensor left on the host fails on a CPU-only machine as it would on a
GPU. The task × method contract runs (`tests/test_task_method_contract.py`) adapt, evaluate and predict under it."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import small_mace

from workbench.core import device as placement
from workbench.core.errors import UserError
from workbench.core.placement_harness import RUN_DEVICE, PlacementError, placement_harness

ROOT = Path(__file__).resolve().parents[1]


def cpu_defaults(source: str) -> list[str]:
    """``function(argument)`` for every parameter of ``source`` whose default puts work on the CPU: ``"cpu"``,
    ``torch.device("cpu")`` or ``device="cpu"`` inside a default."""

    def is_cpu(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.split(":")[0] == "cpu"
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "device":
            return any(is_cpu(arg) for arg in node.args)
        return False

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            positional = arguments.posonlyargs + arguments.args
            pairs = list(zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults))
            pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
            name = getattr(node, "name", "<lambda>")
            found += [f"{name}({argument.arg})" for argument, default in pairs if is_cpu(default)]
    return found


def test_no_helper_defaults_a_device_to_the_cpu():
    bad = []
    for folder in ("domains", "adaptation", "models", "workbench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            bad += [f"{path.relative_to(ROOT)}: {where}" for where in cpu_defaults(path.read_text())]
    assert not bad, "device defaults to the CPU (take the model's, workbench.core.device.device_of): " + "; ".join(bad)


def test_the_scan_finds_a_planted_cpu_default():
    planted = 'def predict(model, graphs, device="cpu"):\n    pass\n\ndef f(*, where=torch.device("cpu")):\n    pass\n'
    assert cpu_defaults(planted) == ["predict(device)", "f(where)"]
    assert cpu_defaults('def predict(model, device=None):\n    x = torch.zeros(3, device="cpu")\n') == []


def test_resolve_decides_auto_once_and_refuses_what_is_not_there():
    assert placement.resolve("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert placement.resolve("cpu") == torch.device("cpu")
    with pytest.raises(UserError, match="--device must be one of auto, cpu, cuda"):
        placement.resolve("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no CUDA device"):
            placement.resolve("cuda")


def test_place_refuses_a_model_holding_unregistered_tensors():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    model[0].table = torch.zeros(4, 3)  # not a buffer: .to(device) leaves it behind
    model[0].scale = torch.tensor(2.0)  # a scalar beside a CUDA tensor is legal
    with pytest.raises(UserError, match=r"0\.table .*register_buffer"):
        placement.place(model, "cpu")
    del model[0].table
    assert placement.place(model, "cpu") is model and placement.device_of(model) == torch.device("cpu")


def test_the_harness_tells_the_run_device_from_the_host():
    with placement_harness() as run_device:
        assert run_device == RUN_DEVICE and placement.resolve("cpu") == RUN_DEVICE
        model = placement.place(torch.nn.Linear(3, 2), placement.resolve("auto"))
        assert placement.device_of(model) == RUN_DEVICE
        on_run = torch.randn(4, 3, device=placement.device_of(model))
        assert model(on_run).device == RUN_DEVICE
        assert model(torch.zeros(4, 3, device=on_run.device)).shape == (4, 2)  # made where a run tensor is
        model(on_run).sum().backward()  # gradients and the optimizer's state follow the parameters
        torch.optim.Adam(model.parameters()).step()
        assert model(on_run).detach().cpu().numpy().shape == (4, 2)  # moved to the host first: fine
        with pytest.raises(PlacementError, match="numpy"):
            model(on_run).detach().numpy()
        with pytest.raises(PlacementError, match="aten::addmm mixes"):
            model(torch.randn(4, 3))  # made on the host
        with pytest.raises(PlacementError, match="mixes"):
            model(on_run.to("cpu"))
        assert (on_run * torch.tensor(2.0)).device == RUN_DEVICE  # a host scalar is legal
        assert on_run.to(torch.float64, copy=True).device == RUN_DEVICE
    assert placement.resolve("cpu") == torch.device("cpu")  # the harness is gone


def test_the_harness_catches_the_helper_that_broke_the_first_gpu_run(ethanol):
    """The ``frames.predict`` of the first GPU run: batches collated on its own ``device="cpu"`` default beside a
    model on the run device (``RuntimeError: Expected all tensors to be on the same device`` on CUDA). The fixed
    helper takes the model's device."""
    from workbench.domains.atomistic.frames import Frame, collate, predict, to_graphs

    def predict_as_it_was(model, graphs, batch_size=32, device="cpu"):
        batch = collate(graphs[:batch_size], device)
        return model(batch.to_dict(), training=False, compute_force=True)["energy"].detach().cpu().numpy()

    numbers, positions = ethanol
    graphs = to_graphs([Frame(numbers, p) for p in positions[:3]], [1, 6, 7, 8], 5.0)
    with pytest.raises(PlacementError, match="mixes a tensor on the run device"):
        with placement_harness() as run_device:  # e3nn's generated code re-raises inside: the harness names it
            predict_as_it_was(placement.place(small_mace(), run_device), graphs)
    with placement_harness() as run_device:
        energies, forces = predict(placement.place(small_mace(), run_device), graphs)
    assert energies.shape == (3,) and np.isfinite(energies).all() and forces[0].shape == (9, 3)


def test_pretraining_puts_its_batches_where_the_model_is(tmp_path):
    """``workbench pretrain --device``: the medvl recipe (the one that trained on the CPU whatever the flag said)
    places its model and moves every batch to it; saved from the host."""
    pytest.importorskip("transformers")
    from workbench.domains.medvl.pretrain import pretrain

    out = tmp_path / "medvl.safetensors"
    with placement_harness():
        pretrain(out, vq_steps=1, vision_steps=1, lm_steps=1, image_subjects=4, held_out_subjects=2,
                 text_subjects=(2, 1), log=lambda *_: None)  # fmt: skip
    assert out.stat().st_size > 0


class _Scripted(torch.nn.Module):
    """A module holding a TorchScript submodule with a buffer (as e3nn's generated code does)."""

    def __init__(self):
        super().__init__()
        inner = torch.nn.Linear(3, 3)
        inner.register_buffer("table", torch.ones(3))
        self.inner = torch.jit.script(inner)

    def forward(self, x):
        return self.inner(x) * self.inner.table


def test_copies_no_mode_sees_keep_their_sides(tmp_path):
    """A deep copy and ``torch.jit.save`` / ``load`` keep the run device, as a CUDA module's copies stay on CUDA
    (``load`` copies in C++, unseen by the modes: without the harness's record, e3nn's deep copy, which saves and
    loads its TorchScript code, read as on the host)."""
    import copy
    import io

    with placement_harness() as run_device:
        model = placement.place(_Scripted(), run_device)
        x = torch.randn(2, 3, device=run_device)
        assert copy.deepcopy(model)(x).device == RUN_DEVICE
        norm = placement.place(torch.nn.BatchNorm1d(3), run_device).eval()  # buffers: copied without an operator
        assert copy.deepcopy(norm)(x).device == RUN_DEVICE
        buffer = io.BytesIO()
        torch.jit.save(model.inner, buffer)
        buffer.seek(0)
        loaded = torch.jit.load(buffer)
        assert (loaded(x) * loaded.table).device == RUN_DEVICE
    buffer.seek(0)
    with pytest.raises(PlacementError, match="mixes"):  # TorchScript re-raises inside: the harness names it
        with placement_harness() as run_device:
            torch.jit.load(buffer, map_location="cpu")(torch.randn(2, 3, device=run_device))  # on the host
