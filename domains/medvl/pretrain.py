"""Pretraining of the shipped tiny VLM (``models/checkpoints/medvl-tiny.safetensors``, card ``medvl-tiny``).

Remake it with (from the repository root)::

  python -m workbench.domains.medvl.pretrain --out models/checkpoints/medvl-tiny.safetensors

(or ``python -c "from workbench.domains.medvl.pretrain import pretrain; pretrain('models/...')"``, or
``workbench pretrain --task medvl --out ...``).
As the foundation parts of a real VLM are pretrained before they are joined, each part of `MedVL` is pretrained on
its own, on data generated here (`workbench.domains.medvl.generate` at seed `PRETRAIN_SEED`, other subjects and
noise than the embedded set's seed 0):

1. ``vq`` — the VQ-VAE tokenizer (`workbench.models.vq`), on images as the task reads them (`as_loaded`: 8-bit,
   min-max scaled to [0, 1]): CT and MR renderings of each subject and its CT area-averaged to 32 × 32 and
   bilinearly upsampled back to 64 × 64 (the super-resolution input). Loss: pixel MSE + 0.25 · commitment,
   EMA codebook (decay 0.99) with dead-code restarts; Adam, cosine learning rate. Measured: PSNR / SSIM of
   held-out images against their reconstructions.
2. ``vision`` — the ViT, supervised on each image's findings through a temporary linear head on the mean of its
   final tokens: lesion presence in each of the 4 quadrants, the size class (small / large) and intensity class
   (bright / dark) of the lesion in each quadrant that has one, and the modality (13 logits, binary
   cross-entropies, the size / intensity terms only where a lesion is). The head is discarded. Measured: held-out
   accuracy of each output.
3. ``lm`` — the Llama on text alone: ``<bos> question <sep> answer <eos>`` of the comprehension records and
   ``<bos> question <sep>`` of the generation records of a generated corpus (`generate` at seed 7), next-token
   cross-entropy over every token after ``<bos>``; the word vocabulary is built from the same corpus. The softmax
   runs over the words only: the image-token rows (``<start_index>``, ``<idx_*>``, ``<end_index>``) of the
   embedding and of ``lm_head`` keep their random initialisation (N(0, 0.02)) — they are learnt in the
   adaptation's second stage. Measured: held-out token perplexity.
4. ``projector_comprehension`` / ``projector_generation`` stay at their random initialisation (the adaptation's
   first stage learns them).

Shapes: images (n, 1, 64, 64) float32 in [0, 1]; findings targets (n, 13) float32.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from workbench.domains.medvl.generate import (
    COMPREHENSION_TASKS,
    INTENSITIES,
    MODALITIES,
    QUADRANTS,
    SIZES,
    VOCABULARY,
    Findings,
    downsample,
    generate,
    render,
    sample_subject,
)
from workbench.models.medvl import BOS, EOS, IGNORE, PAD, SEP, MedVL, MedVLConfig, WordTokenizer, save_medvl
from workbench.models.vq import psnr, ssim

from workbench.core.device import device_of, place, resolve

#: Seed of every generated pretraining corpus (the embedded set uses 0).
PRETRAIN_SEED = 7
#: The shipped checkpoint's default path, relative to the repository root.
DEFAULT_OUT = "models/checkpoints/medvl-tiny.safetensors"
#: Outputs of the temporary findings head: presence (4 quadrants), size (4), intensity (4), modality (1).
N_FINDINGS = 13


def as_loaded(image: np.ndarray) -> np.ndarray:
    """An image as the task reads it from its PNG: 8-bit, then min-max scaled to [0, 1] (float32)."""
    image = np.round(np.clip(image, 0.0, 1.0) * 255) / 255
    low, high = float(image.min()), float(image.max())
    return ((image - low) / (high - low) if high > low else np.zeros_like(image)).astype(np.float32)


def upsampled(image: np.ndarray) -> np.ndarray:
    """A 64-px image's super-resolution input: 2 × 2 area-averaged, 8-bit and scaled, bilinearly back to 64 px."""
    low = torch.from_numpy(as_loaded(downsample(image)))[None, None]
    return F.interpolate(low, scale_factor=2, mode="bilinear", align_corners=False)[0, 0].clamp(0, 1).numpy()


def findings_target(findings: Findings, modality: str) -> np.ndarray:
    """The 13 targets of the findings head (see the module docstring); NaN where a quadrant has no lesion."""
    target = np.full(N_FINDINGS, np.nan, np.float32)
    by_quadrant = {lesion.quadrant: lesion for lesion in findings.lesions}
    for i, quadrant in enumerate(QUADRANTS):
        target[i] = quadrant in by_quadrant
        if quadrant in by_quadrant:
            target[4 + i] = SIZES.index(by_quadrant[quadrant].size)
            target[8 + i] = INTENSITIES.index(by_quadrant[quadrant].intensity)
    target[12] = MODALITIES.index(modality)
    return target


def image_corpus(n_subjects: int, stream: int, seed: int = PRETRAIN_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """Images of ``n_subjects`` generated subjects: CT, MR and the upsampled low-resolution CT of each
    (3 n_subjects images, (3 n, 1, 64, 64) in [0, 1]) and their findings targets (3 n, 13) (NaN: no lesion)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1000 + stream]))
    images, targets = [], []
    for _ in range(n_subjects):
        subject = sample_subject(rng)
        ct, mr = render(subject, "ct", 64, rng), render(subject, "mr", 64, rng)
        images += [as_loaded(ct), as_loaded(mr), upsampled(ct)]
        targets += [findings_target(subject.findings, m) for m in ("ct", "mr", "ct")]
    return torch.from_numpy(np.stack(images)[:, None]), torch.from_numpy(np.stack(targets))


def _cosine(step: int, steps: int, warmup: int = 50) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def _optimiser(params, lr: float, steps: int):
    optimiser = torch.optim.Adam(params, lr=lr)
    return optimiser, torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: _cosine(s, steps))


def pretrain_vq(model: MedVL, train: torch.Tensor, held_out: torch.Tensor, steps: int, batch: int = 64,
                lr: float = 2e-3, log=print) -> dict[str, float]:  # fmt: skip
    """Train ``model.vq`` on ``train`` images (on the host; batches go where the model is); PSNR [dB] / SSIM / codes
    in use on ``held_out``."""
    vq, where = model.vq, device_of(model)
    vq.requires_grad_(True)
    vq.train()
    optimiser, schedule = _optimiser(vq.parameters(), lr, steps)
    generator = torch.Generator().manual_seed(0)
    for step in range(steps):
        x = train[torch.randint(len(train), (batch,), generator=generator)].to(where)
        out = vq(x)
        optimiser.zero_grad()
        out.loss.backward()
        optimiser.step()
        schedule.step()
        if step % 200 == 0 or step == steps - 1:
            log(f"vq step {step}: mse {out.reconstruction_loss.item():.5f}, perplexity {out.perplexity.item():.1f}")
    vq.requires_grad_(False)
    vq.eval()
    with torch.no_grad():
        made = torch.cat([vq.decode(vq.encode(part.to(where))).cpu() for part in held_out.split(256)])
        codes = torch.cat([vq.encode(part.to(where)).cpu() for part in held_out.split(256)])
    return {
        "psnr_db": float(psnr(made, held_out).mean()),
        "ssim": float(ssim(made, held_out)),
        "codes_used": int(codes.unique().numel()),
    }


class _FindingsProbe(nn.Module):
    """The ViT and a temporary linear head on the mean of its final tokens: (n, 1, 64, 64) → (n, 13) logits."""

    def __init__(self, model: MedVL):
        super().__init__()
        self.vision, self.config = model.vision, model.config
        self.head = nn.Linear(model.config.vision_hidden, N_FINDINGS)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        pixels = (images - self.config.image_mean) / self.config.image_std
        return self.head(self.vision(pixel_values=pixels).last_hidden_state.mean(1))


def _findings_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    known = ~torch.isnan(target)
    return F.binary_cross_entropy_with_logits(logits[known], target[known])


def pretrain_vision(model: MedVL, train: tuple[torch.Tensor, torch.Tensor], held_out: tuple[torch.Tensor, torch.Tensor],
                    steps: int, batch: int = 64, lr: float = 1e-3, log=print) -> dict[str, float]:  # fmt: skip
    """Train ``model.vision`` (with a temporary head) on the findings; held-out accuracy of each output kind."""
    probe, where = place(_FindingsProbe(model), device_of(model)), device_of(model)
    optimiser, schedule = _optimiser(probe.parameters(), lr, steps)
    generator = torch.Generator().manual_seed(1)
    images, targets = train
    for step in range(steps):
        pick = torch.randint(len(images), (batch,), generator=generator)
        loss = _findings_loss(probe(images[pick].to(where)), targets[pick].to(where))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        if step % 200 == 0 or step == steps - 1:
            log(f"vision step {step}: loss {loss.item():.4f}")
    with torch.no_grad():
        logits = torch.cat([probe(part.to(where)).cpu() for part in held_out[0].split(256)])
    right = (logits > 0).float() == held_out[1]
    known = ~torch.isnan(held_out[1])

    def accuracy(columns: slice) -> float:
        return float(right[:, columns][known[:, columns]].float().mean())

    return {
        "presence_accuracy": accuracy(slice(0, 4)),
        "size_accuracy": accuracy(slice(4, 8)),
        "intensity_accuracy": accuracy(slice(8, 12)),
        "modality_accuracy": accuracy(slice(12, 13)),
    }


def text_corpus(folder: Path) -> dict[str, list[str]]:
    """Split → texts ``question <sep> answer`` (comprehension) and ``question`` (generation) of a generated set."""
    corpus = {}
    for split in ("train", "test"):
        texts = []
        for record in json.loads((folder / f"{split}.json").read_text()):
            question = record["conversations"][0]["value"].replace("<image>", " ").strip()
            answer = record["conversations"][1]["value"] if record["task"] in COMPREHENSION_TASKS else None
            texts.append((question, answer))
        corpus[split] = texts
    return corpus


def _text_batch(tokenizer: WordTokenizer, pairs: list[tuple[str, str | None]]) -> torch.Tensor:
    """``<bos> question <sep> [answer <eos>]`` rows, right-padded with ``<pad>``: (n, seq) int64."""
    rows = []
    for question, answer in pairs:
        row = [BOS, *tokenizer.encode(question), SEP]
        if answer is not None:
            row += [*tokenizer.encode(answer), EOS]
        rows.append(row)
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def _text_loss(model: MedVL, ids: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy over the word vocabulary (image-token logits left out)."""
    mask = (ids != PAD).long()
    hidden = model.lm.model(input_ids=ids, attention_mask=mask).last_hidden_state
    n_text = model.tokenizer.n_text_tokens
    logits = F.linear(hidden[:, :-1], model.lm.lm_head.weight[:n_text])
    labels = ids[:, 1:].masked_fill(ids[:, 1:] == PAD, IGNORE)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction=reduction)


def pretrain_language(model: MedVL, corpus: dict[str, list], steps: int, batch: int = 64, lr: float = 2e-3,
                      log=print) -> dict[str, float]:  # fmt: skip
    """Train ``model.lm`` on the text of ``corpus['train']``; held-out perplexity on ``corpus['test']``. The
    image-token rows get no gradient and are checked unchanged."""
    tok, where = model.tokenizer, device_of(model)
    embedding, head = model.lm.get_input_embeddings().weight, model.lm.lm_head.weight
    image_rows = (embedding[tok.start_index_id :].detach().clone(), head[tok.start_index_id :].detach().clone())
    params = [p for p in model.lm.parameters()]
    optimiser, schedule = _optimiser(params, lr, steps)
    generator = torch.Generator().manual_seed(2)
    train = corpus["train"]
    for step in range(steps):
        pick = torch.randint(len(train), (batch,), generator=generator).tolist()
        loss = _text_loss(model, _text_batch(tok, [train[i] for i in pick]).to(where))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        if step % 200 == 0 or step == steps - 1:
            log(f"lm step {step}: loss {loss.item():.4f}")
    if not (torch.equal(embedding[tok.start_index_id :], image_rows[0]) and
            torch.equal(head[tok.start_index_id :], image_rows[1])):  # fmt: skip
        raise RuntimeError("text pretraining moved the image-token rows")
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(corpus["test"]), 256):
            ids = _text_batch(tok, corpus["test"][start : start + 256]).to(where)
            total += float(_text_loss(model, ids, reduction="sum"))
            count += int((ids[:, 1:] != PAD).sum())
    return {"perplexity": math.exp(total / count), "held_out_tokens": count}


def pretrain(
    out: str | Path = DEFAULT_OUT,
    seed: int = 0,
    *,
    vq_steps: int = 1000,
    vision_steps: int = 1500,
    lm_steps: int = 500,
    image_subjects: int = 1200,
    held_out_subjects: int = 100,
    text_subjects: tuple[int, int] = (600, 100),
    threads: int = 2,
    device: str = "auto",
    log=print,
) -> str:
    """Pretrain every part (module docstring), write the checkpoint to ``out`` atomically; returns a summary.

    Args:
        out: the ``.safetensors`` to write (its folder is made).
        seed: torch seed of the initialisation and the batches (the corpora use `PRETRAIN_SEED`).
        vq_steps, vision_steps, lm_steps: optimisation steps of each part (batch 64).
        image_subjects, held_out_subjects: generated subjects of the image corpus (3 images each) and of its
            held-out part.
        text_subjects: (train, held-out) subjects of the text corpus (8 records each).
        threads: torch CPU threads.
        device: where it trains (`workbench.core.device.resolve`).
    """
    started = time.time()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as folder:
        generate(Path(folder) / "corpus", seed=PRETRAIN_SEED, train_subjects=text_subjects[0],
                 test_subjects=text_subjects[1])  # fmt: skip
        corpus = text_corpus(Path(folder) / "corpus")
    texts = [q for q, _ in corpus["train"]] + [a for _, a in corpus["train"] if a is not None]
    words = WordTokenizer.from_corpus(texts, codebook_size=MedVLConfig().vq.codebook_size).words
    missing = sorted(set(VOCABULARY) - set(words))
    model = place(MedVL(MedVLConfig(), words), resolve(device))
    train_images, train_targets = image_corpus(image_subjects, stream=0)
    held_images, held_targets = image_corpus(held_out_subjects, stream=1)
    log(f"corpora: {len(train_images)} images, {len(corpus['train'])} text records, {len(words)} words "
        f"({time.time() - started:.0f} s)")  # fmt: skip
    timings, results = {}, {}
    parts = {
        "vq": lambda: pretrain_vq(model, train_images, held_images, vq_steps, log=log),
        "vision": lambda: pretrain_vision(
            model, (train_images, train_targets), (held_images, held_targets), vision_steps, log=log
        ),
        "lm": lambda: pretrain_language(model, corpus, lm_steps, log=log),
    }
    for part, run in parts.items():
        tick = time.time()
        results[part] = run()
        timings[part] = round(time.time() - tick, 1)
        log(f"{part}: {results[part]} ({timings[part]} s)")
    wall = round(time.time() - started, 1)
    provenance = {
        "recipe": "workbench.domains.medvl.pretrain.pretrain",
        "seed": seed,
        "corpus_seed": PRETRAIN_SEED,
        "steps": {"vq": vq_steps, "vision": vision_steps, "lm": lm_steps},
        "image_subjects": image_subjects,
        "held_out_subjects": held_out_subjects,
        "text_subjects": list(text_subjects),
        "results": results,
        "seconds": {**timings, "total": wall},
        "torch": torch.__version__,
        "projectors": "random initialisation (learnt by the adaptation's first stage)",
    }
    save_medvl(model.cpu(), out, provenance)
    size = Path(out).stat().st_size
    n_params = sum(p.numel() for p in model.parameters())
    lines = [
        f"wrote {out} ({size / 1e6:.2f} MB, {n_params:,} parameters, vocabulary {len(model.tokenizer)} tokens)",
        f"vq: held-out PSNR {results['vq']['psnr_db']:.2f} dB, SSIM {results['vq']['ssim']:.4f}, "
        f"{results['vq']['codes_used']} codes used",
        "vision probe (held-out accuracy): " + ", ".join(f"{k} {v:.3f}" for k, v in results["vision"].items()),
        f"lm: held-out perplexity {results['lm']['perplexity']:.3f}",
        f"wall time {wall:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in timings.items())})",
    ]
    if missing:
        lines.append(f"note: generator words missing from the vocabulary: {missing}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"checkpoint to write (default {DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=0, help="torch seed of the initialisation and batches (default 0)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    args = parser.parse_args(argv)
    print(pretrain(args.out, args.seed, threads=args.threads))


if __name__ == "__main__":
    main()
