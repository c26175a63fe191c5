"""SeedBatchTrainer: K seeds trained as one vmapped computation give the numbers of K Trainer runs; what it refuses.

Bit-identical on this machine (torch 2.13 CPU; 1 thread as pinned here, and 2 threads alike): float64 training and
validation losses (Trainer records them as float32), every history's epochs, steps, learning rates and selectable
flags, early stops included; and, given the same gradients, clipping, Adam/AMSGrad and EMA. Not bit-identical, largest
relative difference over the three replicas: float64 final weights 3.2e-16; float32 training losses 8.6e-8,
validation losses 1.1e-7, final weights 1.9e-7 (the batched matrix products of forward and backward round differently).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch import nn

from workbench.ema import ExponentialMovingAverage
from workbench.seed_batch import NotBatchable, SeedBatchTrainer
from workbench.trainer import Trainer, TrainSettings

SEEDS = (0, 1, 2)
TRAIN, VAL, BATCH = 44, 14, 8  # 5 full training batches and a short one of 4; validation 8 + 6
#: Relative tolerance (losses, weights) per dtype.
TOLERANCE = {torch.float64: (1e-12, 1e-10), torch.float32: (1e-6, 1e-6)}
#: EMA, clipping that bites on some steps, AMSGrad, weight decay, a plateau schedule and early stopping that ends
#: replicas 0 and 1 before replica 2 (which runs all 12 epochs).
SETTINGS = TrainSettings(
    epochs=12,
    batch_size=BATCH,
    learning_rate=0.01,
    weight_decay=1e-3,
    amsgrad=True,
    ema_decay=0.9,
    clip_grad_norm=1.0,
    patience=2,
    schedule="plateau",
    lr_patience=1,
)


@pytest.fixture(autouse=True)
def one_thread():
    """A model this small gains nothing from a second thread, and beside other work loses much (workbench.threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def samples(n: int, seed: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A noisy 3-class problem: one shared linear teacher, this seed's inputs and noise."""
    teacher = torch.randn(10, 3, generator=torch.Generator().manual_seed(7), dtype=dtype)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=generator, dtype=dtype)
    y = (x @ teacher + torch.randn(n, 3, generator=generator, dtype=dtype)).argmax(1)
    return [(x[i], y[i]) for i in range(n)]


def collate(batch, device):
    return torch.stack([s[0] for s in batch]).to(device), torch.stack([s[1] for s in batch]).to(device)


def cross_entropy(model, batch, training):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def mlp(seed: int, dtype: torch.dtype, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    layers = [nn.Linear(10, 32), nn.Tanh()] + ([nn.Dropout(dropout)] if dropout else []) + [nn.Linear(32, 3)]
    return nn.Sequential(*layers).to(dtype)


def replicas(dtype: torch.dtype, settings: TrainSettings = SETTINGS):
    """(models, training samples, validation samples, settings), one of each per seed."""
    precision = "float64" if dtype == torch.float64 else "float32"
    return (
        [mlp(seed, dtype) for seed in SEEDS],
        [samples(TRAIN, 100 + seed, dtype) for seed in SEEDS],
        [samples(VAL, 200 + seed, dtype) for seed in SEEDS],
        [replace(settings, seed=seed, precision=precision) for seed in SEEDS],
    )


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batched_seeds_give_one_at_a_time_numbers(dtype):
    models, trains, vals, settings = replicas(dtype)
    alone = [copy.deepcopy(model) for model in models]
    calls = {True: 0, False: 0}

    def counted(model, batch, training):
        calls[training] += 1
        return cross_entropy(model, batch, training)

    batched = SeedBatchTrainer(models, counted, collate, trains, vals, settings)
    histories = batched.fit()

    loss_tolerance, weight_tolerance = TOLERANCE[dtype]
    for k, (model, reference) in enumerate(zip(models, alone)):
        expected = Trainer(reference, cross_entropy, collate, trains[k], vals[k], settings[k], progress=False).fit()
        for key in ("epoch", "steps", "lr", "selectable"):
            assert [h[key] for h in histories[k]] == [h[key] for h in expected], (k, key)
        for key in ("train_loss", "val_loss", "objective"):
            got, want = torch.tensor([h[key] for h in histories[k]]), torch.tensor([h[key] for h in expected])
            assert relative(got, want) <= loss_tolerance, (k, key)
        assert set(histories[k][0]) == set(expected[0])
        for (name, p), q in zip(reference.named_parameters(), model.parameters()):
            assert relative(q.detach(), p.detach()) <= weight_tolerance, (k, name)
        assert not model.training

    steps = -(-TRAIN // BATCH)
    assert TRAIN % BATCH and all(h["steps"] == steps for history in histories for h in history)  # short batch kept
    lengths = [len(history) for history in histories]
    assert min(lengths) < max(lengths) == SETTINGS.epochs  # an early stop while the others go on
    assert batched.stopped[lengths.index(min(lengths))]
    assert len({h["lr"] for history in histories for h in history}) > 1  # the plateau schedule acted
    assert all(0 < clipped < length * steps for clipped, length in zip(batched.clipped_steps, lengths))
    # one vmapped loss call per step (and per validation batch) for all replicas still training
    assert calls[True] == max(lengths) * steps < sum(lengths) * steps
    assert calls[False] == max(lengths) * -(-VAL // BATCH)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_update_is_torchs_given_the_same_gradients(dtype):
    """Clipping, Adam/AMSGrad (per-replica learning rates) and EMA after the gradient: bit for bit what Trainer's
    clip_grad_norm_, Adam(fused=True) and ExponentialMovingAverage do, also from transposed (non-contiguous)
    gradients, which the fused kernel would misread."""
    models, trains, vals, settings = replicas(dtype)
    alone = [copy.deepcopy(model) for model in models]
    batched = SeedBatchTrainer(models, cross_entropy, collate, trains, vals, settings)
    for objective in (1.0, 2.0, 3.0):  # replica 1's plateau schedule halves its rate
        batched.rates[1].after_epoch(objective)
    rates = [rate.value for rate in batched.rates]
    assert rates[1] == rates[0] / 2
    optimizers = [
        torch.optim.Adam(m.parameters(), lr=lr, amsgrad=True, weight_decay=SETTINGS.weight_decay, fused=True)
        for m, lr in zip(alone, rates)
    ]
    averages = [ExponentialMovingAverage(list(m.parameters()), SETTINGS.ema_decay) for m in alone]
    generator = torch.Generator().manual_seed(0)
    for step in range(5):
        scale = torch.tensor([0.01, 1.0, 10.0], dtype=dtype)  # replica 0 under the clipping norm, the others over
        grads = {}
        for name, p in alone[0].named_parameters():
            g = torch.randn(len(SEEDS), *reversed(p.shape), generator=generator, dtype=dtype)
            grads[name] = g.transpose(1, 2) if p.dim() == 2 else g  # what a batched backward may return
            grads[name] = grads[name] * scale.view(-1, *[1] * p.dim())
        batched._update({name: g.clone() for name, g in grads.items()})  # it clips them in place
        for k, model in enumerate(alone):
            for name, p in model.named_parameters():
                p.grad = grads[name][k].contiguous()
            torch.nn.utils.clip_grad_norm_(model.parameters(), SETTINGS.clip_grad_norm)
            optimizers[k].step()
            averages[k].update()
            for (name, p), shadow in zip(model.named_parameters(), averages[k].shadow):
                assert torch.equal(batched.stacked["param"][name][k], p.detach()), (step, k, name)
                assert torch.equal(batched.stacked["shadow"][name][k], shadow), (step, k, name)
    assert batched.clipped_steps == [0, 5, 5]


def test_linear_schedule_without_ema_clipping_or_amsgrad():
    """The other branches: the "linear" schedule with warm-up, no EMA (the raw weights are validated and kept), no
    clipping, plain Adam, and warm-up epochs that cannot be chosen (select_from)."""
    settings = replace(
        SETTINGS, epochs=4, schedule="linear", warmup_share=0.25, ema_decay=None, clip_grad_norm=None, amsgrad=False
    )
    models, trains, vals, settings = replicas(torch.float64, replace(settings, select_from=2))
    alone = [copy.deepcopy(model) for model in models]
    histories = SeedBatchTrainer(models, cross_entropy, collate, trains, vals, settings).fit()
    for k, (model, reference) in enumerate(zip(models, alone)):
        expected = Trainer(reference, cross_entropy, collate, trains[k], vals[k], settings[k], progress=False).fit()
        assert [(h["lr"], h["selectable"]) for h in histories[k]] == [(h["lr"], h["selectable"]) for h in expected]
        assert [h["val_loss"] for h in histories[k]] == pytest.approx([h["val_loss"] for h in expected], rel=1e-12)
        for p, q in zip(reference.parameters(), model.parameters()):
            assert relative(q.detach(), p.detach()) <= 1e-10


def test_frozen_parameters_shared_or_stacked():
    """Parameters that do not train: shared when every replica holds the same (the first layer here), stacked per
    replica when they differ (the last bias); either way the numbers are one-at-a-time runs'."""
    models, trains, vals, settings = replicas(torch.float64, replace(SETTINGS, epochs=3))
    for k, model in enumerate(models):
        model[0].load_state_dict(models[0][0].state_dict())
        model[0].requires_grad_(False)
        model[2].bias.requires_grad_(False)
    alone = [copy.deepcopy(model) for model in models]
    batched = SeedBatchTrainer(models, cross_entropy, collate, trains, vals, settings)
    assert batched.names == ["2.weight"] and list(batched.fixed) == ["model.2.bias"]
    histories = batched.fit()
    for k, (model, reference) in enumerate(zip(models, alone)):
        expected = Trainer(reference, cross_entropy, collate, trains[k], vals[k], settings[k], progress=False).fit()
        assert [h["val_loss"] for h in histories[k]] == pytest.approx([h["val_loss"] for h in expected], rel=1e-12)
        for p, q in zip(reference.parameters(), model.parameters()):
            assert relative(q.detach(), p.detach()) <= 1e-10


def test_unequal_sizes_are_refused():
    models, trains, vals, settings = replicas(torch.float64)
    with pytest.raises(NotBatchable, match="equal sizes.*training"):
        SeedBatchTrainer(models, cross_entropy, collate, [trains[0][:-1], *trains[1:]], vals, settings)
    with pytest.raises(NotBatchable, match="equal sizes.*validation"):
        SeedBatchTrainer(models, cross_entropy, collate, trains, [*vals[:2], vals[2][:-1]], settings)


def test_dropout_is_refused():
    _, trains, vals, settings = replicas(torch.float32)
    models = [mlp(seed, torch.float32, dropout=0.1) for seed in SEEDS]
    with pytest.raises(NotBatchable, match=r"Dropout\(p=0.1\)"):
        SeedBatchTrainer(models, cross_entropy, collate, trains, vals, settings)

    def random_loss(model, batch, training):  # randomness the module check cannot see: vmap refuses it
        x, y = batch
        return nn.functional.cross_entropy(nn.functional.dropout(model(x), 0.5, training), y)

    with pytest.raises(NotBatchable, match="random numbers"):
        SeedBatchTrainer(replicas(torch.float32)[0], random_loss, collate, trains, vals, settings).fit()


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_is_refused(precision):
    models, trains, vals, settings = replicas(torch.float32)
    with pytest.raises(NotBatchable, match=f"precision '{precision}'.*float32 or float64"):
        SeedBatchTrainer(
            models, cross_entropy, collate, trains, vals, [replace(s, precision=precision) for s in settings]
        )


def test_other_refusals():
    models, trains, vals, settings = replicas(torch.float32)
    with pytest.raises(NotBatchable, match=r"differ from replica 0's in \['learning_rate'\]"):
        SeedBatchTrainer(
            models, cross_entropy, collate, trains, vals, [*settings[:2], replace(settings[2], learning_rate=1)]
        )
    normed = [nn.Sequential(model, nn.BatchNorm1d(3)) for model in models]
    with pytest.raises(NotBatchable, match="BatchNorm1d"):
        SeedBatchTrainer(normed, cross_entropy, collate, trains, vals, settings)
    with pytest.raises(NotBatchable, match="replica 1's model differs"):
        SeedBatchTrainer([models[0], mlp(1, torch.float64), models[2]], cross_entropy, collate, trains, vals, settings)
