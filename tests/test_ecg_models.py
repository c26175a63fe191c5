"""ECG teacher/student models, LoRA on their declared groups, H-Tuning's mixed-order gradient, distillation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from workbench.adaptation import htuning, lora
from workbench.adaptation.distill import Distill, distillation_loss
from workbench.models.ecg import (
    ECGEncoder,
    ECGStudent,
    lead_indices,
    load_ecg_model,
    save_ecg_model,
    select_leads,
)

from workbench.core.errors import UserError
from workbench.core.testing import assert_identity_at_init, assert_merge_equivalent, assert_only_trainable_change

BCE = F.binary_cross_entropy_with_logits


def tiny_encoder(n_chans: int = 12, seed: int = 0, dtype=torch.float64) -> ECGEncoder:
    torch.manual_seed(seed)
    model = ECGEncoder(n_chans=n_chans, n_outputs=5, n_times=64, width=8, n_layers=2, n_heads=2, stem_channels=(8, 8))
    return model.to(dtype)


def tiny_batch(n: int = 8, n_samples: int = 64, seed: int = 1, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    ecg = torch.randn(n, 12, n_samples, generator=generator, dtype=dtype)
    labels = (torch.rand(n, 5, generator=generator) > 0.5).to(dtype)
    return ecg, labels


def randomize(params, seed: int = 2, std: float = 0.3) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.copy_(std * torch.randn(p.shape, generator=generator, dtype=p.dtype))


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


# -- models ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_leads", [1, 3, 12])
def test_models_take_their_leads_or_twelve(n_leads):
    ecg, _ = tiny_batch(n=3, n_samples=100, dtype=torch.float32)
    teacher = ECGEncoder(n_chans=n_leads, n_times=100, width=8, n_heads=2, stem_channels=(8, 8))
    student = ECGStudent(n_chans=n_leads, n_times=100, width=8, n_heads=2, stem_channels=(8,))
    for model in (teacher, student):
        logits = model(ecg)
        assert logits.shape == (3, 5)
        assert torch.allclose(model(select_leads(ecg, n_leads)), logits)
    assert [lead_indices(n) for n in (1, 3)] == [(0,), (0, 1, 7)]  # I; I, II, V2
    with pytest.raises(UserError, match="n_times"):
        student(ecg[:, :2])


def test_a_checkpoint_written_with_the_old_size_names_loads(tmp_path):
    """Before the ECG models spoke the signal vocabulary their architecture said n_leads / n_classes / n_samples."""
    import json

    from workbench.models.ecg import load_ecg_model, save_ecg_model

    model = tiny_encoder(n_chans=3, dtype=torch.float32)
    save_ecg_model(model, tmp_path / "m.safetensors")
    architecture = json.loads((tmp_path / "m.json").read_text())
    assert {"n_chans", "n_outputs", "n_times"} <= set(architecture)
    old = {{"n_chans": "n_leads", "n_outputs": "n_classes", "n_times": "n_samples"}.get(k, k): v
           for k, v in architecture.items()}  # fmt: skip
    (tmp_path / "m.json").write_text(json.dumps(old))
    loaded = load_ecg_model(tmp_path / "m.safetensors")
    ecg, _ = tiny_batch(n=2, dtype=torch.float32)
    assert loaded.architecture == architecture and torch.equal(loaded(ecg), model(ecg))


def test_default_sizes_teacher_and_students():
    count = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    teacher = count(ECGEncoder())
    assert 100_000 <= teacher <= 300_000
    for n_leads in (1, 3, 12):
        assert teacher / count(ECGStudent(n_chans=n_leads)) >= 19
    tokens = ECGEncoder().stem(torch.zeros(1, 12, 1000))
    assert tokens.shape == (1, 72, 63)


def test_save_load_round_trip(tmp_path):
    ecg, _ = tiny_batch(n=2, dtype=torch.float32)
    for model in (tiny_encoder(n_chans=3, dtype=torch.float32), ECGStudent(n_chans=1, n_times=64)):
        path = tmp_path / f"{model.kind}.safetensors"
        save_ecg_model(model, path)
        loaded = load_ecg_model(path)
        assert type(loaded) is type(model) and loaded.architecture == model.architecture
        assert torch.equal(loaded(ecg), model(ecg))
    lora.apply(model)
    with pytest.raises(UserError, match="merge"):
        save_ecg_model(model, tmp_path / "adapted.safetensors")


def test_models_declare_groups_head_embedding_and_signal():
    teacher, student = tiny_encoder(n_chans=3), ECGStudent(n_chans=1, n_outputs=4, n_times=64).double()
    spec = teacher.workbench_spec
    assert (spec.family, spec.head, spec.embedding) == ("ecg", "classifier", "features")
    assert spec.signal.n_chans == 3 and spec.signal.n_outputs == 5 and spec.signal.n_times == 64
    assert [c["ch_name"] for c in spec.signal.chs_info] == ["I", "II", "V2"] and spec.signal.sfreq == 100.0
    assert "head" not in student.workbench_spec.adapter_target_groups  # the student has no head_hidden
    assert student.workbench_spec.signal.n_outputs == 4
    ecg, _ = tiny_batch(n=2)
    for model in (teacher, student):  # the head reads what the embedding hook gives
        head = model.get_submodule(model.workbench_spec.head)
        assert torch.equal(head(getattr(model, model.workbench_spec.embedding)(ecg)), model(ecg))


# -- LoRA -----------------------------------------------------------------------------------------


def outputs_on(ecg):
    return lambda model: {"logits": model(ecg)}


def test_lora_identity_merge_and_only_adapterstrain_stages():
    ecg, labels = tiny_batch()
    base = tiny_encoder()
    method = lora.LoRA()
    prepared = assert_identity_at_init(base, method, outputs_on(ecg))
    adapted = set(lora.lora_layers(prepared))
    convs_and_linears = {n for n, m in base.named_modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.Linear))}
    assert adapted == convs_and_linears - {"classifier"}  # every conv, qkv, proj, FFN and head_hidden
    trainable = {n for n, p in prepared.named_parameters() if p.requires_grad}
    lora_names = {n for n in trainable if ".lora_A." in n or ".lora_B." in n}
    assert trainable == lora_names | {"classifier.weight", "classifier.bias"}
    assert prepared.stem[0].conv.lora_B.weight.shape == (8, 16, 1)  # rank 16 as given, as PEFT does
    assert prepared.stem[0].conv.lora_A.weight.shape == (16, 12, 7)  # the base kernel

    def step(model):
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
        BCE(model(ecg), labels).backward()
        optimizer.step()

    assert_only_trainable_change(prepared, step)
    randomize(lora.adapter_parameters(prepared))  # B ≠ 0: merging must matter
    merged = assert_merge_equivalent(prepared, method, outputs_on(ecg), tol=1e-10)
    assert not lora.lora_layers(merged) and type(merged.layers[0].attention.qkv) is torch.nn.Linear
    assert set(merged.state_dict()) == set(base.state_dict())


def test_lora_adapter_save_load(tmp_path):
    ecg, _ = tiny_batch(n=2)
    model = lora.apply(tiny_encoder(), targets=["conv", "qkv"], rank=4, alpha=8, train=("classifier.*",))
    randomize([p for p in model.parameters() if p.requires_grad])
    lora.save_adapter(model, tmp_path / "adapter")
    loaded = tiny_encoder()
    report = lora.load_adapter(loaded, tmp_path / "adapter")
    assert not report.missing and not report.unexpected
    assert list(lora.lora_layers(loaded)) == [
        "stem.0.conv",
        "stem.1.conv",
        "layers.0.attention.qkv",
        "layers.1.attention.qkv",
    ]
    assert torch.equal(loaded(ecg), model(ecg))


def test_family_load_checks_the_sizes_it_knows():
    from workbench.models.ecg import ECGFamily

    model = ECGFamily().load(n_outputs=5, n_chans=12, in_features=99)  # other families' sizes are not its concern
    assert model.architecture["n_outputs"] == 5 and next(model.parameters()).dtype == torch.float32
    with pytest.raises(UserError, match="n_outputs 5 \\(the data needs 3\\)"):
        ECGFamily().load(n_outputs=3)


# -- H-Tuning -------------------------------------------------------------------------------------


def prepared_htuning(seed: int = 0, rank: int = 16):
    model = htuning.HTuning(rank=rank).prepare(tiny_encoder(seed=seed))
    theta, head = htuning.split_parameters(model)
    randomize(theta, seed=seed + 10)  # away from B = 0, where dL/dA vanishes
    return model, theta, head


def full_batch_gradients(model, params, ecg, labels):
    return torch.autograd.grad(BCE(model(ecg), labels), params)


def test_htuning_prepare_trains_lora_biases_and_classifier():
    ecg, _ = tiny_batch(n=2)
    model = assert_identity_at_init(tiny_encoder(), htuning.HTuning(), outputs_on(ecg))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "classifier.weight" in trainable and "layers.0.attention.qkv.base_layer.bias" in trainable
    factors = (".lora_A.default.weight", ".lora_B.default.weight", ".bias")  # PEFT's names: adapter "default"
    assert all(n.endswith(factors) or n == "classifier.weight" for n in trainable)
    theta, head = htuning.split_parameters(model)
    assert len(head) == 2 and len(theta) + 2 == len(trainable)
    assert head == [model.classifier.weight, model.classifier.bias]
    qkv = model.layers[0].attention.qkv  # the order H-Tuning's seeded z draws follow: bias, A, B per module
    position = next(i for i, p in enumerate(theta) if p is qkv.base_layer.bias)
    assert theta[position + 1] is qkv.lora_A.weight and theta[position + 2] is qkv.lora_B.weight


def test_c_one_is_the_sub_batch_backprop_gradient_and_head_is_exact():
    ecg, labels = tiny_batch()
    model, lora, head = prepared_htuning()
    expected_lora = torch.autograd.grad(BCE(model(ecg[:2]), labels[:2]), lora)
    expected_head = full_batch_gradients(model, head, ecg, labels)
    result = htuning.mixed_order_gradients(model, lora, head, BCE, ecg, labels, c=1.0, bp_batch=2, seed=3)
    assert all(torch.equal(p.grad, g) for p, g in zip(lora, expected_lora))
    assert all(torch.allclose(p.grad, g, rtol=1e-12, atol=1e-14) for p, g in zip(head, expected_head))
    assert result["loss"] == pytest.approx(BCE(model(ecg), labels).item(), rel=1e-12)


def test_chunked_graph_free_forwards_give_the_same_gradient():
    ecg, labels = tiny_batch()
    model, lora, head = prepared_htuning()
    whole = htuning.mixed_order_gradients(model, lora, head, BCE, ecg, labels, seed=4)
    gradients = [p.grad.clone() for p in lora + head]
    chunked = htuning.mixed_order_gradients(model, lora, head, BCE, ecg, labels, seed=4, chunk=3)
    assert len(ecg) % 3 != 0  # a ragged last chunk is weighted by its size
    assert chunked["projected_gradient"] == pytest.approx(whole["projected_gradient"], rel=1e-9)
    assert chunked["loss"] == pytest.approx(whole["loss"], rel=1e-12)
    for p, g in zip(lora + head, gradients):
        torch.testing.assert_close(p.grad, g, rtol=1e-9, atol=1e-14)


def test_default_method_is_chunked_and_gives_the_published_gradient():
    """The default `HTuning` runs its graph-free forwards in chunks; ``zo_chunk=0`` (the whole batch) gives the same
    gradient (float64, a batch of 20 records: chunks of 8, 8 and 4)."""
    ecg, labels = tiny_batch(n=20)
    assert 0 < htuning.HTuning().config["zo_chunk"] < len(ecg)
    gradients = {}
    for chunk in (None, 0):
        method = htuning.HTuning() if chunk is None else htuning.HTuning(zo_chunk=chunk)
        model = method.prepare(tiny_encoder())
        method.mixed_step(model, ecg, labels, BCE, seed=11)
        gradients[chunk] = [p.grad for p in model.parameters() if p.requires_grad]
    for chunked, whole in zip(gradients[None], gradients[0], strict=True):
        torch.testing.assert_close(chunked, whole, rtol=1e-9, atol=1e-14)
    with pytest.raises(UserError, match="zo-chunk"):
        htuning.HTuning(zo_chunk=-1)


def test_in_run_step_memory_ranks_full_above_htuning():
    """The run's ``training_step_bytes`` (a copy of the model, the trainer's steps) at a batch of 4 tiny records:
    full fine-tuning's gradients, Adam state and saved activations outweigh H-Tuning's (rank 2: on this 8-wide
    model rank-16 adapters would be larger than the weights they adapt)."""
    from types import SimpleNamespace

    from workbench.domains.ecg.task import EcgSample, PtbXl

    from workbench.core.method import PlanInputs
    from workbench.core.registry import methods
    from workbench.core.trainer import TrainSettings
    from workbench.run.stages import step_bytes as stage_step_bytes

    ecg, labels = tiny_batch(n=6, dtype=torch.float32)
    train = [EcgSample(e.numpy(), y.numpy(), str(i)) for i, (e, y) in enumerate(zip(ecg, labels))]
    data = SimpleNamespace(train=train, val=train[:1])
    task, settings = PtbXl(), TrainSettings(batch_size=4)
    step_bytes = {}
    for name, options in (("full", {}), ("htuning", {"rank": 2, "alpha": 2.0})):
        method = methods.get(name)(**options)
        model = method.prepare(tiny_encoder(dtype=torch.float32))
        method.setup(task, model, data, 0)
        stage = method.plan(task, model, data, PlanInputs(settings))[-1]
        step_bytes[name] = stage_step_bytes(stage, task, model, data, torch.device("cpu"))
    weights = 4 * sum(p.numel() for p in tiny_encoder().parameters())
    assert step_bytes["full"] > 4 * weights  # at least a gradient and three Adam/EMA copies of every weight
    assert step_bytes["full"] > 1.5 * step_bytes["htuning"] > 0, step_bytes


@pytest.mark.parametrize("exact_restore", [True, False])
def test_parameters_restored_after_zeroth_order_passes(exact_restore):
    ecg, labels = tiny_batch()
    model, lora, head = prepared_htuning()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    htuning.mixed_order_gradients(model, lora, head, BCE, ecg, labels, seed=5, exact_restore=exact_restore)
    for name, p in model.named_parameters():
        if exact_restore:
            assert torch.equal(p, before[name]), name
        else:  # MeZO-style +eps·z, −2eps·z, +eps·z: equal up to rounding
            assert torch.allclose(p, before[name], rtol=0, atol=1e-15), name


def test_zeroth_order_estimate_is_unbiased():
    """E_z[(z·g) z] = g for z ~ N(0, I): the mean of N estimates projects onto ĝ with ‖g‖·(1 ± sqrt(2/N)).

    (z·g)(z·ĝ) = ‖g‖ (z·ĝ)², a scaled χ²₁ of mean 1 and variance 2: with N = 300, 4 standard deviations are
    ±0.33 — the bound below. The component orthogonal to g has norm ≈ ‖g‖·sqrt(n/N), so the cosine of the
    mean is ≈ 1 / sqrt(1 + n/N) (n = number of parameters); it must clearly exceed half of that.
    """
    ecg, labels = tiny_batch()
    model, lora, _ = prepared_htuning(rank=1)
    exact = flat(full_batch_gradients(model, lora, ecg, labels))
    n_seeds = 300
    mean = (
        sum(
            flat(htuning.zeroth_order_gradient(model, lora, BCE, ecg, labels, eps=1e-3, seed=s)) for s in range(n_seeds)
        )
        / n_seeds
    )
    projection = float(mean @ exact / exact.norm() ** 2)
    assert 1 - 4 * math.sqrt(2 / n_seeds) <= projection <= 1 + 4 * math.sqrt(2 / n_seeds)
    assert cosine(mean, exact) >= 0.5 / math.sqrt(1 + exact.numel() / n_seeds)


def test_mixed_gradient_direction_and_scale():
    """With g_FO exact (bp_batch = batch) and global norm matching, g = c·∇ + (1−c)·‖∇‖·u, ‖u‖ = 1, so
    cos(g, ∇) ≥ 2c − 1 and (2c − 1)·‖∇‖ ≤ ‖g‖ ≤ ‖∇‖ for every z. With the ZO term alone (c = 0), averaged over
    seeds, E[sign(z·∇) z/‖z‖] ∝ ∇ per tensor (scaled by ‖g_FO,p‖ > 0): the mean has a positive cosine with ∇."""
    ecg, labels = tiny_batch()
    model, lora, head = prepared_htuning(rank=1)
    exact = flat(full_batch_gradients(model, lora, ecg, labels))
    c = 0.9
    for seed in range(3):
        htuning.mixed_order_gradients(
            model, lora, head, BCE, ecg, labels, c=c, bp_batch=len(ecg), seed=seed, norm_match="global"
        )
        mixed = flat(p.grad for p in lora)
        assert cosine(mixed, exact) >= 2 * c - 1 - 1e-9
        assert (2 * c - 1) * exact.norm() - 1e-12 <= mixed.norm() <= exact.norm() + 1e-12
    # per-tensor matching (the authors'): each tensor's norm within [(2c−1), 1]·‖g_FO,p‖, bp_batch = 2
    sub_batch = torch.autograd.grad(BCE(model(ecg[:2]), labels[:2]), lora)
    htuning.mixed_order_gradients(model, lora, head, BCE, ecg, labels, c=c, bp_batch=2, seed=7)
    for p, g_fo in zip(lora, sub_batch):
        assert (2 * c - 1) * g_fo.norm() - 1e-12 <= p.grad.norm() <= g_fo.norm() + 1e-12
    n_seeds = 200
    mean = 0
    for seed in range(n_seeds):
        htuning.mixed_order_gradients(model, lora, head, BCE, ecg, labels, c=0.0, bp_batch=len(ecg), seed=seed)
        mean = mean + flat(p.grad for p in lora) / n_seeds
    assert cosine(mean, exact) >= 0.2


def test_mixed_order_rejects_bad_arguments():
    ecg, labels = tiny_batch()
    model, lora, head = prepared_htuning()
    with pytest.raises(UserError, match="c must"):
        htuning.mixed_order_gradients(model, lora, head, BCE, ecg, labels, c=1.5)
    with pytest.raises(UserError, match="both"):
        htuning.mixed_order_gradients(model, lora, lora[:1], BCE, ecg, labels)
    with pytest.raises(UserError, match="bp_batch"):
        htuning.mixed_order_gradients(model, lora, head, BCE, ecg, labels, bp_batch=99)


def test_htuning_step_trains_with_an_optimizer():
    ecg, labels = tiny_batch()
    method = htuning.HTuning()
    model = method.prepare(tiny_encoder())

    def step(model):
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        for seed in range(3):
            optimizer.zero_grad(set_to_none=True)
            method.mixed_step(model, ecg, labels, BCE, seed=seed)
            optimizer.step()

    assert_only_trainable_change(model, step)


# -- distillation ---------------------------------------------------------------------------------


def test_distillation_loss_is_hard_plus_weighted_soft_bce():
    generator = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(4, 5, generator=generator), torch.randn(4, 5, generator=generator)
    labels = (torch.rand(4, 5, generator=generator) > 0.5).float()
    expected = BCE(student, labels) + 0.5 * BCE(student, torch.sigmoid(teacher))
    assert torch.allclose(distillation_loss(student, teacher, labels, weight=0.5), expected)
    with pytest.raises(UserError, match="shape"):
        distillation_loss(student, teacher[:2], labels)


def synthetic_ecg(n: int, seed: int, n_samples: int = 128):
    """Lead I carries a sine of frequency 2, 5 or 11 cycles per record for each present class (3 classes)."""
    generator = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, 3, generator=generator) > 0.5).float()
    time = torch.linspace(0, 1, n_samples)
    waves = torch.stack([torch.sin(2 * math.pi * f * time) for f in (2.0, 5.0, 11.0)])  # (3, n_samples)
    ecg = 0.3 * torch.randn(n, 12, n_samples, generator=generator)
    ecg[:, 0] += labels @ waves
    return ecg, labels


class SpectralTeacher(torch.nn.Module):
    """A fixed, confident teacher: logit ±3 by whether lead I's spectrum peaks at each class's frequency."""

    def forward(self, ecg: torch.Tensor) -> torch.Tensor:
        spectrum = torch.fft.rfft(ecg[:, 0]).abs()[:, [2, 5, 11]]  # bins of 2, 5, 11 cycles per record
        return 3.0 * torch.sign(spectrum - 0.25 * ecg.shape[-1])


def test_distillation_improves_a_one_lead_student():
    ecg, labels = synthetic_ecg(64, seed=0)
    test_ecg, test_labels = synthetic_ecg(64, seed=1)
    method = Distill(weight=1.0, n_leads=1)
    method.set_teacher(SpectralTeacher())
    assert ((method.teacher(test_ecg) > 0).float() == test_labels).float().mean() > 0.95
    torch.manual_seed(0)
    student = method.prepare(ECGStudent(n_outputs=3, n_times=128))  # the base fixes classes and record length
    assert isinstance(student, ECGStudent) and student.architecture["n_chans"] == 1
    with torch.no_grad():
        before = BCE(student(test_ecg), test_labels).item()
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    for _ in range(60):
        optimizer.zero_grad()
        method.loss(None, student, (ecg, labels), True).backward()
        optimizer.step()
    with torch.no_grad():
        logits = student(test_ecg)
    assert BCE(logits, test_labels).item() < 0.8 * before
    assert ((logits > 0).float() == test_labels).float().mean() > 0.75  # chance: 0.5


def test_time_cutmix_swaps_one_segment_with_a_partner_record():
    from workbench.adaptation.distill import time_cutmix

    torch.manual_seed(0)
    ecg = torch.arange(6, dtype=torch.float64)[:, None, None].expand(6, 12, 200).clone()  # record i is all i
    mixed = time_cutmix(ecg, low=0.1, high=0.5)
    assert mixed.shape == ecg.shape
    for i in range(6):
        changed = (mixed[i] != i).any(dim=0)  # time steps taken from elsewhere, the same for every lead
        assert torch.equal((mixed[i] != i), changed.expand(12, -1))
        steps = changed.nonzero().flatten()
        if len(steps):  # one contiguous segment, 10-50 % long, from one partner record
            assert steps[-1] - steps[0] + 1 == len(steps) and 20 <= len(steps) <= 100
            assert len(mixed[i][:, steps].unique()) == 1


def test_htuning_saves_its_adapter_under_the_file_names_earlier_runs_used():
    """Run files name LoRA factors as PEFT's files do (``<module>.lora_A.weight``), not by the in-memory adapter
    name (``<module>.lora_A.default.weight``): adapters written before one layer held several still load."""
    from workbench.core.registry import methods

    method = methods.get("htuning")(rank=2, alpha=2.0)
    model = method.prepare(tiny_encoder(dtype=torch.float32))
    state = method.trainable_state(model)
    assert any(name.endswith(".lora_A.weight") for name in state) and not any(".default." in name for name in state)
    method.load_trainable_state(method.prepare(tiny_encoder(dtype=torch.float32)), state)


@pytest.mark.parametrize(
    "options",
    [{"lora_scaling": "rslora"}, {"init": "pissa"}, {"dora": True}, {"reparam": "replora"}],
    ids=["rslora", "pissa", "dora", "replora"],
)
def test_htuning_takes_the_lora_refinements_and_its_mixed_step_trains_them(options):
    """H-Tuning's adapters carry the refinement (the same LoRA package), start as the identity, and its mixed-order
    step moves exactly the trainable parameters (a refinement's own ones included: DoRA's magnitude, RepLoRA's MLP)."""
    ecg, labels = tiny_batch()
    method = htuning.HTuning(rank=2, alpha=2.0, **options)
    model = assert_identity_at_init(tiny_encoder(), method, outputs_on(ecg))
    config = model.layers[0].attention.qkv.adapters["default"]
    assert all(getattr(config, name.removeprefix("lora_")) == value for name, value in options.items())
    theta, _ = htuning.split_parameters(model)
    in_theta = {name for name, p in model.named_parameters() if any(p is q for q in theta)}
    for option, word in (("dora", "magnitude"), ("reparam", "reparam")):
        assert (option in options) == any(word in name for name in in_theta)  # a refinement's own parameters

    def step(model):
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        for seed in range(2):
            optimizer.zero_grad(set_to_none=True)
            method.mixed_step(model, ecg, labels, BCE, seed=seed)
            assert all(torch.isfinite(p.grad).all() for p in theta if p.grad is not None)
            optimizer.step()

    assert_only_trainable_change(model, step)
