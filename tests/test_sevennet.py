"""SevenNet-0 (a published foundation potential, sevenn's wheel) in the workbench: zero-shot equal to sevenn's own
calculator, ELoRA on its equivariant blocks (equivariance before/after training and after merge, merge = unmerged,
adapter file round trip), feature-space LoRA breaking equivariance (the control), E0s and units on real MD17 frames.

These run in an environment of the ``sevennet`` extra (``pip install torch==2.13.0 && pip install -e
".[sevennet,test]"``; ``python -m pytest -m sevennet``); sevenn cannot share an environment with mace-torch, so in
the main environment every test here is skipped, with that reason.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip(
    "sevenn",
    reason="sevenn is the sevennet extra's (its own environment: it needs e3nn >= 0.5, mace-torch pins e3nn 0.4.4)",
)

from e3nn import o3  # noqa: E402
from e3nn.nn._fc import _Layer as RadialLayer  # noqa: E402
from sevenn.calculator import SevenNetCalculator  # noqa: E402
from torch.nn.utils import parametrize  # noqa: E402
from workbench.adaptation import elora, feature_lora  # noqa: E402
from workbench.domains.atomistic.frames import Frame, collate, predict, to_graphs  # noqa: E402
from workbench.domains.atomistic.readers import read_sgdml  # noqa: E402
from workbench.domains.atomistic.task import Rmd17, fit_atomic_energies  # noqa: E402
from workbench.models.sevennet import calculator, load_sevennet  # noqa: E402

from workbench.core.device import device_of  # noqa: E402
from workbench.core.testing import rotation_equivariance_error  # noqa: E402

pytestmark = pytest.mark.sevennet

ROOT = Path(__file__).resolve().parents[1]
MD17_ETHANOL = ROOT / "tests" / "data" / "real" / "atomistic" / "md17_ethanol_first300.npz"
EMBEDDED_ETHANOL = ROOT / "domains" / "atomistic" / "embedded" / "rmd17" / "npz_data" / "rmd17_ethanol.npz"
#: Relative equivariance bounds of the issue (energy invariance and force equivariance, `rotation_equivariance_error`).
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.fixture(scope="module")
def base32():
    return load_sevennet("sevennet-0", torch.float32)


@pytest.fixture(scope="module")
def base64():
    return load_sevennet("sevennet-0", torch.float64)


@pytest.fixture(scope="module")
def ethanol():
    """(atomic numbers (9,), positions (n, 9, 3) [Å]) of the embedded rMD17 ethanol DFT frames."""
    with np.load(EMBEDDED_ETHANOL) as data:
        return data["nuclear_charges"], data["coords"]


def energy_forces(model, atomic_numbers):
    """``positions (n, 3) [Å] -> (energy () [eV], forces (n, 3) [eV/Å])`` of ``model`` (one frame)."""

    def compute(positions: torch.Tensor):
        dtype = next(model.parameters()).dtype
        graphs = to_graphs([Frame(np.asarray(atomic_numbers), positions.detach().numpy())],
                           [int(z) for z in model.atomic_numbers], model.r_max, dtype)  # fmt: skip
        out = model(collate(graphs, device_of(model)).to_dict(), training=False, compute_force=True)
        return out["energy"][0].detach(), out["forces"].detach()

    return compute


def train_steps(model, z, coords, steps: int = 3, lr: float = 1e-2) -> None:
    """A few Adam steps on the energy+forces of a few frames (moves every trainable tensor, B included)."""
    dtype = next(model.parameters()).dtype
    graphs = to_graphs([Frame(z, c, energy_ev=0.0, forces_ev_per_a=np.zeros_like(c)) for c in coords],
                       [int(x) for x in model.atomic_numbers], model.r_max, dtype)  # fmt: skip
    batch = collate(graphs, device_of(model))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        out = model(batch.to_dict(), training=True, compute_force=True)
        loss = out["energy"].square().mean() * 1e-3 + (out["forces"] - 0.1).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def test_zero_shot_equals_sevenn_calculator(base32, base64, ethanol):
    """The workbench's SevenNet-0 gives sevenn's own calculator's energy (≤ 1e-5 eV) and forces on ethanol; the
    float64 build (its own constants, the checkpoint's parameters) agrees to float32's precision."""
    from ase import Atoms

    z, coords = ethanol
    atoms = Atoms(numbers=z, positions=coords[0])
    atoms.calc = SevenNetCalculator("7net-0", device="cpu")
    energy, forces = energy_forces(base32, z)(torch.as_tensor(coords[0], dtype=torch.float32))
    assert abs(float(energy) - atoms.get_potential_energy()) <= 1e-5
    np.testing.assert_allclose(forces.numpy(), atoms.get_forces(), rtol=0, atol=5e-5)
    energy64, forces64 = energy_forces(base64, z)(torch.as_tensor(coords[0], dtype=torch.float64))
    assert abs(float(energy64) - atoms.get_potential_energy()) <= 1e-4
    np.testing.assert_allclose(forces64.numpy(), atoms.get_forces(), rtol=0, atol=5e-5)
    ours = Atoms(numbers=z, positions=coords[0])
    ours.calc = calculator(base32)  # the workbench's ASE calculator (what drives MD with an adapted model)
    assert abs(ours.get_potential_energy() - atoms.get_potential_energy()) <= 1e-5
    np.testing.assert_allclose(ours.get_forces(), atoms.get_forces(), rtol=0, atol=5e-5)


def test_elora_targets_sevennet_blocks(base32):
    """ELoRA adapts every o3.Linear (node updates and self-connections) and every radial-MLP layer of SevenNet-0,
    nothing of its convolutions' tensor products (their weights come from the radial MLP), and starts as the base."""
    model = elora.apply(copy.deepcopy(base32), rank=4, alpha=4.0)
    adapted = [m for m in model.modules() if parametrize.is_parametrized(m)]
    linears = [m for m in adapted if isinstance(m, o3.Linear)]
    radial = [m for m in adapted if isinstance(m, RadialLayer)]
    assert len(linears) == sum(isinstance(m, o3.Linear) for m in base32.modules()) == 18
    assert len(radial) == sum(isinstance(m, RadialLayer) for m in base32.modules()) == 15
    assert any("self_connection" in name for name, m in model.named_modules() if m in linears)
    assert len(adapted) == len(linears) + len(radial)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert 0 < trainable < 0.2 * sum(p.numel() for p in base32.parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_elora_equivariant_before_and_after_training_and_merge(base32, base64, ethanol, dtype):
    z, coords = ethanol
    positions = torch.as_tensor(coords[7], dtype=dtype)
    tol = TOLERANCE[dtype]
    base = copy.deepcopy(base32 if dtype == torch.float32 else base64)
    assert rotation_equivariance_error(energy_forces(base, z), positions) <= tol
    model = elora.apply(copy.deepcopy(base), rank=4, alpha=4.0)
    torch.testing.assert_close(energy_forces(model, z)(positions)[0], energy_forces(base, z)(positions)[0],
                               rtol=0, atol=1e-10 if dtype == torch.float64 else 1e-4)  # fmt: skip
    train_steps(model, z, coords[:3])
    energy_before = energy_forces(base, z)(positions)[0]
    energy_after, forces_after = energy_forces(model, z)(positions)
    assert abs(float(energy_after - energy_before)) > 1e-3, "training must really change the model for this test"
    assert rotation_equivariance_error(energy_forces(model, z), positions) <= tol
    merged = elora.merge(copy.deepcopy(model))
    assert not any(parametrize.is_parametrized(m) for m in merged.modules())
    energy_merged, forces_merged = energy_forces(merged, z)(positions)
    scale = 1e-6 if dtype == torch.float32 else 1e-12
    assert abs(float(energy_merged - energy_after)) <= scale * abs(float(energy_after))
    assert float((forces_merged - forces_after).abs().max()) <= scale * 1e3 * float(forces_after.abs().max())
    assert rotation_equivariance_error(energy_forces(merged, z), positions) <= tol


def test_elora_adapter_file_round_trip(base64, ethanol, tmp_path):
    z, coords = ethanol
    positions = torch.as_tensor(coords[3], dtype=torch.float64)
    base = copy.deepcopy(base64)
    model = elora.apply(copy.deepcopy(base), rank=4, alpha=4.0)
    train_steps(model, z, coords[:2], steps=2)
    elora.save_adapter(model, tmp_path / "adapter.safetensors")
    reloaded = elora.load_adapter(copy.deepcopy(base), tmp_path / "adapter.safetensors")
    for a, b in zip(energy_forces(model, z)(positions), energy_forces(reloaded, z)(positions)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_elora_refinements_stay_equivariant(base64, ethanol):
    """The LoRA variants ELoRA applies per path block (DoRA, rsLoRA, RepLoRA) keep SevenNet-0 equivariant."""
    z, coords = ethanol
    positions = torch.as_tensor(coords[11], dtype=torch.float64)
    for options in ({"dora": True, "scaling": "rslora"}, {"reparam": "replora"}):
        model = elora.apply(copy.deepcopy(base64), rank=4, alpha=4.0, **options)
        train_steps(model, z, coords[:2], steps=2)
        assert rotation_equivariance_error(energy_forces(model, z), positions) <= 1e-12, options


def test_feature_space_lora_breaks_equivariance(base64, ethanol):
    """The control: plain LoRA across the flat irreps features, trained as ELoRA was, is far from equivariant."""
    z, coords = ethanol
    positions = torch.as_tensor(coords[7], dtype=torch.float64)
    model = feature_lora.apply(copy.deepcopy(base64), rank=4, alpha=4.0)
    assert rotation_equivariance_error(energy_forces(model, z), positions) <= 1e-12  # B = 0: still the base model
    train_steps(model, z, coords[:3])
    error = rotation_equivariance_error(energy_forces(model, z), positions)
    assert error > 1e-4, f"feature-space LoRA should break equivariance, measured {error:.2e}"
    merged = feature_lora.merge(model)
    assert rotation_equivariance_error(energy_forces(merged, z), positions) > 1e-4


def test_e0s_fitted_on_md17_frames_in_ev(base64):
    """MD17's kcal/mol labels arrive in eV: after the E0 fit on training frames, SevenNet-0's energies and forces
    match the DFT labels to what a foundation model can do zero-shot, and its forces regress on the references with a
    slope near 1 (a unit error would make it 23 or 1/23)."""
    model = copy.deepcopy(base64)
    raw = read_sgdml(MD17_ETHANOL)
    frames = raw.frames
    assert -4300 < frames[0].energy_ev < -4100  # ethanol at PBE/def2-SVP: -97,208 kcal/mol
    zs = [int(z) for z in model.atomic_numbers]
    train = to_graphs(frames[:40:4], zs, model.r_max, torch.float64)
    test = to_graphs(frames[200:240:4], zs, model.r_max, torch.float64)
    before, _ = predict(model, test)
    e0s = fit_atomic_energies(model, train, {})
    assert set(e0s) == set(zs) and all(e0s[z] == 0.0 for z in zs if z not in (1, 6, 8))
    from workbench.models.potentials import set_atomic_energies

    set_atomic_energies(model, e0s)
    energies, forces = predict(model, test)
    reference = np.array([float(g.energy) for g in test])
    shift = sum(e0s[int(z)] for z in frames[0].atomic_numbers)
    np.testing.assert_allclose(energies - before, shift, rtol=1e-12)  # E0s add per atom, nothing else changes
    assert np.abs(energies - reference).mean() < 0.1  # eV per 9-atom frame, after the fit
    f_pred = np.concatenate(forces).ravel()
    f_ref = np.concatenate([g.forces.numpy() for g in test]).ravel()
    slope = float(f_pred @ f_ref / (f_ref @ f_ref))
    assert 0.8 < slope < 1.2
    assert 0.02 < np.abs(f_pred - f_ref).mean() < 0.3  # eV/Å: SevenNet-0 zero-shot on MD17 ethanol


def test_rmd17_task_runs_sevennet_without_mace(tmp_path):
    """The rmd17 task adapts SevenNet-0 where mace-torch is absent, with E0s, ELoRA and the readout baseline."""
    import importlib.util

    import workbench

    assert importlib.util.find_spec("mace") is None  # the sevennet extra's environment
    assert "mace-lora" not in Rmd17.baselines
    run = workbench.adapt(domain="rmd17", method="elora", model="sevennet-0", data=str(MD17_ETHANOL), epochs=1,
                          train_size=5, val_size=2, batch_size=5, baselines=("readout",), out=str(tmp_path / "run"),
                          quiet=True)  # fmt: skip
    metrics = run.metrics
    assert metrics["before"]["forces_mae_mev_per_a"] > 0
    assert set(metrics["baselines"]) == {"readout"}
    assert (tmp_path / "run" / "adapter.safetensors").is_file()
