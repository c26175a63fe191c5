"""EEG model families (labram, eegnet, shallow): shapes, specs, the channel contract, LoRA on LaBraM's declared
groups, workbench checkpoints, and converted LaBraM state dicts with their load report."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
import torch
from torch import nn
from workbench.adaptation import lora
from workbench.models.eeg import LABRAM_TARGET_GROUPS, LabramClassifier, load_eeg_model, save_eeg_model

from workbench.core.checkpoint import save_tensors
from workbench.core.errors import UserError
from workbench.core.model import SignalSpec
from workbench.core.registry import models

#: BCI Competition IV 2a's 22 EEG channels (10-20 names), 250 Hz, 2 s windows.
BCI_IV_2A = ["Fz", "FC3", "FC1", "FCz", "FC2", "FC4", "C5", "C3", "C1", "Cz", "C2", "C4", "C6", "CP3", "CP1", "CPz",
             "CP2", "CP4", "P1", "Pz", "P2", "POz"]  # fmt: skip
#: Nine motor-strip channels as in PhysioNet EEGMMIDB after standardising its dotted names, 160 Hz, 4 s windows.
MOTOR_9 = ["C3", "Cz", "C4", "FC3", "FCz", "FC4", "CP3", "CPz", "CP4"]
SHAPES = [(BCI_IV_2A, 250.0, 500), (MOTOR_9, 160.0, 640)]


def sizes(names, sfreq, n_times, n_outputs=4):
    return {
        "n_chans": len(names),
        "n_outputs": n_outputs,
        "n_times": n_times,
        "sfreq": sfreq,
        "chs_info": [{"ch_name": n} for n in names],
    }


def small_labram(names=MOTOR_9, sfreq=160.0, n_times=320, n_outputs=3, seed=0, **options) -> LabramClassifier:
    torch.manual_seed(seed)
    options = {"num_layers": 2, **options}
    return models.get("labram")().load(**sizes(names, sfreq, n_times, n_outputs), **options)


def batch(n_chans, n_times, n=4, seed=1, dtype=torch.float32):
    return torch.randn(n, n_chans, n_times, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# -- shapes and specs -----------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["labram", "eegnet", "shallow"])
@pytest.mark.parametrize("names, sfreq, n_times", SHAPES)
def test_forward_shapes_and_signal_spec(family, names, sfreq, n_times):
    model = models.get(family)().load(**sizes(names, sfreq, n_times))
    assert model(batch(len(names), n_times, n=3)).shape == (3, 4)
    spec = model.workbench_spec
    assert spec.family == family
    assert spec.signal == SignalSpec(len(names), 4, n_times, sfreq, tuple({"ch_name": n} for n in names))
    assert isinstance(model.get_submodule(spec.head), nn.Module)
    assert bool(spec.adapter_target_groups) == (family == "labram")
    # batch norms track their statistics fast enough for small EEG sets (braindecode's EEGNet default is 0.01)
    assert all(m.momentum == 0.1 for m in model.modules() if isinstance(m, nn.BatchNorm2d))


def test_labram_picks_one_second_patches_and_refuses_partial_patches():
    model = small_labram()  # 160 Hz: 160-sample patches, 2 patches; tokens 4 × ceil(160 / 8) = 80 wide
    assert model.architecture["patch_size"] == 160
    assert model.labram.cls_token.shape[-1] == 80
    assert model.features(batch(9, 320)).shape == (4, 80)
    with pytest.raises(UserError, match="whole number of 160-sample patches"):
        small_labram(n_times=300)
    with pytest.raises(UserError, match="expects eeg"):
        model(batch(8, 320))


def test_families_need_the_sizes():
    with pytest.raises(UserError, match="n_times"):
        models.get("eegnet")().load(n_chans=3, n_outputs=2, sfreq=100.0)
    with pytest.raises(UserError, match="channel names"):
        models.get("labram")().load(n_chans=2, n_outputs=2, n_times=200, sfreq=100.0)


# -- the channel contract -------------------------------------------------------------------------


def test_labram_refuses_a_channel_outside_its_vocabulary_and_accepts_an_explicit_map():
    names = ["Fpz-Cz", "Pz-Oz"]
    with pytest.raises(UserError, match=r"\['Fpz-Cz', 'Pz-Oz'\].*channel_map"):
        models.get("labram")().load(**sizes(names, 100.0, 3000, 5), num_layers=1)
    model = models.get("labram")().load(
        **sizes(names, 100.0, 3000, 5), num_layers=1, channel_map={"Fpz-Cz": "FPZ", "Pz-Oz": "PZ"}
    )
    assert model.architecture["channel_map"] == {"Fpz-Cz": "FPZ", "Pz-Oz": "PZ"}
    assert model.labram_names == ["FPZ", "PZ"]
    assert [c["ch_name"] for c in model.workbench_spec.signal.chs_info] == names
    assert model(batch(2, 3000, n=2)).shape == (2, 5)
    with pytest.raises(UserError, match="not among the data's channels"):
        models.get("labram")().load(**sizes(names, 100.0, 3000, 5), channel_map={"Fpz-Cz": "FPZ", "EOG": "PZ"})
    with pytest.raises(UserError, match="each electrode may appear once"):
        models.get("labram")().load(**sizes(names, 100.0, 3000, 5), channel_map={"Fpz-Cz": "FPZ", "Pz-Oz": "FPZ"})


def test_labram_embeds_channels_by_name_as_braindecode_does():
    model = small_labram().eval()
    x = batch(9, 320)
    expected = model.labram(x, ch_names=[n.upper() for n in MOTOR_9])
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    reordered = small_labram(names=MOTOR_9[::-1]).eval()  # same weights (seed), channels named in another order
    torch.testing.assert_close(reordered(x.flip(1)), model(x), rtol=1e-5, atol=1e-6)


# -- LoRA target groups ---------------------------------------------------------------------------


def test_labram_target_groups_match_exactly_the_qkv_mlp_and_temporal_conv_layers():
    model = small_labram()
    layers = {n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))}
    for group, patterns in LABRAM_TARGET_GROUPS.items():
        for pattern in patterns:
            assert any(fnmatchcase(n, pattern) for n in layers), f"{group}: {pattern} matches no layer"
    grouped = {n for n in layers if any(fnmatchcase(n, p) for ps in LABRAM_TARGET_GROUPS.values() for p in ps)}
    expected = {f"labram.blocks.{i}.{part}" for i in range(2) for part in ("attn.qkv", "mlp.0", "mlp.2")}
    expected |= {f"labram.patch_embed.temporal_conv.conv{i}" for i in (1, 2, 3)}
    assert grouped == expected
    assert layers - grouped == {"labram.blocks.0.attn.proj", "labram.blocks.1.attn.proj", "labram.final_layer"}


def test_lora_on_conv_and_qkv_starts_at_the_base_trains_only_adapters_and_merges_exactly():
    model = small_labram().double().eval()
    x = batch(9, 320, dtype=torch.float64)
    base = model(x).detach()
    lora.apply(model, targets=["conv", "qkv"], rank=4, alpha=8)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert sorted(lora.lora_layers(model)) == sorted(
        [f"labram.blocks.{i}.attn.qkv" for i in range(2)]
        + [f"labram.patch_embed.temporal_conv.conv{i}" for i in (1, 2, 3)]
    )
    torch.testing.assert_close(model(x), base, rtol=0, atol=1e-12)

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    for _ in range(2):  # the first step moves only B (A's gradient is zero while B = 0)
        optimizer.zero_grad()
        model(x).square().sum().backward()
        optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert changed and all(".lora_A." in n or ".lora_B." in n for n in changed)
    assert any("attn.qkv.lora_B" in n for n in changed)  # the fused qkv did learn

    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():  # larger adapters than two steps give: first on the fused qkv alone, then on the convs too
        for name, layer in lora.lora_layers(model).items():
            scale = 0.3 if "qkv" in name else 0.0
            layer.lora_B.weight.copy_(scale * torch.randn(layer.lora_B.weight.shape, generator=generator))
        only_qkv = model(x).detach()
        for name, layer in lora.lora_layers(model).items():
            layer.lora_B.weight.copy_(0.3 * torch.randn(layer.lora_B.weight.shape, generator=generator))
    assert (only_qkv - base).norm() > 1e-2 * base.norm()  # the fused qkv adapter reaches the output
    adapted = model(x).detach()
    lora.merge(model)
    assert not lora.lora_layers(model)
    assert (model(x) - adapted).norm() <= 1e-10 * adapted.norm()


def test_conv_rank_rule_applies_to_the_temporal_convolutions():
    model = lora.apply(small_labram(), targets=["conv", "fc"], rank=4, alpha=8, conv_rank="rule")
    layers = lora.lora_layers(model)
    for name, layer in layers.items():
        base = layer.base_layer
        if isinstance(base, nn.Conv2d):
            expected = lora.conv_rule_rank(base.in_channels, base.out_channels, base.weight.shape[2:].numel())
            assert layer.rank == expected == 2, name  # (4, 1, 1, 15) and (4, 4, 1, 3) weights: rank 2
        else:
            assert layer.rank == 4, name


# -- workbench checkpoints ------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["labram", "eegnet", "shallow"])
def test_save_load_round_trip_and_size_checks(family, tmp_path):
    torch.manual_seed(0)
    options = {"num_layers": 1} if family == "labram" else {}
    model = models.get(family)().load(**sizes(MOTOR_9, 160.0, 320), **options).eval()
    path = tmp_path / f"{family}.safetensors"
    save_eeg_model(model, path)
    assert models.get(family)().files(path) == [path, path.with_suffix(".json")]
    loaded = models.get(family)().load(path, **sizes(MOTOR_9, 160.0, 320)).eval()
    x = batch(9, 320)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert loaded.workbench_spec == model.workbench_spec
    assert load_eeg_model(path).architecture == model.architecture
    with pytest.raises(UserError, match=r"n_times 320 \(the data needs 640\)"):
        models.get(family)().load(path, **sizes(MOTOR_9, 160.0, 640))
    with pytest.raises(UserError, match="ch_names"):
        models.get(family)().load(path, **sizes(MOTOR_9[::-1], 160.0, 320))
    with pytest.raises(UserError, match="fresh models only"):  # an option the checkpoint does not record
        models.get(family)().load(path, **sizes(MOTOR_9, 160.0, 320), depth_of_nothing=3)
    if family == "labram":  # an option it records must equal the saved value, like a size
        with pytest.raises(UserError, match=r"patch_size 160 \(the data needs 32\)"):
            models.get(family)().load(path, **sizes(MOTOR_9, 160.0, 320), patch_size=32)
        models.get(family)().load(path, **sizes(MOTOR_9, 160.0, 320), patch_size=160)
    other = "shallow" if family != "shallow" else "eegnet"
    with pytest.raises(UserError, match=f"--model {family}"):
        models.get(other)().load(path)


def test_an_adapted_model_is_not_saved_unmerged(tmp_path):
    model = lora.apply(small_labram(), targets=["qkv"], rank=2)
    with pytest.raises(UserError, match="merge them first"):
        save_eeg_model(model, tmp_path / "m.safetensors")


# -- converted LaBraM state dicts -----------------------------------------------------------------


def original_layout(model: LabramClassifier, time_rows: int = 16) -> dict[str, torch.Tensor]:
    """``model``'s braindecode tensors under the original LaBraM repository's names (pretraining checkpoint)."""
    out = {}
    for name, value in model.labram.state_dict().items():
        name = name.replace("mlp.0.", "mlp.fc1.").replace("mlp.2.", "mlp.fc2.").replace("temporal_conv.", "")
        name = {"position_embedding": "pos_embed", "temporal_embedding": "time_embed"}.get(name, name)
        name = name.replace("final_layer.", "head.")
        if name == "time_embed":  # LaBraM's has 16 rows; this model uses the first ones
            value = torch.cat([value, torch.randn(1, time_rows - value.shape[1], value.shape[2])], dim=1)
        out["student." + name] = value
    return out


def test_converted_labram_state_dict_loads_with_a_report(tmp_path, caplog):
    source = small_labram(seed=3).eval()
    state = original_layout(source)
    n_tensors = len(state)
    state["student.lm_head.weight"] = torch.randn(8192, 80)  # LaBraM's pretraining head: not the model's
    path = tmp_path / "labram-base-converted.safetensors"
    save_tensors(path, state)

    loaded = models.get("labram")().load(path, **sizes(MOTOR_9, 160.0, 320, 3)).eval()
    report = loaded.load_report
    assert len(report.matched) == n_tensors and not report.missing and not report.head_replaced
    assert report.unexpected == ("lm_head.weight",)
    assert report.renamed == n_tensors + 1
    assert report.adjusted == ("temporal_embedding: the first 3 of the file's 16 rows",)
    assert loaded.architecture["num_layers"] == 2  # read from the file
    x = batch(9, 320)
    torch.testing.assert_close(loaded(x), source(x), rtol=0, atol=0)
    assert "unexpected 1 (ignored): lm_head.weight" in caplog.text

    # another number of classes: the head is replaced and said so; a missing tensor is reported
    del state["student.norm.weight"]
    save_tensors(path, state)
    other = models.get("labram")().load(path, **sizes(MOTOR_9, 160.0, 320, 5))
    report = other.load_report
    assert report.head_replaced and "final_layer.weight" not in report.matched
    assert set(report.missing) == {"norm.weight", "final_layer.weight", "final_layer.bias"}
    assert len(report.matched) == n_tensors - 3
    qkv = "blocks.0.attn.qkv.weight"
    torch.testing.assert_close(other.labram.state_dict()[qkv], source.labram.state_dict()[qkv], rtol=0, atol=0)
    assert "head final_layer replaced" in str(report)


def test_converted_state_dict_refuses_zero_matches_a_wrong_shape_and_too_long_windows(tmp_path):
    path = tmp_path / "not-labram.safetensors"
    save_tensors(path, {"encoder.weight": torch.zeros(3, 3)})
    with pytest.raises(UserError, match=r"not-labram\.safetensors: none of its 1 tensors"):
        models.get("labram")().load(path, **sizes(MOTOR_9, 160.0, 320, 3))

    state = original_layout(small_labram())
    state["student.blocks.1.attn.proj.weight"] = torch.zeros(80, 40)
    save_tensors(path, state)
    with pytest.raises(UserError, match=r"tensor 'blocks.1.attn.proj.weight': expected shape \(80, 80\)"):
        models.get("labram")().load(path, **sizes(MOTOR_9, 160.0, 320, 3))

    save_tensors(path, original_layout(small_labram()))  # 80-wide tokens: 160-sample patches
    with pytest.raises(UserError, match="tokens are 80 wide.*resample"):
        models.get("labram")().load(path, **sizes(MOTOR_9, 250.0, 500, 3))

    save_tensors(path, original_layout(small_labram(), time_rows=3))
    with pytest.raises(UserError, match="temporal_embedding"):
        models.get("labram")().load(path, **sizes(MOTOR_9, 160.0, 160 * 4, 3))


def test_labram_attention_calling_its_qkv_module_is_braindecodes_function():
    """LabramClassifier swaps braindecode's attention for one that calls qkv (so adapters see its input): same keys,
    and the same outputs as braindecode's own forward, with and without q/v biases."""
    from braindecode.models.labram import _Attention

    for qkv_bias in (False, True):
        model = small_labram(qkv_bias=qkv_bias).double().eval()
        attention = model.labram.blocks[0].attn
        assert type(attention).__name__ == "QkvModuleAttention" and isinstance(attention, _Attention)
        if qkv_bias:
            with torch.no_grad():
                attention.q_bias.normal_(), attention.v_bias.normal_()
        tokens = torch.randn(3, 7, model.labram.cls_token.shape[-1], dtype=torch.float64)
        torch.testing.assert_close(attention(tokens), _Attention.forward(attention, tokens), rtol=0, atol=1e-12)
        assert "labram.blocks.0.attn.qkv.weight" in model.state_dict()


def test_lora_dropout_acts_on_labrams_fused_qkv_input():
    """The seed's LoRA (dropout 0.5 on qkv's input): random in training, none in eval, identity at init."""
    model = small_labram().double()
    x = batch(9, 320, dtype=torch.float64)
    base = model.eval()(x).detach()
    lora.apply(model, targets=["conv", "qkv"], rank=4, alpha=8, dropout=0.5)
    layer = lora.lora_layers(model)["labram.blocks.0.attn.qkv"]
    torch.testing.assert_close(model.eval()(x), base, rtol=0, atol=1e-12)
    with torch.no_grad():
        layer.lora_B.weight.normal_()
    model.train()
    torch.manual_seed(0)
    first = model(x)
    torch.manual_seed(1)
    assert not torch.allclose(first, model(x))  # another dropout mask on the qkv adapter's input
    model.eval()
    torch.testing.assert_close(model(x), model(x), rtol=0, atol=0)
