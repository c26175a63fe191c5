"""The LoRA refinements on ELoRA (PiSSA, LoRA-One, rsLoRA, RepLoRA, DoRA, Flat-LoRA): closed forms per path block,
rotation equivariance with non-zero adapters before and after merging, save/load, and GOAT's refusal."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import EMBEDDED_RMD17, energy_forces, outputs_on, randomize_trainable, small_mace, write_rmd17_layout
from e3nn import o3
from workbench.adaptation import elora
from workbench.domains.atomistic.frames import Frame, collate, to_graphs

import workbench
from workbench.core.checkpoint import load_tensors, read_metadata
from workbench.core.errors import UserError
from workbench.core.testing import assert_identity_at_init, rotation_equivariance_error

RANK, ALPHA = 4, 8.0
EMBEDDED = EMBEDDED_RMD17 / "npz_data" / "rmd17_ethanol.npz"


@pytest.fixture(scope="module")
def base():
    """One small random MACE (float64) for the module; each test adapts a deep copy."""
    return small_mace(channels=8)


def path_blocks(module: torch.nn.Module, weight: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Each weighted path's block of an e3nn module as ``(rows, cols)``, read through e3nn's own view."""
    weighted = [i for i, ins in enumerate(module.instructions) if isinstance(module, o3.Linear) or ins.has_weight]
    views = [module.weight_view_for_instruction(i, weight) for i in weighted]
    return [view.reshape(-1, view.shape[-1]) for view in views]


def e3nn_adapted(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The adapted ``o3.Linear`` / ``o3.TensorProduct`` modules."""
    return [
        m
        for m in model.modules()
        if isinstance(m, (o3.Linear, o3.TensorProduct)) and torch.nn.utils.parametrize.is_parametrized(m)
    ]


def assert_equivariant_before_and_after_merge(model, ethanol, n_rotations=4):
    """Non-zero adapters change the model; it is rotation-equivariant, merges to the same function, and stays so."""
    z, coords = ethanol
    positions = torch.as_tensor(coords[0])
    energy, forces = energy_forces(model, z)(positions)
    assert rotation_equivariance_error(energy_forces(model, z), positions, n_rotations) < 1e-9
    merged = elora.merge(model)
    assert not any(torch.nn.utils.parametrize.is_parametrized(m) for m in merged.modules())
    merged_energy, merged_forces = energy_forces(merged, z)(positions)
    torch.testing.assert_close(merged_energy, energy, rtol=0, atol=1e-10)
    torch.testing.assert_close(merged_forces, forces, rtol=0, atol=1e-10)
    assert rotation_equivariance_error(energy_forces(merged, z), positions, n_rotations) < 1e-9
    return merged


# ---- equivariance of each refinement --------------------------------------------------------------------------------

EACH = [
    pytest.param({"init": "pissa"}, id="pissa"),
    pytest.param({"init": "lora-one"}, id="lora-one"),
    pytest.param({"scaling": "rslora"}, id="rslora"),
    pytest.param({"reparam": "replora"}, id="replora"),
    pytest.param({"dora": True}, id="dora"),
]


def _equivariance_case(base, ethanol, options, n_rotations):
    model = randomize_trainable(elora.apply(copy.deepcopy(base), rank=RANK, alpha=ALPHA, **options), scale=0.3)
    merged = assert_equivariant_before_and_after_merge(model, ethanol, n_rotations)
    changed = [
        float((m.weight - b.weight).abs().max())
        for m, b in zip(merged.modules(), base.modules())
        if isinstance(m, (o3.Linear, o3.TensorProduct)) and m.weight.numel()
    ]
    assert min(changed) > 1e-4, "the adapters must really change every adapted weight for this test"


def test_pissa_rslora_dora_stay_equivariant_and_merge(base, ethanol):
    _equivariance_case(base, ethanol, {"init": "pissa", "scaling": "rslora", "dora": True}, n_rotations=1)


@pytest.mark.slow
@pytest.mark.parametrize("options", EACH)
def test_each_refinement_stays_equivariant_and_merges(base, ethanol, options):
    _equivariance_case(base, ethanol, options, n_rotations=4)


def test_flat_lora_noise_and_replora_stay_equivariant(base, ethanol):
    """Flat-LoRA's per-unit noise on the per-path weights is itself a weight-space change: the perturbed model is
    equivariant; with RepLoRA's factors, which merge away (the merged model's equivariance: the slow test)."""
    z, coords = ethanol
    positions = torch.as_tensor(coords[0])
    options = {"reparam": "replora", "scaling": "rslora"}
    model = randomize_trainable(elora.apply(copy.deepcopy(base), rank=RANK, alpha=ALPHA, **options), scale=0.3)
    plain, _ = energy_forces(model, z)(positions)
    with elora.perturbed(model, seed=7, sigma=0.2):
        assert rotation_equivariance_error(energy_forces(model, z), positions, n_rotations=1) < 1e-9
        noisy, _ = energy_forces(model, z)(positions)
    assert abs(float(noisy - plain)) > 1e-4  # the noise really acts
    merged = elora.merge(model)  # the noise is gone after the block: the merge folds the unperturbed function
    merged_energy, _ = energy_forces(merged, z)(positions)
    torch.testing.assert_close(merged_energy, plain, rtol=0, atol=1e-10)


# ---- closed forms -------------------------------------------------------------------------------------------------


def test_pissa_identity_at_init_top_r_svd_and_reload(base, ethanol, tmp_path):
    """PiSSA (with rsLoRA's scale and DoRA): the same function at init; each block's factors are its top-r SVD split
    as sqrt(S / scale) on each side and the stored base is the residual; a saved adapter reloads onto the original
    base (the residual recomputed) to the same function, and its file records the options."""
    z, coords = ethanol
    options = {"init": "pissa", "scaling": "rslora", "dora": True}
    method = elora.ELoRA(rank=RANK, alpha=ALPHA, init="pissa", lora_scaling="rslora", dora=True)
    model = assert_identity_at_init(copy.deepcopy(base), method, outputs_on(z, coords[:1]), tol=1e-10)
    base_modules = dict(base.named_modules())
    checked = 0
    for name, module in model.named_modules():
        if not any(module is m for m in e3nn_adapted(model)):
            continue
        adapter = module.parametrizations.weight[0]
        residual = module.parametrizations.weight.original
        assert adapter.scale == ALPHA / math.sqrt(RANK)
        for p, (block, residual_block) in enumerate(
            zip(path_blocks(base_modules[name], base_modules[name].weight), path_blocks(module, residual))
        ):
            u, s, vh = torch.linalg.svd(block, full_matrices=False)
            r = min(RANK, *block.shape)
            top = u[:, :r] @ torch.diag(s[:r]) @ vh[:r]
            a, b = adapter.A[p], adapter.B[p]
            torch.testing.assert_close(adapter.scale * a @ b, top, rtol=0, atol=1e-12)
            torch.testing.assert_close(residual_block, block - top, rtol=0, atol=1e-12)
            # split as sqrt(S / scale) on each side: A's columns orthogonal with norms² S / scale, B's rows too
            torch.testing.assert_close(a.T @ a, torch.diag(s[:r] / adapter.scale), rtol=0, atol=1e-12)
            torch.testing.assert_close(b @ b.T, torch.diag(s[:r] / adapter.scale), rtol=0, atol=1e-12)
            checked += 1
    assert checked > 10
    element = next(m for m in model.modules() if hasattr(m, "weights_max"))  # the contraction: A / n_params, B shared
    adapter, residual = element.parametrizations.weights_max[0], element.parametrizations.weights_max.original
    stacked = next(m for m in base.modules() if hasattr(m, "weights_max")).weights_max.detach()
    stacked = stacked.reshape(-1, stacked.shape[-1])
    u, s, vh = torch.linalg.svd(stacked, full_matrices=False)
    r = adapter.B.shape[0]
    top = u[:, :r] @ torch.diag(s[:r]) @ vh[:r]
    delta = adapter.scale * (adapter.A.reshape(-1, r) / adapter.n_params) @ adapter.B
    torch.testing.assert_close(delta, top, atol=1e-12, rtol=0)
    torch.testing.assert_close(residual.reshape(-1, residual.shape[-1]), stacked - top, rtol=0, atol=1e-12)

    adapted = randomize_trainable(model, scale=0.2)
    elora.save_adapter(adapted, tmp_path / "adapter.safetensors")
    metadata = read_metadata(tmp_path / "adapter.safetensors")
    assert {k: json.loads(metadata["config"])[k] for k in options} == options
    assert not any("original" in name for name in load_tensors(tmp_path / "adapter.safetensors"))  # no base saved
    loaded = elora.load_adapter(copy.deepcopy(base), tmp_path / "adapter.safetensors")
    outputs = outputs_on(z, coords[:1])
    torch.testing.assert_close(outputs(loaded)["forces"], outputs(adapted)["forces"], rtol=0, atol=1e-12)


def _energy_forces_loss(model, batch):
    """Energy + force squared error against the DFT labels (an rmd17-style loss written here, not the task's)."""
    out = model(batch.to_dict(), training=True, compute_force=True)
    return ((out["energy"] - batch.energy) ** 2).mean() + 10.0 * ((out["forces"] - batch.forces) ** 2).mean()


def _ethanol_batch(base, ethanol, frames):
    z, coords = ethanol
    with np.load(EMBEDDED) as data:
        energies, forces = data["energies"], data["forces"]
    kcal_per_mol = 0.0433641  # eV
    graphs = [Frame(z, coords[i], float(energies[i]) * kcal_per_mol, forces[i] * kcal_per_mol) for i in frames]
    return collate(to_graphs(graphs, [int(n) for n in base.atomic_numbers], float(base.r_max)), "cpu")


def test_lora_one_factors_are_the_top_r_subspaces_of_the_gradient(base, ethanol):
    gamma = 64.0
    batch = _ethanol_batch(base, ethanol, (0,))
    reference = copy.deepcopy(base)  # the gradient computed here, on the plain model, by autograd
    linears = [m for m in reference.modules() if isinstance(m, (o3.Linear, o3.TensorProduct)) and m.weight.numel()]
    weights = [m.weight for m in linears]
    for w in weights:
        w.requires_grad_(True)
    gradients = torch.autograd.grad(_energy_forces_loss(reference, batch), weights, allow_unused=True)

    model = elora.apply(copy.deepcopy(base), rank=RANK, alpha=ALPHA, init="lora-one")
    elora.init_lora_one(model, _energy_forces_loss, [(batch, 1)], gamma=gamma)
    checked = zero = 0
    for reference_module, module, gradient in zip(linears, e3nn_adapted(model), gradients):
        adapter = module.parametrizations.weight[0]
        gradient = torch.zeros_like(reference_module.weight) if gradient is None else gradient
        for p, block in enumerate(path_blocks(reference_module, gradient)):
            a, b = adapter.A[p], adapter.B[p]
            if not block.abs().max() > 0:  # a path the loss does not reach keeps ELoRA's own init
                assert not b.abs().max() > 0
                zero += 1
                continue
            u, s, vh = torch.linalg.svd(-block, full_matrices=False)
            r = a.shape[1]
            # the span: A's columns lie in the top-r left singular subspace, B's rows in the right one (the factors'
            # directions of numerically zero singular values, ~1e-8 of the factors' size, are arbitrary: left out)
            kept = s[:r] > 1e-9 * s[0]
            torch.testing.assert_close(u[:, :r] @ u[:, :r].T @ a[:, kept], a[:, kept], rtol=0, atol=1e-10)
            torch.testing.assert_close(b[kept] @ vh[:r].T @ vh[:r], b[kept], rtol=0, atol=1e-10)
            # and the size: A B = (−G)_r / (γ s₁), LoRA-One's one rank-r gradient step
            expected = u[:, :r] @ torch.diag(s[:r]) @ vh[:r] / (gamma * s[0])
            torch.testing.assert_close(a @ b, expected, rtol=0, atol=1e-10 * float(expected.abs().max()) + 1e-14)
            checked += 1
    assert checked > 10 and zero < checked


def test_lora_one_needs_its_init():
    model = elora.apply(torch.nn.Sequential(o3.Linear("4x0e", "3x0e")), rank=2)
    with pytest.raises(UserError, match="init='lora-one'"):
        elora.init_lora_one(model, _energy_forces_loss, [], gamma=128.0)


def test_rslora_scale_and_layout(base):
    model = randomize_trainable(elora.apply(copy.deepcopy(base), rank=RANK, alpha=ALPHA, scaling="rslora"))
    module = e3nn_adapted(model)[0]
    adapter, original = module.parametrizations.weight[0], module.parametrizations.weight.original
    assert adapter.scale == ALPHA / math.sqrt(RANK)
    for p, (block, base_block) in enumerate(zip(path_blocks(module), path_blocks(module, original))):
        expected = base_block + ALPHA / math.sqrt(RANK) * adapter.A[p] @ adapter.B[p]
        torch.testing.assert_close(block, expected, rtol=0, atol=1e-13)


def test_replora_is_the_mlp_of_the_factors(base):
    model = randomize_trainable(elora.apply(copy.deepcopy(base), rank=RANK, alpha=ALPHA, reparam="replora"))
    module = e3nn_adapted(model)[0]
    adapter, original = module.parametrizations.weight[0], module.parametrizations.weight.original
    for p, (block, base_block) in enumerate(zip(path_blocks(module), path_blocks(module, original))):
        mlp = adapter.reparam[p]
        h, p_a, p_b = mlp.hidden.weight, mlp.A.weight, mlp.B.weight
        # ELoRA's A plays LoRA's B (out, r): B = gelu(B̂ Hᵀ) P_Bᵀ; ELoRA's B plays LoRA's A (r, in): A = P_A gelu(H Â)
        left = F.gelu(adapter.A[p] @ h.T) @ p_b.T
        right = p_a @ F.gelu(h @ adapter.B[p])
        torch.testing.assert_close(block, base_block + adapter.scale * left @ right, rtol=0, atol=1e-13)
    mlps = sum(p.numel() for n, p in model.named_parameters() if ".reparam." in n)
    assert mlps > 0 and all(p.requires_grad for n, p in model.named_parameters() if ".reparam." in n)


def test_dora_magnitude_per_output_unit_of_each_path(base):
    model = elora.apply(copy.deepcopy(base), rank=RANK, alpha=ALPHA, dora=True)
    randomize_trainable(model, scale=0.3)
    module = e3nn_adapted(model)[0]
    adapter = module.parametrizations.weight[0]
    for p, block in enumerate(path_blocks(module)):
        torch.testing.assert_close(block.norm(dim=0), adapter.magnitude[p].reshape(-1).abs(), rtol=0, atol=1e-12)


def test_flat_noise_regenerated_equals_used_and_follows_the_per_unit_law():
    """On one e3nn Linear (two paths), the noise used in the forward equals the one drawn again from its seed, and
    equals z · σ ‖W'_col‖ / sqrt(rows) with z the generator's draws, block by block as (1, rows, cols)."""
    torch.manual_seed(0)
    linear = o3.Linear("4x0e + 3x1o", "5x0e + 2x1o").double()
    model = randomize_trainable(elora.apply(torch.nn.Sequential(linear), rank=2, alpha=2.0), scale=0.5)
    adapted = linear.weight.detach().clone()
    sigma, seed = 0.3, 11
    with elora.perturbed(model, seed, sigma):
        used = linear.parametrizations.weight[0].perturbation.clone()  # what the forward adds
        torch.testing.assert_close(linear.weight.detach(), adapted + used, rtol=0, atol=1e-15)
    regenerated = elora.perturbations(model, seed, sigma)["0.weight"]
    torch.testing.assert_close(regenerated, used, rtol=0, atol=0)
    generator = torch.Generator().manual_seed(seed)
    for block, noise in zip(path_blocks(linear, adapted), path_blocks(linear, used)):
        z = torch.randn((1, *block.shape), generator=generator, dtype=torch.float64)[0]
        expected = z * sigma * block.norm(dim=0) / math.sqrt(block.shape[0])
        torch.testing.assert_close(noise, expected, rtol=0, atol=1e-15)
    assert torch.equal(linear.weight, adapted)  # no noise after the block


# ---- refusals, the method through the engine --------------------------------------------------------------------


def test_goat_is_refused_with_why():
    model = torch.nn.Sequential(o3.Linear("4x0e + 3x1o", "5x0e + 2x1o"))
    for options in ({"init": "goat"}, {"scaling": "goat"}):
        with pytest.raises(UserError, match="routed token by token.*breaks equivariance"):
            elora.apply(model, **options)
    with pytest.raises(UserError, match="breaks equivariance"):
        elora.ELoRA(init="goat").prepare(model)
    with pytest.raises(UserError, match="replora"):
        elora.apply(model, init="pissa", reparam="replora")
    assert not torch.nn.utils.parametrize.is_parametrized(model[0])  # refused before anything changed


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:cuequivariance_ops_torch is not available")
def test_cueq_contraction_takes_only_the_scaling(base):
    """cuEquivariance's symmetric contraction (every order in one weight) is not built for the other refinements."""
    pytest.importorskip("cuequivariance_torch")
    from workbench.models.mace import to_cueq

    converted = to_cueq(copy.deepcopy(base))
    with pytest.raises(UserError, match="dora refinement.*--backend e3nn"):
        elora.apply(copy.deepcopy(converted), dora=True)
    adapted = elora.apply(converted, rank=RANK, alpha=ALPHA, scaling="rslora")
    contraction = next(m for m in adapted.modules() if isinstance(m, elora.ContractionLowRank))
    assert contraction.scale == ALPHA / math.sqrt(RANK)


@pytest.mark.slow
def test_tiny_rmd17_run_with_refinements(tmp_path):
    """Through the engine: PiSSA + rsLoRA + DoRA trained on Flat-LoRA's objective, and LoRA-One's setup."""
    data = write_rmd17_layout(tmp_path / "rmd17", n_frames=30, n_train=20)
    tiny = {"epochs": 1, "train_size": 5, "val_size": 2, "batch_size": 5, "baselines": [], "quiet": True}
    for label, options in (
        ("pissa", {"init": "pissa", "lora_scaling": "rslora", "dora": True, "objective": "flat-lora"}),
        ("lora-one", {"init": "lora-one", "rank": 4}),
    ):
        out = tmp_path / label
        workbench.adapt("rmd17", "elora", out=str(out), data=str(data), method_options=options, **tiny)
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["after"] and all(v == v for v in metrics["after"].values())
        assert json.loads((out / "adapter.json").read_text())["options"]["init"] == options["init"]
        # the run's model rebuilt from its files (PiSSA: the residual recomputed from the base) scores as trained
        again = workbench.evaluate(out)
        assert again["forces_mae_mev_per_a"] == pytest.approx(metrics["after"]["forces_mae_mev_per_a"], rel=1e-6)
