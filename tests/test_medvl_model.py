"""The medvl model (workbench.models.medvl) and its VQ image tokenizer (workbench.models.vq): the word tokenizer,
the sequence and its answer-only loss against a hand-computed cross-entropy, which ViT layer each kind reads,
batched greedy decoding against one-by-one decoding, constrained image generation, the VQ's straight-through
gradient and EMA codebook, checkpoints (the shipped one and broken ones), and the LoRA target groups."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from workbench.adaptation.lora.model import target_names
from workbench.models.medvl import (
    BOS,
    EOS,
    IGNORE,
    IMAGE_PLACEHOLDER,
    SEP,
    SHIPPED_CHECKPOINT,
    UNK,
    MedVL,
    MedVLConfig,
    MedVLFamily,
    WordTokenizer,
    load_medvl,
    save_medvl,
)
from workbench.models.vq import VQConfig, VQTokenizer, psnr, ssim

from workbench.core.errors import UserError
from workbench.core.registry import models

WORDS = "is there a lesion in the upper lower left right quadrant ? yes no . , what modality ct mr image".split()
QUESTIONS = [
    "<image>\nis there a lesion?",
    "what modality is this image?",
    "is there a lesion in the upper left quadrant?",
]
ANSWERS = ["yes.", "ct", "no, there is no lesion."]
#: The PSNR [dB] the shipped tokenizer must reach on held-out rendered images (it reached more: see the card).
SHIPPED_PSNR_FLOOR_DB = 26.0


def tiny_config(**changes) -> MedVLConfig:
    vq = VQConfig(codebook_size=16, code_dim=8, channels=8, res_blocks=1)
    sizes = dict(vision_hidden=16, vision_heads=2, vision_intermediate=32, lm_hidden=32, lm_heads=2, lm_intermediate=64)
    return MedVLConfig(**{**sizes, "vq": vq, **changes})


def tiny(seed: int = 0, dtype=torch.float64, **changes) -> MedVL:
    torch.manual_seed(seed)
    return MedVL(tiny_config(**changes), WORDS).to(dtype).eval()


def images(n: int = 3, seed: int = 1, dtype=torch.float64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 64, 64, generator=generator, dtype=dtype)


# ---- tokenizer -------------------------------------------------------------------------------------------------


def test_tokenizer_round_trip_layout_and_unknown_words():
    tok = WordTokenizer(WORDS, codebook_size=16)
    text = "is there a lesion in the upper left quadrant? yes, ct."
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.split("Is There 2.5 mm?") == ["is", "there", "2.5", "mm", "?"]
    assert tok.tokens[:5] == ("<pad>", "<unk>", "<bos>", "<eos>", "<sep>")
    assert tok.tokens[tok.start_index_id] == "<start_index>" and tok.tokens[tok.end_index_id] == "<end_index>"
    assert tok.tokens[tok.first_code_id + 15] == "<idx_15>" and len(tok) == 5 + len(WORDS) + 2 + 16
    assert not tok.unknown
    ids = tok.encode("Is there a tumour, a tumour? <sep> <idx_3>")
    assert ids.count(UNK) == 4 and tok.unknown == {"tumour": 2, "<sep>": 1, "<idx_3>": 1}
    assert tok.decode([BOS, *tok.encode("yes."), EOS]) == "yes."
    built = WordTokenizer.from_corpus(["<image>\nA b a.", "b a c?"], codebook_size=4)
    assert built.words == ("a", "b", ".", "?", "c")  # most frequent first, no <image>
    with pytest.raises(UserError, match="reserved"):
        WordTokenizer(["a", "<sep>"], 4)
    with pytest.raises(UserError, match="repeated"):
        WordTokenizer(["a", "a"], 4)


# ---- sequence and loss -------------------------------------------------------------------------------------------


def test_forward_shapes_and_labels_cover_the_answer_only():
    model = tiny()
    batch = model.encode_batch(images(), QUESTIONS, ANSWERS)
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    n_patches = model.config.n_patches
    assert ids.shape == labels.shape == mask.shape and ids.shape[0] == 3
    assert ((ids == IMAGE_PLACEHOLDER).sum(1) == n_patches).all()
    assert (ids[:, 0] == BOS).all() and (ids[:, 1 : 1 + n_patches] == IMAGE_PLACEHOLDER).all()
    for row in range(3):  # the labelled positions: right after <sep>, up to and including <eos>
        sep = int((ids[row] == SEP).nonzero())
        answer = model.tokenizer.encode(ANSWERS[row]) + [EOS]
        assert labels[row, sep + 1 : sep + 1 + len(answer)].tolist() == answer
        assert (labels[row, : sep + 1] == IGNORE).all() and (labels[row, sep + 1 + len(answer) :] == IGNORE).all()
        assert mask[row].sum() == sep + 1 + len(answer)
    out = model(**batch)
    assert out.logits.shape == (*ids.shape, len(model.tokenizer)) and out.loss.ndim == 0

    # Another question word: the same labels count, the loss moves only through the context
    other = model.encode_batch(images(), [q.replace("lesion", "image") for q in QUESTIONS], ANSWERS)
    torch.testing.assert_close(other["labels"] != IGNORE, labels != IGNORE, rtol=0, atol=0)
    assert not torch.equal(other["input_ids"], ids)


def test_loss_equals_a_hand_computed_cross_entropy():
    model = tiny()
    batch = model.encode_batch(images(), QUESTIONS, ANSWERS)
    out = model(**batch)
    ids, labels = batch["input_ids"], batch["labels"]
    # By hand: the embeddings with the projected visual tokens, Llama, and −log p of each answer token
    visual = model.projector_comprehension(
        model.vision(pixel_values=(images() - 0.5) / 0.5, output_hidden_states=True).hidden_states[-2][:, 1:]
    )
    terms = []
    for row in range(3):
        embeds = model.lm.get_input_embeddings()(ids[row].clamp_min(0)).clone()
        embeds[1 : 1 + model.config.n_patches] = visual[row]
        n = int(batch["attention_mask"][row].sum())
        logits = model.lm(inputs_embeds=embeds[None, :n]).logits[0]  # right padding: the real tokens alone
        for t in range(1, n):
            if labels[row, t] != IGNORE:
                terms.append(-torch.log_softmax(logits[t - 1], -1)[labels[row, t]])
    assert len(terms) == sum(len(model.tokenizer.encode(a)) + 1 for a in ANSWERS)
    torch.testing.assert_close(out.loss, torch.stack(terms).mean(), rtol=1e-10, atol=1e-10)


def test_generation_sequence_holds_the_target_codes_between_start_and_end_index():
    model = tiny()
    target = images(seed=5)
    batch = model.encode_batch(images(), QUESTIONS, target, kind="generation")
    tok = model.tokenizer
    codes = model.vq.encode(target).flatten(1)
    for row in range(3):
        labelled = batch["labels"][row][batch["labels"][row] != IGNORE].tolist()
        assert labelled == [tok.start_index_id, *(codes[row] + tok.first_code_id).tolist(), tok.end_index_id, EOS]
    assert model(**batch).loss.isfinite()
    with pytest.raises(UserError, match="generation answers"):
        model.encode_batch(images(), QUESTIONS, ANSWERS, kind="generation")
    with pytest.raises(UserError, match="kind"):
        model.encode_batch(images(), QUESTIONS, ANSWERS, kind="captioning")
    with pytest.raises(UserError, match="2 images for 3 questions"):
        model.encode_batch(images(2), QUESTIONS, ANSWERS)


# ---- hierarchical visual perception ------------------------------------------------------------------------------


def test_comprehension_reads_layer_minus_2_and_generation_layer_1():
    model = tiny()
    x = images()
    before = {kind: model.visual_tokens(x, kind) for kind in ("comprehension", "generation")}
    hidden = model.vision(pixel_values=(x - 0.5) / 0.5, output_hidden_states=True).hidden_states
    torch.testing.assert_close(before["comprehension"], model.projector_comprehension(hidden[-2][:, 1:]))
    torch.testing.assert_close(before["generation"], model.projector_generation(hidden[1][:, 1:]))

    def after_perturbing(layer: int) -> dict[str, torch.Tensor]:
        perturbed = tiny()
        with torch.no_grad():
            perturbed.vision.layers[layer].mlp.fc2.weight.add_(0.5)
        return {kind: perturbed.visual_tokens(x, kind) for kind in before}

    last = after_perturbing(-1)  # read by neither kind
    torch.testing.assert_close(last["comprehension"], before["comprehension"], rtol=0, atol=0)
    torch.testing.assert_close(last["generation"], before["generation"], rtol=0, atol=0)
    third = after_perturbing(2)  # its output is hidden_states[3] = [-2]: comprehension's, after generation's
    assert (third["comprehension"] - before["comprehension"]).abs().max() > 1e-3
    torch.testing.assert_close(third["generation"], before["generation"], rtol=0, atol=0)
    first = after_perturbing(0)  # everybody reads through it
    assert (first["generation"] - before["generation"]).abs().max() > 1e-3


# ---- decoding -----------------------------------------------------------------------------------------------------


def sharp(model: MedVL) -> MedVL:
    """The same model with a 40× output head: greedy outputs depend strongly on the context (a sensitive test)."""
    with torch.no_grad():
        model.lm.lm_head.weight.mul_(40)
    return model


def trained(questions: list[str], answers: list[str], x: torch.Tensor, steps: int = 40) -> MedVL:
    """A tiny model fitted to answer ``questions`` about ``x`` with ``answers`` (distinct outputs to compare)."""
    model = tiny().train()
    optimiser = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = model.encode_batch(x, questions, answers)
    for _ in range(steps):
        optimiser.zero_grad()
        model(**batch).loss.backward()
        optimiser.step()
    return model.eval()


def test_batched_greedy_answers_equal_one_by_one_answers():
    questions = [QUESTIONS[0], "mr?", QUESTIONS[2], "what modality is this image, ct or mr?"]
    answers = ["yes, in the upper left.", "no.", "there is a lesion in the lower right quadrant.", "mr"]
    x = images(4, seed=3)
    model = trained(questions, answers, x)
    batched = model.answer(x, questions, max_new_tokens=12)
    alone = [model.answer(x[i : i + 1], [q], max_new_tokens=12)[0] for i, q in enumerate(questions)]
    assert batched == alone
    assert len(set(batched)) > 1  # the outputs differ from row to row: padding mistakes would show
    # The first step's logits themselves, left-padded against alone
    batch = model.encode_batch(x, questions, kind="comprehension", padding="left")
    assert (batch["attention_mask"] == 0).any()
    from workbench.models.medvl import position_ids

    embeds = model.embed(batch["images"], batch["input_ids"], "comprehension")
    mask = batch["attention_mask"]
    last = model.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids(mask)).logits[:, -1]
    for i, q in enumerate(questions):
        one = model.encode_batch(x[i : i + 1], [q], kind="comprehension")
        torch.testing.assert_close(last[i], model(**one).logits[0, -1], rtol=1e-9, atol=1e-9)
    words = model.answer(x, questions, max_new_tokens=12)
    assert all(w not in text for text in words for w in ("<idx_", "<start_index>", "<sep>", "<bos>", "<pad>"))


def test_generate_images_emits_only_index_tokens():
    model = sharp(tiny())
    tok = model.tokenizer
    is_code = lambda ids: (ids >= tok.first_code_id) & (ids < tok.end_index_id)  # noqa: E731
    batch = model.encode_batch(images(), QUESTIONS, kind="generation", padding="left")
    free = model._greedy(batch, 64, torch.ones(len(tok), dtype=torch.bool), stop=None)
    assert not is_code(free).all()  # unconstrained, this model writes other tokens too
    codes = model.generate_codes(images(), QUESTIONS)
    assert codes.shape == (3, 8, 8) and codes.dtype == torch.int64
    assert codes.min() >= 0 and codes.max() < tok.codebook_size
    out = model.generate_images(images(), QUESTIONS)
    assert out.shape == (3, 1, 64, 64) and out.min() >= 0 and out.max() <= 1
    torch.testing.assert_close(out, model.vq.decode(codes))
    batched = model.generate_codes(images(), QUESTIONS)
    alone = torch.cat([model.generate_codes(images()[i : i + 1], [q]) for i, q in enumerate(QUESTIONS)])
    torch.testing.assert_close(batched, alone, rtol=0, atol=0)


def test_the_batch_kind_picks_the_lora_plugin():
    from workbench.adaptation.lora.plugins import PluginConfig, active_plugin, apply_plugins
    from workbench.models.medvl import position_ids

    model = tiny()
    batch = model.encode_batch(images(), QUESTIONS, ANSWERS)
    base = model(**batch).logits
    apply_plugins(model, ["language"], {kind: PluginConfig(4, 8.0, 2) for kind in ("comprehension", "generation")})
    torch.manual_seed(3)
    with torch.no_grad():  # B = 0 at start: give both plug-ins an update
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    mask = batch["attention_mask"]
    embeds = model.embed(batch["images"], batch["input_ids"], "comprehension")

    def logits_with(plugin):
        with active_plugin(model, plugin):
            return model.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids(mask)).logits

    own = model(**batch).logits
    torch.testing.assert_close(own, logits_with("comprehension"))
    torch.testing.assert_close(logits_with(None), base)
    assert (own - base).abs().max() > 1e-3 and (own - logits_with("generation")).abs().max() > 1e-3


# ---- VQ tokenizer -------------------------------------------------------------------------------------------------


def test_vq_shapes_codes_straight_through_and_ema():
    torch.manual_seed(0)
    vq = VQTokenizer(VQConfig(codebook_size=32, code_dim=8, channels=16, res_blocks=1))
    x = images(4, dtype=torch.float32)
    codes = vq.encode(x)
    assert codes.shape == (4, 8, 8) and codes.dtype == torch.int64 and 0 <= codes.min() and codes.max() < 32
    out = vq.decode(codes)
    assert out.shape == (4, 1, 64, 64) and 0 <= out.min() and out.max() <= 1
    vq.eval()
    result = vq(x)
    result.reconstruction_loss.backward()  # the decoder's loss alone: reaches the encoder only straight through
    grad = vq.encoder[0].weight.grad
    assert grad is not None and grad.abs().sum() > 0
    torch.testing.assert_close(result.reconstruction, vq.decode(result.codes))
    # EMA: training mode moves the codebook (no gradient does), eval mode leaves it
    frozen = vq.codebook.clone()
    with torch.no_grad():
        vq(x)
    torch.testing.assert_close(vq.codebook, frozen, rtol=0, atol=0)
    vq.train()
    vq(x)
    assert bool(vq.initialised) and not torch.equal(vq.codebook, frozen)
    with pytest.raises(UserError, match="codes must lie"):
        vq.decode(torch.full((1, 8, 8), 32))
    with pytest.raises(UserError, match="expected images"):
        vq.encode(torch.rand(1, 3, 64, 64))


def test_psnr_and_ssim():
    x = images(2, dtype=torch.float32)
    assert torch.isinf(psnr(x, x)).all() or (psnr(x, x) > 100).all()
    noisy = (x + 0.1).clamp(0, 1)
    assert 15 < float(psnr(noisy, x).mean()) < 25
    assert math.isclose(float(ssim(x, x)), 1.0, abs_tol=1e-6) and float(ssim(noisy, x)) < 1


# ---- checkpoints and the family ------------------------------------------------------------------------------------


def test_checkpoint_round_trip_and_broken_checkpoints(tmp_path):
    model = tiny(dtype=torch.float32)
    path = tmp_path / "medvl.safetensors"
    save_medvl(model, path, {"what": "test"})
    loaded = load_medvl(path)
    assert loaded.config == model.config and loaded.tokenizer.tokens == model.tokenizer.tokens
    batch = model.encode_batch(images(dtype=torch.float32), QUESTIONS, ANSWERS)
    torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits)
    family = MedVLFamily()
    assert family.files(path) == [path]
    assert isinstance(family.load(path, lm_hidden=32), MedVL)
    with pytest.raises(UserError, match="lm_hidden 32 \\(asked for 64\\)"):
        family.load(path, lm_hidden=64)

    state, metadata = load_file(str(path)), json.loads(json.dumps(_metadata(path)))
    key = "lm.model.layers.0.self_attn.q_proj.weight"
    missing = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in state.items() if k != key}, str(missing), metadata)
    with pytest.raises(UserError, match=f"{missing}.*missing \\['{key}'\\]"):
        load_medvl(missing)
    wrong = tmp_path / "wrong.safetensors"
    save_file({**state, key: torch.zeros(3, 3)}, str(wrong), metadata)
    with pytest.raises(UserError, match=f"{wrong}: tensor '{key}': expected shape \\(32, 32\\), found \\(3, 3\\)"):
        load_medvl(wrong)
    no_words = tmp_path / "no_words.safetensors"
    save_file(state, str(no_words), {k: v for k, v in metadata.items() if k != "vocabulary"})
    with pytest.raises(UserError, match=f"{no_words}: metadata field 'vocabulary'"):
        family.load(no_words)
    bad_config = tmp_path / "bad_config.safetensors"
    save_file(state, str(bad_config), {**metadata, "config": json.dumps({"lm_width": 3})})
    with pytest.raises(UserError, match="unknown fields \\['lm_width'\\]"):
        load_medvl(bad_config)


def _metadata(path):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        return handle.metadata()


def test_family_is_registered_and_builds_fresh_models():
    assert models.get("medvl") is MedVLFamily and MedVLFamily.card == "medvl-tiny"
    fresh = MedVLFamily().load(pretrained=False, words=WORDS, **tiny_config().to_dict())
    assert fresh.config == tiny_config()
    with pytest.raises(UserError, match="words"):
        MedVLFamily().load(pretrained=False)
    with pytest.raises(UserError, match="unknown sizes \\['width'\\]"):
        MedVLFamily().load(pretrained=False, words=WORDS, width=3)
    with pytest.raises(UserError, match="comprehension_layer 7"):
        tiny_config(comprehension_layer=7)


def test_lora_groups_and_spec():
    model = tiny(dtype=torch.float32)
    spec = model.workbench_spec
    assert spec.family == "medvl" and spec.head == "lm.lm_head" and spec.embedding is None
    language = target_names(model, ["language"])
    expected = [
        f"lm.model.layers.{i}.{part}"
        for i in range(4)
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
        + ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    ]
    assert len(language) == 28 and sorted(language) == sorted(expected) and "lm.lm_head" not in language
    assert len(target_names(model, ["vision"])) == 4 * 6
    assert target_names(model, ["projectors"]) == [
        "projector_comprehension.0",
        "projector_comprehension.2",
        "projector_generation.0",
        "projector_generation.2",
    ]
    assert not any(p.requires_grad for p in model.vq.parameters())
    model.train()
    assert model.lm.training and not model.vq.training


# ---- the shipped checkpoint ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not SHIPPED_CHECKPOINT.is_file(), reason="the shipped medvl checkpoint is not made yet")
def test_shipped_checkpoint_loads_and_its_tokenizer_reconstructs_rendered_images():
    import numpy as np
    from workbench.domains.medvl.generate import render, sample_subject

    model = models.get("medvl")().load()
    assert model.config == MedVLConfig() and SHIPPED_CHECKPOINT.stat().st_size < 7_000_000
    rng = np.random.default_rng(12345)  # neither the embedded data's seed 0 nor pretraining's 7
    pictures = [render(sample_subject(rng), m, 64, rng) for m in ("ct", "mr") for _ in range(8)]
    x = torch.from_numpy(np.stack(pictures)[:, None]).float()
    with torch.no_grad():
        y = model.vq.decode(model.vq.encode(x))
    assert float(psnr(y, x).mean()) > SHIPPED_PSNR_FLOOR_DB
    answers = model.answer(x[:2], ["is there a lesion?", "what modality is this?"], max_new_tokens=5)
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
