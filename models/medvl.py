"""A tiny medical vision-language model (HealthGPT's layout) built from transformers configs: family ``medvl``.

HealthGPT (seed 000, METHODS.md "H-LoRA") joins a CLIP vision encoder, a 2-layer GELU projector per task kind, a
decoder-only language model and a VQGAN whose codes the language model writes as ``<idx_i>`` tokens. Here, at a
toy scale and with nothing downloaded (every part is built from a config and pretrained by
`workbench.domains.medvl.pretrain`):

- ``vision``: a `transformers.ViTModel` (64 × 64 × 1 images, 8 × 8 patches → 64 patch tokens + CLS, width 64,
  4 layers, no pooler). Images in [0, 1] are normalised inside the model, ``(x − image_mean) / image_std``.
- hierarchical visual perception: comprehension reads ``hidden_states[comprehension_layer = −2]`` (the output of
  the second-to-last layer, as HealthGPT reads CLIP's layer −2), generation reads
  ``hidden_states[generation_layer = 1]`` (after the first layer: shallow, detailed features); the CLS token is
  dropped, leaving 64 patch tokens.
- ``projector_comprehension``, ``projector_generation``: ``Linear(vision, lm) – GELU – Linear(lm, lm)`` each.
- ``lm``: a `transformers.LlamaForCausalLM` (width 128, 4 layers, 4 heads, SwiGLU 256, untied head) over a
  word vocabulary (`WordTokenizer`) followed by HealthGPT's image tokens ``<start_index>``, ``<idx_0>`` …
  ``<idx_{K−1}>``, ``<end_index>``.
- ``vq``: a frozen `workbench.models.vq.VQTokenizer` (64 × 64 ↔ 8 × 8 codes, K = 256).

Sequence (one kind per batch)::

    <bos> v_1 … v_64 question… <sep> answer… <eos>           # comprehension: the answer's words
    <bos> v_1 … v_64 question… <sep> <start_index> <idx_c1> … <idx_c64> <end_index> <eos>   # generation

with ``v_i`` the projected visual tokens (``IMAGE_PLACEHOLDER`` in ``input_ids``) and ``c`` the target image's VQ
codes in row-major order. The loss is next-token cross-entropy over the answer tokens only (their ``labels``; the
visual, question and padding positions are −100)::

    loss = −(1 / |A|) Σ_{t ∈ A} log softmax(logits_{t−1})[input_ids_t]

Decoding is greedy with a KV cache over left-padded prompts (positions count real tokens only, so a padded
prompt decodes as it would alone). `MedVL.answer` allows the words and ``<eos>``; `MedVL.generate_images`
appends ``<start_index>`` to the prompt and then allows only the K ``<idx_i>`` tokens for 64 steps.

LoRA plug-ins (`workbench.adaptation.lora.plugins`, H-LoRA's hard router): when the model carries plug-ins, the
one named by the batch's kind acts in `MedVL.forward`, `MedVL.answer` ("comprehension") and
`MedVL.generate_images` ("generation") (`MedVL.kind_plugin`).

Checkpoints: one safetensors file, the `MedVLConfig` and the vocabulary in its metadata (`save_medvl`,
`load_medvl`); the shipped one is ``models/checkpoints/medvl-tiny.safetensors`` (card ``medvl-tiny``).

Shapes:
    images (batch, 1, 64, 64) in [0, 1]; input_ids, attention_mask, labels (batch, seq);
    logits (batch, seq, vocab); visual tokens (batch, 64, lm_hidden); codes (batch, 8, 8) int64
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from workbench.models.vq import VQConfig, VQTokenizer

from workbench.core.checkpoint import check_state_fits, load_tensors, read_metadata, save_tensors
from workbench.core.errors import UserError
from workbench.core.model import ModelFamily, ModelSpec, active_adapters, plugins_of
from workbench.core.registry import models

#: The shipped checkpoint (pretrained by `workbench.domains.medvl.pretrain`; card ``medvl-tiny``).
SHIPPED_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "medvl-tiny.safetensors"
#: The two kinds of batch: which visual features and projector a batch uses.
KINDS = ("comprehension", "generation")
#: The id standing for a visual token in ``input_ids`` (LLaVA's ``IMAGE_TOKEN_INDEX``); never embedded.
IMAGE_PLACEHOLDER = -200
#: Label of a position that does not count in the loss.
IGNORE = -100
SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>", "<sep>")
PAD, UNK, BOS, EOS, SEP = range(len(SPECIAL_TOKENS))
#: The marker of the image in LLaVA questions ("<image>\\n..."): dropped, the image goes before the question.
IMAGE_MARKER = "<image>"
#: LoRA target groups of `MedVL` (fnmatch patterns over module names); ``language`` is H-LoRA's (every linear of
#: the language model but its head).
MEDVL_TARGET_GROUPS = {
    "language": tuple(f"lm.model.layers.*.self_attn.{p}_proj" for p in "qkvo")
    + tuple(f"lm.model.layers.*.mlp.{p}_proj" for p in ("gate", "up", "down")),
    "vision": tuple(f"vision.layers.*.attention.{p}_proj" for p in "qkvo")
    + ("vision.layers.*.mlp.fc1", "vision.layers.*.mlp.fc2"),
    "projectors": tuple(f"projector_{kind}.{i}" for kind in KINDS for i in (0, 2)),
}

_WORD = re.compile(r"\d+\.\d+|[.?,]|[^\s.?,]+")


class WordTokenizer:
    """Word-level tokenizer: lower-cases, splits on white space and makes ``.`` ``?`` ``,`` tokens of their own
    (a decimal number such as ``2.5`` stays one word).

    Vocabulary: ``<pad> <unk> <bos> <eos> <sep>``, the words, then the image tokens ``<start_index>``,
    ``<idx_0>`` … ``<idx_{K−1}>``, ``<end_index>``. A word outside the vocabulary encodes as ``<unk>`` and is
    counted in ``unknown`` (a `collections.Counter` of word → occurrences).

    Args:
        words: the word vocabulary, in id order (no special or image tokens, no duplicates).
        codebook_size: K, the number of ``<idx_i>`` tokens.
    """

    def __init__(self, words: Sequence[str], codebook_size: int):
        words = tuple(words)
        reserved = [w for w in words if w.startswith("<") and w.endswith(">")]
        repeated = [w for w, n in Counter(words).items() if n > 1]
        odd = [w for w in words if self.split(w) != [w]]
        if reserved or repeated or odd:
            raise UserError(
                "medvl vocabulary: expected distinct lower-case words without spaces or <...> tokens, found "
                f"reserved {reserved[:3]}, repeated {repeated[:3]}, not single words {odd[:3]}"
            )
        self.words = words
        self.codebook_size = int(codebook_size)
        self.start_index_id = len(SPECIAL_TOKENS) + len(words)
        self.first_code_id = self.start_index_id + 1
        self.end_index_id = self.first_code_id + self.codebook_size
        self.tokens = (
            SPECIAL_TOKENS
            + words
            + ("<start_index>",)
            + tuple(f"<idx_{i}>" for i in range(self.codebook_size))
            + ("<end_index>",)
        )
        self.ids = {token: i for i, token in enumerate(self.tokens)}
        self.unknown: Counter = Counter()

    @classmethod
    def from_corpus(cls, corpus: Iterable[str], codebook_size: int, min_count: int = 1) -> WordTokenizer:
        """The words of ``corpus`` seen at least ``min_count`` times, most frequent first (ties alphabetical);
        ``<...>`` markers (``<image>``, ``<output_image>``) are left out."""
        counts = Counter(
            word for text in corpus for word in cls.split(text) if not (word.startswith("<") and word.endswith(">"))
        )
        words = sorted((w for w, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
        return cls(words, codebook_size)

    @staticmethod
    def split(text: str) -> list[str]:
        """Lower-cased words and punctuation of ``text``."""
        return _WORD.findall(text.lower())

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_text_tokens(self) -> int:
        """Special tokens and words: the ids before ``<start_index>``."""
        return self.start_index_id

    def encode(self, text: str) -> list[int]:
        """Ids of the words of ``text`` (no ``<bos>``/``<eos>``); unknown words → ``<unk>``, counted."""
        ids = []
        for word in self.split(text):
            if word not in self.ids or self.ids[word] >= self.start_index_id or self.ids[word] < len(SPECIAL_TOKENS):
                self.unknown[word] += 1
                ids.append(UNK)
            else:
                ids.append(self.ids[word])
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids``: words joined by spaces, no space before punctuation; ``<pad> <bos> <eos> <sep>``
        dropped when ``skip_special``."""
        skipped = {PAD, BOS, EOS, SEP} if skip_special else set()
        words = [self.tokens[i] for i in (int(i) for i in ids) if i not in skipped]
        return re.sub(r" ([.?,])", r"\1", " ".join(words))

    def code_ids(self, codes: torch.Tensor) -> torch.Tensor:
        """VQ codes (..., ) int in [0, K) → the ids of their ``<idx_i>`` tokens."""
        return codes.long() + self.first_code_id


@dataclass(frozen=True)
class MedVLConfig:
    """Sizes of a `MedVL` (stored in its checkpoint).

    Args:
        image_size: image side [pixels] (default 64); patch_size: ViT patch side [pixels] (default 8).
        vision_hidden, vision_layers, vision_heads, vision_intermediate: the ViT's width (64), layers (4),
            heads (4) and MLP width (128).
        lm_hidden, lm_layers, lm_heads, lm_intermediate: the Llama's width (128), layers (4), heads (4, as many
            key/value heads) and SwiGLU width (256).
        max_positions: longest sequence the language model takes (default 256 tokens).
        comprehension_layer, generation_layer: index into the ViT's ``hidden_states`` (0: embeddings, i: after
            layer i) read by each kind (default −2 and 1, HealthGPT's).
        image_mean, image_std: the normalisation of [0, 1] images inside the model (default 0.5, 0.5).
        vq: the image tokenizer's `VQConfig` (its image_size must equal image_size, its 8 × 8 grid hold as many
            codes as there are patches).
    """

    image_size: int = 64
    patch_size: int = 8
    vision_hidden: int = 64
    vision_layers: int = 4
    vision_heads: int = 4
    vision_intermediate: int = 128
    lm_hidden: int = 128
    lm_layers: int = 4
    lm_heads: int = 4
    lm_intermediate: int = 256
    max_positions: int = 256
    comprehension_layer: int = -2
    generation_layer: int = 1
    image_mean: float = 0.5
    image_std: float = 0.5
    vq: VQConfig = field(default_factory=VQConfig)

    def __post_init__(self):
        n = self.vision_layers
        problems = []
        if self.image_size % self.patch_size:
            problems.append(f"patch_size {self.patch_size} does not divide image_size {self.image_size}")
        if self.vq.image_size != self.image_size:
            problems.append(f"vq.image_size {self.vq.image_size} differs from image_size {self.image_size}")
        for name in ("comprehension_layer", "generation_layer"):
            if not -n <= getattr(self, name) <= n or getattr(self, name) == 0:
                problems.append(f"{name} {getattr(self, name)} is not a ViT layer (1…{n} or −{n}…−1)")
        if problems:
            raise UserError("medvl config: " + "; ".join(problems))

    @property
    def n_patches(self) -> int:
        """Visual tokens per image: (image_size / patch_size)²."""
        return (self.image_size // self.patch_size) ** 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str | Path = "medvl config") -> MedVLConfig:
        """A config from its dict (as `to_dict` writes it); unknown or ill-typed fields are a `UserError`."""
        values = dict(values)
        known = {f.name for f in fields(cls)}
        stray = sorted(set(values) - known)
        vq = values.pop("vq", {})
        if isinstance(vq, dict):
            stray += [f"vq.{k}" for k in sorted(set(vq) - {f.name for f in fields(VQConfig)})]
        if stray or not isinstance(vq, dict):
            raise UserError(f"{source}: field 'config': unknown fields {stray or ['vq']}; known: {sorted(known)}")
        try:
            return cls(**values, vq=VQConfig(**vq))
        except TypeError as error:
            raise UserError(f"{source}: field 'config': {error}") from None


@dataclass
class MedVLOutput:
    """`MedVL.forward`'s result: ``loss`` (a scalar, None without labels) and ``logits`` (batch, seq, vocab)."""

    loss: torch.Tensor | None
    logits: torch.Tensor


def projector(vision_hidden: int, lm_hidden: int) -> nn.Sequential:
    """LLaVA-1.5's ``mlp2x_gelu``: Linear(vision_hidden, lm_hidden) – GELU – Linear(lm_hidden, lm_hidden)."""
    return nn.Sequential(nn.Linear(vision_hidden, lm_hidden), nn.GELU(), nn.Linear(lm_hidden, lm_hidden))


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting real tokens only (padding at 0): (batch, seq) → (batch, seq) int64."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


class MedVL(nn.Module):
    """The tiny VLM of the module docstring.

    Args:
        config: the sizes (`MedVLConfig`).
        words: the word vocabulary of its `WordTokenizer` (the specials and image tokens are added).

    Shapes:
        images (batch, 1, S, S) in [0, 1], input_ids / attention_mask / labels (batch, seq) → `MedVLOutput` with
        logits (batch, seq, vocab)
    """

    def __init__(self, config: MedVLConfig, words: Sequence[str]):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM, ViTConfig, ViTModel

        self.config = config
        self.tokenizer = WordTokenizer(words, config.vq.codebook_size)
        vision = ViTConfig(
            image_size=config.image_size,
            patch_size=config.patch_size,
            num_channels=1,
            hidden_size=config.vision_hidden,
            num_hidden_layers=config.vision_layers,
            num_attention_heads=config.vision_heads,
            intermediate_size=config.vision_intermediate,
        )
        self.vision = ViTModel(vision, add_pooling_layer=False)
        self.projector_comprehension = projector(config.vision_hidden, config.lm_hidden)
        self.projector_generation = projector(config.vision_hidden, config.lm_hidden)
        language = LlamaConfig(
            hidden_size=config.lm_hidden,
            num_hidden_layers=config.lm_layers,
            num_attention_heads=config.lm_heads,
            num_key_value_heads=config.lm_heads,
            intermediate_size=config.lm_intermediate,
            vocab_size=len(self.tokenizer),
            max_position_embeddings=config.max_positions,
            tie_word_embeddings=False,
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
        )
        self.lm = LlamaForCausalLM(language)
        self.vq = VQTokenizer(config.vq)
        self.vq.requires_grad_(False)
        self.vq.eval()
        #: The kinds of batch this model will be adapted to and asked for (`KINDS`; a task whose data hold no
        #: generation sub-task sets ("comprehension",)): H-LoRA attaches plug-ins for these kinds only.
        self.kinds: tuple[str, ...] = KINDS

    @property
    def workbench_spec(self) -> ModelSpec:
        """Head ``lm.lm_head``; LoRA target groups ``language`` (the 7 linears of each Llama layer), ``vision``
        (the ViT's attention and MLP linears), ``projectors``; no embedding hook."""
        return ModelSpec(family="medvl", head="lm.lm_head", adapter_target_groups=dict(MEDVL_TARGET_GROUPS))

    def get_input_embeddings(self) -> nn.Embedding:
        """The language model's token embeddings (vocab, lm_hidden); the image-token rows are the last K + 2."""
        return self.lm.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Linear:
        """The language model's head ``lm.lm_head`` (vocab rows)."""
        return self.lm.get_output_embeddings()

    def kind_plugin(self, kind: str) -> contextlib.AbstractContextManager:
        """HealthGPT's hard router: a context in which the plug-in named ``kind`` acts, when a method gave the model
        plug-ins (adapters chosen per input, `workbench.core.model.plugins_of`; H-LoRA's); one plug-in named ``shared``
        serves both kinds (one adapter for both skills, the comparison H-LoRA's plug-ins are made against); a model
        with plug-ins but none of these names is a `UserError`; a no-op for a model without plug-ins."""
        self._check_kind(kind)
        names = plugins_of(self)
        if not names:
            return contextlib.nullcontext()
        name = "shared" if kind not in names and "shared" in names else kind
        if name not in names:
            raise UserError(f"no LoRA plug-in named '{name}'; this model has {list(names)}")
        return active_adapters(self, name)

    def train(self, mode: bool = True) -> MedVL:
        """As `nn.Module.train`, but the frozen ``vq`` stays in eval mode (its codebook never moves)."""
        super().train(mode)
        self.vq.eval()
        return self

    # ---- inputs ---------------------------------------------------------------------------------------------

    def _check_images(self, images: torch.Tensor, n: int | None = None) -> None:
        s = self.config.image_size
        if not isinstance(images, torch.Tensor) or images.ndim != 4 or tuple(images.shape[1:]) != (1, s, s):
            found = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise UserError(f"medvl: expected images (batch, 1, {s}, {s}) in [0, 1], got {found}")
        if n is not None and images.shape[0] != n:
            raise UserError(f"medvl: {images.shape[0]} images for {n} questions; give one image per question")

    @staticmethod
    def _check_kind(kind: str) -> None:
        if kind not in KINDS:
            raise UserError(f"medvl: kind '{kind}' is not one of {KINDS}")

    def visual_tokens(self, images: torch.Tensor, kind: str) -> torch.Tensor:
        """The projected patch tokens of the ViT layer ``kind`` reads (see the module docstring).

        Shapes: images (batch, 1, S, S) in [0, 1] → (batch, n_patches, lm_hidden)
        """
        self._check_kind(kind)
        self._check_images(images)
        pixels = (images - self.config.image_mean) / self.config.image_std
        hidden = self.vision(pixel_values=pixels, output_hidden_states=True).hidden_states
        if kind == "comprehension":
            return self.projector_comprehension(hidden[self.config.comprehension_layer][:, 1:])
        return self.projector_generation(hidden[self.config.generation_layer][:, 1:])

    def embed(self, images: torch.Tensor, input_ids: torch.Tensor, kind: str) -> torch.Tensor:
        """``inputs_embeds`` (batch, seq, lm_hidden): the word embeddings of ``input_ids`` with the visual tokens
        in the ``IMAGE_PLACEHOLDER`` positions (exactly n_patches per row, in order)."""
        is_image = input_ids == IMAGE_PLACEHOLDER
        counts = is_image.sum(1)
        if (counts != self.config.n_patches).any():
            raise UserError(
                f"medvl: each row of input_ids needs {self.config.n_patches} IMAGE_PLACEHOLDER positions, found "
                f"{counts.tolist()}; build the batch with MedVL.encode_batch"
            )
        embeds = self.lm.get_input_embeddings()(input_ids.masked_fill(is_image, PAD))
        visual = self.visual_tokens(images, kind).to(embeds.dtype)
        return embeds.masked_scatter(is_image[..., None], visual)

    def _codes_of(self, answers: Any) -> torch.Tensor:
        """Generation targets → VQ codes (batch, g, g): images (batch, 1, S, S) in [0, 1], or codes already."""
        if isinstance(answers, torch.Tensor) and answers.dtype in (torch.int32, torch.int64) and answers.ndim == 3:
            return answers.long()
        if isinstance(answers, torch.Tensor) and answers.is_floating_point():
            self._check_images(answers)
            return self.vq.encode(answers.to(next(self.vq.parameters()).dtype))
        raise UserError(
            "medvl: generation answers must be target images (batch, 1, S, S) in [0, 1] or VQ codes (batch, 8, 8) "
            f"int64, got {type(answers).__name__}"
        )

    def encode_batch(
        self,
        images: torch.Tensor,
        questions: Sequence[str],
        answers: Sequence[str] | torch.Tensor | None = None,
        kind: str = "comprehension",
        padding: str = "right",
    ) -> dict[str, Any]:
        """One batch of one kind, as `forward` takes it (``model(**batch)``).

        Args:
            images: (batch, 1, S, S) in [0, 1].
            questions: one string per image (a leading ``<image>`` marker is dropped: the image goes first).
            answers: comprehension: one string per image; generation: the target images (batch, 1, S, S) in
                [0, 1] or their VQ codes (batch, 8, 8); None: prompts only (ending in ``<sep>``), for decoding.
            kind: "comprehension" or "generation".
            padding: "right" (training) or "left" (decoding).

        Returns:
            ``images``, ``input_ids`` (batch, seq) int64 with ``IMAGE_PLACEHOLDER`` for the visual tokens,
            ``attention_mask`` (batch, seq) int64, ``labels`` (batch, seq) int64 (−100 but on the answer tokens;
            None without answers), ``kind``.
        """
        self._check_kind(kind)
        self._check_images(images, len(questions))
        if padding not in ("left", "right"):
            raise UserError(f"medvl: padding '{padding}' is not 'left' or 'right'")
        tok = self.tokenizer
        prompts = [
            [BOS] + [IMAGE_PLACEHOLDER] * self.config.n_patches + tok.encode(q.replace(IMAGE_MARKER, " ")) + [SEP]
            for q in questions
        ]
        targets: list[list[int]] = [[] for _ in prompts]
        if answers is not None:
            if kind == "comprehension":
                if isinstance(answers, torch.Tensor) or len(answers) != len(prompts):
                    raise UserError("medvl: comprehension answers must be one string per question")
                targets = [tok.encode(a) + [EOS] for a in answers]
            else:
                codes = self._codes_of(answers)
                grid = self.vq.grid
                if tuple(codes.shape) != (len(prompts), grid, grid):
                    raise UserError(
                        f"medvl: expected the codes of {len(prompts)} target images ({len(prompts)}, {grid}, {grid}), "
                        f"got {tuple(codes.shape)}"
                    )
                ids = tok.code_ids(codes.flatten(1)).tolist()
                targets = [[tok.start_index_id] + row + [tok.end_index_id, EOS] for row in ids]
        rows = [p + t for p, t in zip(prompts, targets)]
        longest = max(len(r) for r in rows)
        if longest > self.config.max_positions:
            raise UserError(
                f"medvl: a sequence of {longest} tokens exceeds max_positions {self.config.max_positions}; shorten "
                "the question or answer"
            )
        input_ids = torch.full((len(rows), longest), PAD, dtype=torch.long)
        labels = torch.full((len(rows), longest), IGNORE, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for i, (prompt, target) in enumerate(zip(prompts, targets)):
            start = 0 if padding == "right" else longest - len(prompt) - len(target)
            end = start + len(prompt) + len(target)
            input_ids[i, start:end] = torch.tensor(prompt + target)
            attention_mask[i, start:end] = 1
            labels[i, start + len(prompt) : end] = torch.tensor(target, dtype=torch.long)
        device = images.device
        return {
            "images": images,
            "input_ids": input_ids.to(device),
            "attention_mask": attention_mask.to(device),
            "labels": labels.to(device) if answers is not None else None,
            "kind": kind,
        }

    # ---- training ---------------------------------------------------------------------------------------------

    def forward(
        self,
        images: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor | None = None,
        kind: str = "comprehension",
    ) -> MedVLOutput:
        """Logits of every position and the answer-token loss (module docstring).

        Shapes: images (batch, 1, S, S); input_ids, attention_mask, labels (batch, seq) →
        logits (batch, seq, vocab), loss () (mean over the labelled tokens)
        """
        with self.kind_plugin(kind):
            embeds = self.embed(images, input_ids, kind)
            logits = self.lm(
                inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids(attention_mask)
            ).logits
        loss = None
        if labels is not None:
            wide = logits[:, :-1].flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32))
            loss = F.cross_entropy(wide, labels[:, 1:].flatten(), ignore_index=IGNORE)
        return MedVLOutput(loss, logits)

    # ---- decoding ---------------------------------------------------------------------------------------------

    @torch.no_grad()
    def _greedy(self, batch: Mapping[str, Any], steps: int, allowed: torch.Tensor, stop: int | None) -> torch.Tensor:
        """Greedy continuation of left-padded prompts: (batch, ≤ steps) ids, each the best ``allowed`` token;
        after ``stop`` a row continues with ``<pad>``."""
        mask = batch["attention_mask"]
        embeds = self.embed(batch["images"], batch["input_ids"], batch["kind"])
        positions = position_ids(mask)
        out = self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=True)
        cache, logits, next_position = out.cache, out.logits[:, -1], positions[:, -1:] + 1
        banned = ~allowed.to(logits.device)
        finished = torch.zeros(len(mask), dtype=torch.bool, device=mask.device)
        generated = []
        for step in range(steps):
            token = logits.masked_fill(banned, float("-inf")).argmax(-1)
            token = token.masked_fill(finished, PAD)
            generated.append(token)
            if stop is not None:
                finished |= token == stop
                if bool(finished.all()):
                    break
            if step == steps - 1:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = self.lm(
                input_ids=token[:, None], attention_mask=mask, position_ids=next_position, cache=cache, use_cache=True
            )
            cache, logits, next_position = out.cache, out.logits[:, -1], next_position + 1
        return torch.stack(generated, dim=1) if generated else mask.new_zeros((len(mask), 0))

    def answer(self, images: torch.Tensor, questions: Sequence[str], max_new_tokens: int = 40) -> list[str]:
        """Greedy text answers, one per image (words and ``<eos>`` allowed; at most ``max_new_tokens``).

        Shapes: images (batch, 1, S, S) in [0, 1] → batch strings
        """
        tok = self.tokenizer
        allowed = torch.zeros(len(tok), dtype=torch.bool)
        allowed[len(SPECIAL_TOKENS) : tok.start_index_id] = True
        allowed[EOS] = True
        batch = self.encode_batch(images, questions, kind="comprehension", padding="left")
        with self.kind_plugin("comprehension"):
            ids = self._greedy(batch, max_new_tokens, allowed, stop=EOS)
        texts = []
        for row in ids.tolist():
            row = row[: row.index(EOS)] if EOS in row else row
            texts.append(tok.decode(row))
        return texts

    def generate_codes(self, images: torch.Tensor, questions: Sequence[str]) -> torch.Tensor:
        """Greedy VQ codes of the output image: ``<start_index>`` is appended to each prompt, then g² steps allow
        only the ``<idx_i>`` tokens.

        Shapes: images (batch, 1, S, S) in [0, 1] → codes (batch, g, g) int64 in [0, K), g = S / 8
        """
        tok = self.tokenizer
        batch = self.encode_batch(images, questions, kind="generation", padding="left")
        start = torch.full_like(batch["input_ids"][:, :1], tok.start_index_id)
        batch["input_ids"] = torch.cat([batch["input_ids"], start], dim=1)
        batch["attention_mask"] = torch.cat([batch["attention_mask"], torch.ones_like(start)], dim=1)
        allowed = torch.zeros(len(tok), dtype=torch.bool)
        allowed[tok.first_code_id : tok.end_index_id] = True
        grid = self.vq.grid
        with self.kind_plugin("generation"):
            ids = self._greedy(batch, grid * grid, allowed, stop=None)
        return (ids - tok.first_code_id).view(len(ids), grid, grid)

    @torch.no_grad()
    def generate_images(self, images: torch.Tensor, questions: Sequence[str]) -> torch.Tensor:
        """Output images of generation questions: `generate_codes`, then ``vq.decode``.

        Shapes: images (batch, 1, S, S) in [0, 1] → (batch, 1, S, S) in [0, 1]
        """
        return self.vq.decode(self.generate_codes(images, questions))


# ---- checkpoints ------------------------------------------------------------------------------------------------


def save_medvl(model: MedVL, path: str | Path, provenance: Mapping[str, Any] | None = None) -> None:
    """Weights to ``path`` (.safetensors, atomically), with ``model: medvl``, the config, the vocabulary and
    ``provenance`` (JSON) in its metadata."""
    metadata = {
        "model": "medvl",
        "config": json.dumps(model.config.to_dict()),
        "vocabulary": json.dumps(list(model.tokenizer.words)),
        "provenance": json.dumps(dict(provenance or {})),
    }
    save_tensors(path, model.state_dict(), metadata)


def load_medvl(path: str | Path) -> MedVL:
    """A `MedVL` saved by `save_medvl`, checked tensor by tensor.

    Raises:
        UserError naming the file and the field or tensor: no config or vocabulary in the metadata, a tensor
        missing, unexpected or of another shape.
    """
    path = Path(path)
    metadata = read_metadata(path)
    for key in ("config", "vocabulary"):
        if key not in metadata:
            raise UserError(
                f"{path}: metadata field '{key}': expected JSON (a medvl checkpoint written by save_medvl), found none"
            )
    try:
        config, words = json.loads(metadata["config"]), json.loads(metadata["vocabulary"])
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: metadata 'config' or 'vocabulary' is not JSON ({error})") from None
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words) or not words:
        raise UserError(f"{path}: metadata field 'vocabulary': expected a non-empty JSON list of words")
    if not isinstance(config, dict):
        raise UserError(f"{path}: metadata field 'config': expected a JSON object of MedVLConfig fields")
    model = MedVL(MedVLConfig.from_dict(config, path), words)
    state = load_tensors(path)
    check_state_fits(model.state_dict(), state, path, "checkpoint does not fit its medvl config")
    model.load_state_dict(state)
    return model


def provenance_of(path: str | Path) -> dict[str, Any]:
    """The ``provenance`` JSON of a medvl checkpoint (empty when none)."""
    return json.loads(read_metadata(path).get("provenance", "{}"))


@models.register
class MedVLFamily(ModelFamily):
    """`MedVL`: the shipped pretrained checkpoint, a user's checkpoint, or a fresh model."""

    name = "medvl"
    description = "tiny medical vision-language model (ViT + Llama + VQ image tokens, HealthGPT's layout)"
    card = "medvl-tiny"

    def load(self, source=None, *, trust_checkpoint=False, pretrained=True, words=None, **sizes) -> MedVL:
        """``source`` None: the shipped checkpoint (``pretrained=False``: a fresh model of ``sizes``, `MedVLConfig`'s
        fields, over the word vocabulary ``words``); a path: a checkpoint written by `save_medvl`, whose config
        must equal the ``sizes`` given. ``trust_checkpoint`` is accepted and unused (safetensors hold no code)."""
        known = {f.name for f in fields(MedVLConfig)}
        stray = sorted(set(sizes) - known)
        if stray:
            raise UserError(f"medvl: unknown sizes {stray}; known: {sorted(known)}")
        if source is None and pretrained:
            if not SHIPPED_CHECKPOINT.is_file():
                raise UserError(
                    f'{SHIPPED_CHECKPOINT}: the shipped medvl checkpoint is missing; remake it with python -c "from '
                    "workbench.domains.medvl.pretrain import pretrain; pretrain('models/checkpoints/medvl-tiny."
                    "safetensors')\" or pass pretrained=False"
                )
            source = SHIPPED_CHECKPOINT
        if source is None:
            if not words:
                raise UserError("medvl: a fresh model (pretrained=False) needs its word vocabulary, words=[...]")
            values = dict(sizes)
            if isinstance(values.get("vq"), Mapping):
                values["vq"] = VQConfig(**values["vq"])
            return MedVL(MedVLConfig(**values), words)
        model = load_medvl(source)
        have = model.config.to_dict()
        wrong = {
            k: (v, have[k]) for k, v in sizes.items() if (v.to_dict() if isinstance(v, VQConfig) else v) != have[k]
        }
        if wrong:
            found = ", ".join(f"{k} {h} (asked for {w})" for k, (w, h) in wrong.items())
            raise UserError(f"{source}: the model has {found}")
        return model

    def files(self, source=None) -> list[Path]:
        if source is None:
            return [SHIPPED_CHECKPOINT] if SHIPPED_CHECKPOINT.is_file() else []
        return [Path(source)]
