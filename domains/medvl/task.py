"""The ``medvl`` task: one vision-language model that answers questions about medical images and makes images.

The situation it models (GitHub issue 13): a clinical imaging group adapts a pretrained vision-language model to
comprehension (closed and open VQA, a findings report) and generation (reconstruction, 2× super-resolution, CT→MR
modality conversion) at once, without the two skills competing for one adapter. The default method is H-LoRA
(``hlora``, `workbench.adaptation.hlora`: two plug-ins of token-routed experts, three training stages, each
``--epochs`` long), run beside plain-LoRA plug-ins of the same rank (``--baselines`` for more: ``moelora``,
``hlora-mixed``, ``full``; the default run takes ~4.5 min on 2 CPU cores, MoELoRA alone adds ~3.5).

Data (`workbench.domains.medvl.readers`; images through MONAI, `workbench.domains.medvl.images`):

- default: the embedded synthetic CT/MR-like slices with recorded findings and templated VQA / reports (card
  ``medvl-synthetic``), its ``train.json`` / ``test.json``;
- ``--data FOLDER`` or ``--data FILE.json``: the LLaVA conversation layout (VL-Health, LLaVA-Med; card
  ``llava-conversations``), VQA-RAD, SLAKE or PathVQA (cards ``vqa-rad``, ``slake``, ``pathvqa``), told apart by
  their records' keys.

The validation records (``--val-share`` of the training groups, for early stopping) are drawn by group — a subject
where the records name one, else an image — so no image is in two splits.

Loss: next-token cross-entropy on the answer tokens (`workbench.models.medvl.MedVL`); a batch holding both kinds is
scored kind by kind (each through its own projector and plug-in) and averaged by sample share.

Metrics (test records, higher is better): ``closed_accuracy`` (exact yes / no), ``open_recall`` (share of the
reference answer's words in the model's answer, LLaVA-Med's open-set recall), ``report_f1`` (micro F1 of the
findings parsed out of the reports, `workbench.domains.medvl.generate.report_findings`), and per generation
sub-task ``ssim_*`` / ``psnr_db_*`` of the decoded image against the target (data range 1), ``ssim`` / ``psnr_db``
their means; ``ssim_vq_ceiling`` is the SSIM of the targets passed through the VQ tokenizer alone (the best any
token sequence can do). Sub-tasks absent from the data are left out of the metrics.

Shapes:
    a sample's ``image`` / ``target`` (1, 64, 64) float32 in [0, 1], ``codes`` (8, 8) int64.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from workbench.domains.medvl.generate import COMPREHENSION_TASKS, GENERATION_TASKS, report_findings
from workbench.domains.medvl.images import load_image
from workbench.domains.medvl.readers import CODE_TOKEN, VlSample, read_folder, read_json
from workbench.models.medvl import UNK

from workbench.errors import UserError
from workbench.model import spec_of
from workbench.options import Option
from workbench.registry import tasks
from workbench.task import Evaluation, Task, TaskData, to_device

log = logging.getLogger(__name__)

EMBEDDED = Path(__file__).resolve().parent / "embedded"
#: What ``--method hlora`` (and its variants) is compared with in the same run.
HLORA_BASELINES = ("hlora-lora",)


@dataclass
class VlItem:
    """One record ready for the model: input ``image`` (1, S, S), the question, the text answer (comprehension)
    or the target image and its VQ ``codes`` (generation), and the ``group`` (subject or image) it belongs to."""

    index: int
    task: str
    kind: str
    image: torch.Tensor
    question: str
    answer: str
    target: torch.Tensor | None
    codes: torch.Tensor | None
    group: str


@dataclass
class VlBatch:
    """A collated batch: one `workbench.models.medvl.MedVL.encode_batch` dict per kind present, with its share of
    the batch's samples."""

    parts: list[tuple[str, dict[str, Any], float]]
    items: list[VlItem]


@dataclass
class VlData:
    """What `MedVL.read` returns: the records of each split and where they came from."""

    splits: dict[str, list[VlSample]]
    source: str
    description: str


def kind_of(task: str) -> str:
    return "comprehension" if task in COMPREHENSION_TASKS else "generation"


@tasks.register
class MedVLTask(Task):
    name = "medvl"
    precisions = ("float32", "bf16", "fp16")  # bf16 / fp16: mixed-precision training steps
    description = "Medical VQA, reports and image generation with one VLM (synthetic CT/MR or LLaVA/VQA-RAD/SLAKE)"
    card = "medvl-synthetic"
    reads = ("llava-conversations", "vqa-rad", "slake", "pathvqa")
    requires = ("transformers", "monai", "PIL")
    extra = "medvl"
    default_model = "medvl"
    default_method = "hlora"
    capabilities = frozenset({"task_types"})
    baselines = ()
    metrics = ("closed_accuracy", "open_recall", "report_f1", "ssim", "psnr_db")
    metrics_note = (
        "Scores on the test records, higher is better: closed-VQA accuracy, open-answer recall, findings F1 of the "
        "reports, and SSIM / PSNR [dB] of the generated images against their targets (per sub-task in metrics.json, "
        "with ssim_vq_ceiling: the VQ tokenizer's own reconstruction of the targets)."
    )
    defaults: ClassVar[Mapping[str, Any]] = {
        "epochs": 4,
        "batch_size": 16,
        "train_size": 100_000,
        "val_size": 100_000,
        "patience": 100,
        "ema_decay": 0.0,
    }
    options = (
        Option("val_share", float, 0.1, "share of the training groups (subjects or images) held out for validation"),
        Option("max_answer_words", int, 40, "longest text answer decoded at evaluation [tokens]"),
    )
    examples = (
        "workbench adapt --domain medvl                          # H-LoRA (3 stages) beside LoRA plug-ins, ~4.5 min",
        "workbench adapt --domain medvl --baselines moelora,hlora-lora,hlora-mixed,full --epochs 6",
        "workbench adapt --domain medvl --data ~/vqa_rad --method hlora     # VQA-RAD's JSON and image folder",
    )

    @classmethod
    def profile(cls, method: str) -> dict[str, Any]:
        """H-LoRA and its variants are compared with plain-LoRA plug-ins of the same rank."""
        if method in ("hlora", "moelora", "hlora-lora", "hlora-mixed"):
            return {"baselines": tuple(b for b in HLORA_BASELINES if b != method)}
        return {}

    # -- data and model --------------------------------------------------------------------------
    def read(self, data: str | Path | None, seed: int = 0) -> VlData:
        if data is None:
            return VlData(read_folder(EMBEDDED), str(EMBEDDED), "embedded synthetic CT/MR-like slices")
        path = Path(data)
        if path.is_dir():
            return VlData(read_folder(path), str(path), f"vision-language records in {path}")
        if path.is_file():
            return VlData({"train": read_json(path), "test": []}, str(path), f"vision-language records of {path}")
        raise UserError(f"{path}: no such file or folder (give --data a folder with train.json / test.json or a JSON)")

    def _items(self, model: nn.Module, samples: Sequence[VlSample], start: int) -> list[VlItem]:
        size = model.config.image_size
        items = []
        for offset, sample in enumerate(samples):
            image = load_image(sample.image, channels=1, size=size, field="image", source=_where(sample))
            target = codes = None
            answer = sample.answer
            if kind_of(sample.task) == "generation":
                if sample.target_image is not None:
                    target = load_image(sample.target_image, channels=1, size=size, field="target_image",
                                        source=_where(sample))  # fmt: skip
                    with torch.no_grad():
                        codes = model.vq.encode(target[None])[0]
                else:
                    codes = self._answer_codes(model, sample)
                answer = ""
            group = sample.subject or str(sample.image)
            items.append(VlItem(start + offset, sample.task, kind_of(sample.task), image, sample.question, answer,
                                target, codes, str(group)))  # fmt: skip
        return items

    def _answer_codes(self, model: nn.Module, sample: VlSample) -> torch.Tensor:
        """VQ codes written in a generation answer as ``<idx_i>`` tokens (HealthGPT's layout), checked against the
        model's codebook."""
        found = [int(i) for i in CODE_TOKEN.findall(sample.answer)]
        grid, size = model.vq.grid, model.config.vq.codebook_size
        where = f"{_where(sample)}, field 'conversations' (the answer)"
        if not found:
            raise UserError(f"{where}: a {sample.task} record needs a target_image or <idx_i> image tokens")
        beyond = [i for i in found if i >= size]
        if beyond:
            raise UserError(f"{where}: image token <idx_{beyond[0]}> is beyond the codebook (indices 0..{size - 1})")
        if len(found) != grid * grid:
            raise UserError(f"{where}: {len(found)} image tokens, expected {grid * grid} ({grid}×{grid} VQ codes)")
        return torch.tensor(found, dtype=torch.long).view(grid, grid)

    def prepare(self, model: nn.Module, raw: VlData, train_size: int, val_size: int, seed: int):
        spec = spec_of(model)
        if spec is None or spec.family != "medvl":
            raise UserError("task 'medvl' needs a medvl vision-language model (workbench list)")
        self._model = model  # its tokenizer and sizes build the batches (collate)
        rng = np.random.default_rng(seed)
        train = self._items(model, raw.splits["train"], 0)
        test = self._items(model, raw.splits["test"], len(train))
        if not test:
            raise UserError(f"{raw.source}: no test records (a folder needs test.json; a single JSON is all train)")
        groups = sorted({item.group for item in train})
        n_val = max(1, round(self.config["val_share"] * len(groups)))
        if len(groups) <= n_val:
            raise UserError(f"{raw.source}: {len(groups)} training group(s) cannot give validation and training ones")
        val_groups = set(rng.choice(groups, n_val, replace=False).tolist())
        val = [item for item in train if item.group in val_groups][:val_size]
        train = [item for item in train if item.group not in val_groups][:train_size]
        unknown = sum(model.tokenizer.encode(f"{item.question} {item.answer}").count(UNK) for item in train)
        summary = {
            "data": raw.description,
            "records": {"train": len(train), "val": len(val), "test": len(test)},
            "tasks": {
                name: dict(Counter(item.task for item in part))
                for name, part in (("train", train), ("val", val), ("test", test))
            },  # fmt: skip
            "groups": {"train": len(groups) - n_val, "val": n_val, "test": len({item.group for item in test})},
            "unknown_words_train": int(unknown),
        }
        return TaskData(train, val, test, raw.source, summary), {}

    def restore(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        """Nothing of the data lives in the model."""

    def test_samples(self, model: nn.Module, raw: VlData) -> list[VlItem]:
        self._model = model
        return self._items(model, raw.splits["test"], 0)

    def sample_tasks(self, samples: Sequence[VlItem]) -> list[str]:
        return [item.task for item in samples]

    # -- training and scoring --------------------------------------------------------------------
    def collate(self, samples: Sequence[VlItem], device: torch.device) -> VlBatch:
        parts = []
        for kind in ("comprehension", "generation"):
            chosen = [item for item in samples if item.kind == kind]
            if not chosen:
                continue
            images = to_device(torch.stack([item.image for item in chosen]), device)
            questions = [item.question for item in chosen]
            if kind == "comprehension":
                answers: Any = [item.answer for item in chosen]
            else:
                answers = torch.stack([item.codes for item in chosen])
            inputs = self._model.encode_batch(images, questions, answers, kind=kind)
            parts.append((kind, inputs, len(chosen) / len(samples)))
        return VlBatch(parts, list(samples))

    def loss(self, model: nn.Module, batch: VlBatch, training: bool) -> torch.Tensor:
        return sum(share * model(**inputs).loss for _, inputs, share in batch.parts)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, samples: Sequence[VlItem], device) -> Evaluation:
        from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

        model.eval()
        size = 32
        metrics: dict[str, float] = {}
        predictions: dict[str, np.ndarray] = {}
        comprehension = [item for item in samples if item.kind == "comprehension"]
        answers: list[str] = []
        for start in range(0, len(comprehension), size):
            chunk = comprehension[start : start + size]
            images = torch.stack([item.image for item in chunk]).to(device)
            answers += model.answer(images, [item.question for item in chunk], self.config["max_answer_words"])
        by_task: dict[str, list[tuple[VlItem, str]]] = {}
        for item, answer in zip(comprehension, answers):
            by_task.setdefault(item.task, []).append((item, answer))
        if "vqa-closed" in by_task:
            metrics["closed_accuracy"] = float(np.mean([_norm(a) == _norm(i.answer) for i, a in by_task["vqa-closed"]]))
        if "vqa-open" in by_task:
            metrics["open_recall"] = float(np.mean([_recall(i.answer, a) for i, a in by_task["vqa-open"]]))
        if "report" in by_task:
            metrics["report_f1"] = _findings_f1([(i.answer, a) for i, a in by_task["report"]])
        scores = [_score(item, answer) for item, answer in zip(comprehension, answers)]
        predictions["answer_scores"] = np.array(scores, np.float64)  # per record: correct, recall or findings F1
        predictions["answer_task"] = np.array([COMPREHENSION_TASKS.index(i.task) for i in comprehension], np.int64)
        ssim_all, psnr_all = [], []
        for task in GENERATION_TASKS:
            chosen = [item for item in samples if item.task == task and item.target is not None]
            if not chosen:
                continue
            made, targets, inputs = [], [], []
            for start in range(0, len(chosen), size):
                chunk = chosen[start : start + size]
                images = torch.stack([item.image for item in chunk]).to(device)
                made.append(model.generate_images(images, [item.question for item in chunk]).float().cpu())
                targets.append(torch.stack([item.target for item in chunk]))
                inputs.append(images.cpu())
            made, target = torch.cat(made).clamp(0, 1), torch.cat(targets)
            ssim = float(structural_similarity_index_measure(made, target, data_range=1.0))
            psnr = float(peak_signal_noise_ratio(made, target, data_range=1.0))
            key = task.replace("-", "_")
            metrics[f"ssim_{key}"], metrics[f"psnr_db_{key}"] = ssim, psnr
            ssim_all.append(ssim)
            psnr_all.append(psnr)
            predictions[f"generated_{key}"] = made[:4].numpy()
            predictions[f"target_{key}"] = target[:4].numpy()
            predictions[f"input_{key}"] = torch.cat(inputs)[:4].numpy()
            if task == "reconstruct":
                ceiling = model.vq.decode(model.vq.encode(target.to(device))).float().cpu().clamp(0, 1)
                metrics["ssim_vq_ceiling"] = float(structural_similarity_index_measure(ceiling, target, data_range=1.0))
        if ssim_all:
            metrics["ssim"], metrics["psnr_db"] = float(np.mean(ssim_all)), float(np.mean(psnr_all))
        return Evaluation(metrics, predictions)

    def figures(self, evaluations: Mapping[str, Evaluation], out_dir: Path) -> list[tuple[str, str]]:
        from workbench.domains.medvl.plots import generated_images, scores_by_method

        figures = [("Scores of each method on the test records", scores_by_method(evaluations, out_dir))]
        made = generated_images(evaluations, out_dir)
        if made:
            figures.append(("Generated images: input, target and each method's output, per sub-task", made))
        return figures

    # -- data commands ---------------------------------------------------------------------------
    def generate(self, out: Path, seed: int | None = None, **options: Any) -> str:
        from workbench.domains.medvl.generate import generate

        summary = generate(out, seed=0 if seed is None else seed)
        return f"wrote {out}: {summary}"

    def pretrain(self, out: Path, epochs: int = 0, seed: int = 0, device: str = "auto", quiet: bool = False,
                 stage: str | None = None) -> str:  # fmt: skip
        """The shipped tiny VLM: VQ tokenizer, ViT and language model pretrained apart
        (`workbench.domains.medvl.pretrain`)."""
        from workbench.domains.medvl.pretrain import pretrain

        if stage is not None:
            raise UserError(f"--stage {stage}: task 'medvl' has one pretraining recipe (no stages)")
        return pretrain(out, seed=seed)

    def info(self, data: str | Path | None) -> str:
        raw = self.read(data)
        lines = [f"source: {raw.description} ({raw.source})"]
        for name, part in raw.splits.items():
            lines.append(f"{name}: {len(part)} records, {dict(sorted(Counter(s.task for s in part).items()))}")
        return "\n".join(lines)


def _where(sample: VlSample) -> str:
    return sample.source  # "<file> record <i> (<id>)"


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", str(text).lower()))


def _recall(reference: str, answer: str) -> float:
    """Share of the reference's words found in the answer (LLaVA-Med's open-answer recall)."""
    wanted, found = _norm(reference).split(), set(_norm(answer).split())
    return float(np.mean([w in found for w in wanted])) if wanted else float(not found)


def _score(item: VlItem, answer: str) -> float:
    """One comprehension record's score: exact match (closed), word recall (open), findings F1 (report)."""
    if item.task == "vqa-closed":
        return float(_norm(answer) == _norm(item.answer))
    if item.task == "vqa-open":
        return _recall(item.answer, answer)
    return _findings_f1([(item.answer, answer)])


def _findings_f1(pairs: Sequence[tuple[str, str]]) -> float:
    """Micro F1 of the findings parsed from reference and generated reports (1.0 when both name none)."""
    tp = fp = fn = 0
    for reference, answer in pairs:
        truth, made = report_findings(reference), report_findings(answer)
        tp, fp, fn = tp + len(truth & made), fp + len(made - truth), fn + len(truth - made)
    return 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)
