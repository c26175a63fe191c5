"""workbench.adaptation.physiopfm.generator: schedule, DDIM, both generators on a synthetic linear bank, files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from workbench.adaptation.physiopfm.generator import (
    WeightDiffusion,
    ddim_sample,
    fit_weight_generator,
    load_generator,
    save_generator,
)

from workbench.core.errors import UserError

P, C, N_TRAIN, N_TEST = 1200, 6, 64, 16  # 1200 weights: 3 chunks of 576, the last one padded
# Small, fast settings (the defaults are the paper's sizes and rate 4e-4): measured on 6 seeds of this bank, the
# diffusion model reaches cosine 0.994-0.996 and the regressor 0.996-0.998; the bank's mean reaches 0.63-0.70.
FITS = {
    "diffusion": dict(iterations=300, learning_rate=2e-3, width=64, depth=2),
    "regressor": dict(iterations=60, learning_rate=1e-3),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are too small for a second thread to pay off; under CPU contention it costs up to 10×."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bank():
    """weights = A c + b + small noise: (train weights (64, P), train conditions (64, C), clean held-out weights
    (16, P), held-out conditions (16, C))."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(P, C, generator=g) / C**0.5
    b = 0.8 * torch.randn(P, generator=g)  # a shared part, so the bank's mean is a non-trivial baseline
    conditions = torch.randn(N_TRAIN + N_TEST, C, generator=g)
    clean = conditions @ a.T + b
    weights = clean[:N_TRAIN] + 0.02 * torch.randn(N_TRAIN, P, generator=g)
    return weights, conditions[:N_TRAIN], clean[N_TRAIN:], conditions[N_TRAIN:]


@pytest.fixture(scope="module")
def fitted(bank):
    """{kind: generator fitted on the bank}, with the global RNG state checked unchanged by fitting."""
    weights, conditions, _, _ = bank
    state = torch.get_rng_state()
    models = {kind: fit_weight_generator(kind, weights, conditions, seed=0, **fit) for kind, fit in FITS.items()}
    assert torch.equal(torch.get_rng_state(), state)
    return models


def test_schedule_is_the_linear_betas_cumulative_product():
    model = WeightDiffusion(10, 2, chunk=4, width=8, depth=1, heads=2)
    betas = np.linspace(1e-4, 0.02, 1000)
    np.testing.assert_allclose(model.betas.numpy(), betas, rtol=1e-6)
    np.testing.assert_allclose(model.alpha_bar.numpy(), np.cumprod(1.0 - betas), rtol=1e-5)
    assert model.alpha_bar[-1] < 1e-4  # x_T is almost pure noise, as DDIM's start assumes


def test_q_sample_is_the_closed_form():
    model = WeightDiffusion(10, 2, chunk=4, width=8, depth=1, heads=2)
    g = torch.Generator().manual_seed(1)
    x0, noise = torch.randn(4, 10, generator=g), torch.randn(4, 10, generator=g)
    t = torch.tensor([0, 1, 500, 999])
    abar = np.cumprod(1.0 - np.linspace(1e-4, 0.02, 1000))[t.numpy()][:, None]
    expected = np.sqrt(abar) * x0.numpy() + np.sqrt(1.0 - abar) * noise.numpy()
    np.testing.assert_allclose(model.q_sample(x0, t, noise).numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sampling_steps", [1, 7, 50, 1000])
def test_ddim_with_an_oracle_ends_at_its_x0(sampling_steps):
    alpha_bar = WeightDiffusion(10, 2, chunk=4, width=8, depth=1, heads=2).alpha_bar
    x0 = torch.randn(3, 10, generator=torch.Generator().manual_seed(2))
    seen = []

    def oracle(x_t, t):
        assert x_t.shape == (3, 10) and t.shape == (3,)
        seen.append(int(t[0]))
        return x0

    out = ddim_sample(oracle, alpha_bar, (3, 10), sampling_steps, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, x0)
    assert seen == np.linspace(999, 0, sampling_steps).round().astype(int).tolist()  # from T - 1 down, evenly
    assert len(set(seen)) == sampling_steps


def test_ddim_refuses_more_steps_than_trained():
    alpha_bar = WeightDiffusion(10, 2, chunk=4, width=8, depth=1, heads=2).alpha_bar
    with pytest.raises(UserError, match="sampling_steps"):
        ddim_sample(lambda x, t: x, alpha_bar, (1, 10), 1001, torch.Generator())


@pytest.mark.parametrize("kind", ["diffusion", "regressor"])
def test_generated_weights_match_held_out_sites(kind, fitted, bank):
    weights, _, clean, held_out = bank
    generated = fitted[kind].generate(held_out)
    assert generated.shape == (N_TEST, P)
    cosine = F.cosine_similarity(generated, clean).mean().item()
    baseline = F.cosine_similarity(weights.mean(0, keepdim=True), clean).mean().item()
    assert cosine > 0.9, f"{kind}: mean cosine {cosine:.4f}"
    assert cosine > baseline + 0.15, f"{kind}: cosine {cosine:.4f} vs the bank mean's {baseline:.4f}"


def test_generate_is_reproducible_and_leaves_the_global_rng_alone(fitted, bank):
    held_out = bank[3]
    model = fitted["diffusion"]
    state = torch.get_rng_state()
    first = model.generate(held_out, sampling_steps=20, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(model.generate(held_out, sampling_steps=20, seed=3), first)
    assert not torch.equal(model.generate(held_out, sampling_steps=20, seed=4), first)
    assert torch.equal(fitted["regressor"].generate(held_out, seed=1), fitted["regressor"].generate(held_out, seed=2))


@pytest.mark.parametrize("kind", ["diffusion", "regressor"])
def test_save_load_round_trip(kind, fitted, bank, tmp_path):
    held_out = bank[3]
    path = tmp_path / f"{kind}.safetensors"
    save_generator(fitted[kind], path)
    loaded = load_generator(path)
    assert type(loaded) is type(fitted[kind]) and loaded.config == fitted[kind].config and not loaded.training
    assert torch.equal(loaded.generate(held_out, seed=5), fitted[kind].generate(held_out, seed=5))


def test_load_refuses_a_file_that_is_not_a_generator(tmp_path):
    other = tmp_path / "adapter.safetensors"
    save_file({"lora_A": torch.zeros(2, 2)}, str(other), metadata={"method": "lora"})
    with pytest.raises(UserError, match="not a weight-generator file") as error:
        load_generator(other)
    assert str(other) in str(error.value)
    text = tmp_path / "notes.safetensors"
    text.write_text("not safetensors")
    with pytest.raises(UserError, match="notes.safetensors"):
        load_generator(text)


def test_load_refuses_tensors_that_do_not_fit_the_config(fitted, tmp_path):
    path = tmp_path / "regressor.safetensors"
    tensors = {k: v for k, v in fitted["regressor"].state_dict().items() if k != "weight_std"}
    save_file(tensors, str(path), metadata={"kind": "regressor", "config": '{"n_weights": 1200, "n_condition": 6}'})
    with pytest.raises(UserError, match="weight_std"):
        load_generator(path)


@pytest.mark.parametrize(
    ("weights", "conditions", "message"),
    [
        (torch.zeros(1, 5), torch.zeros(1, 2), "at least 2"),
        (torch.tensor([[0.0, float("nan")], [1.0, 2.0]]), torch.zeros(2, 2), "weights: 1 values are not finite"),
        (torch.zeros(3, 5), torch.tensor([[0.0, 1.0], [float("inf"), 0.0], [1.0, 1.0]]), "conditions: 1 values"),
        (torch.zeros(3, 5), torch.zeros(4, 2), "3 weight vectors but 4 conditions"),
        (torch.zeros(3), torch.zeros(3, 2), "weights: expected a matrix"),
    ],
)
@pytest.mark.parametrize("kind", ["diffusion", "regressor"])
def test_fit_refuses_a_bad_bank(kind, weights, conditions, message):
    with pytest.raises(UserError, match=message):
        fit_weight_generator(kind, weights, conditions, iterations=1)


def test_fit_refuses_an_unknown_kind_and_generate_a_wrong_descriptor(fitted):
    with pytest.raises(UserError, match="kind"):
        fit_weight_generator("gan", torch.zeros(3, 5), torch.zeros(3, 2))
    with pytest.raises(UserError, match=r"shape \(n, 6\)"):
        fitted["regressor"].generate(torch.zeros(2, 5))
