"""Closed questions answered from a closed set: each answer's probability from the model's own likelihood of it.

A closed question (``vqa-closed``: yes / no, or any answer of a closed set; `answer_classes`) is answered by ranking
the answers of the set. The model's log-likelihood of answer ``a`` (its words, then ``<eos>``) after the prompt
``<bos> v_1 … v_64 question <sep>`` (`workbench.models.medvl`) is

    log L(a) = Σ_{t=1}^{|a|+1} log softmax(logits at position P − 1 + t − 1)[a_t]        (P: the prompt's length)

and the answers' probabilities are its softmax over the set, ``p(a) = L(a) / Σ_b L(b)``: a distribution over the
classes, which temperature scaling and conformal sets (`workbench.clinical`) take as they take a classifier's.

Features: the head (``lm.lm_head``, the model's `workbench.core.model.ModelSpec` head, where
`workbench.clinical.shift_alarm` hooks) is *called* exactly once per question, on the hidden state at the answer
position (after ``<sep>``): (n, lm_hidden) rows in question order, what the shift alarm and the weighted conformal
sets compare. The later answer tokens are scored through the head's ``forward`` (the same layer, its hooks silent),
and so is greedy decoding inside `head_unobserved`: decoding calls the head over every prompt position and once per
token, which would give the hooks rows of other widths and other counts than the questions.

Shapes:
    images (n, 1, S, S) in [0, 1]; probabilities (n, K) float64, rows summing to 1; features (n, lm_hidden)
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn
from workbench.models.medvl import EOS, position_ids

from workbench.core.errors import UserError

#: Questions scored per forward pass.
BATCH = 32


def normalised(text: str) -> str:
    """An answer as compared and named: lower-case words and digits joined by single spaces ("Yes." → "yes")."""
    return " ".join(re.findall(r"[a-z0-9]+", str(text).lower()))


def answer_classes(answers: Iterable[str]) -> list[str]:
    """The closed answer set: the distinct `normalised` answers, sorted (the run's ``classes``)."""
    return sorted({normalised(answer) for answer in answers} - {""})


class _Unobserved(nn.Module):
    """``head`` called through its ``forward``: the same computation, without the hooks on ``head``."""

    def __init__(self, head: nn.Module):
        super().__init__()
        object.__setattr__(self, "head", head)  # not a child: the model's parameters and state dict stay as they are

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head.forward(hidden)


@contextlib.contextmanager
def head_unobserved(model: nn.Module) -> Iterator[None]:
    """A block in which the language model's head runs without its hooks (greedy decoding, image generation)."""
    head = model.lm.lm_head
    model.lm.lm_head = _Unobserved(head)
    try:
        yield
    finally:
        model.lm.lm_head = head


@torch.no_grad()
def answer_probabilities(model: nn.Module, images: torch.Tensor, questions: Sequence[str],
                         classes: Sequence[str]) -> np.ndarray:  # fmt: skip
    """Each answer's probability for each question (module docstring), batches of `BATCH` questions.

    Args:
        model: a `workbench.models.medvl.MedVL` (its comprehension plug-in acts, when it has plug-ins).
        images: (n, 1, S, S) in [0, 1], on any device (moved to the model's).
        questions: n strings.
        classes: the K answers (`answer_classes`).

    Returns:
        (n, K) float64 probabilities, each row summing to 1.
    """
    if not classes:
        raise UserError("medvl: no closed answers to rank (the run's data held no closed question)")
    tok, head = model.tokenizer, model.lm.lm_head
    targets = [tok.encode(answer) + [EOS] for answer in classes]
    device = next(model.parameters()).device
    found = []
    with model.kind_plugin("comprehension"):
        for start in range(0, len(questions), BATCH):
            chunk = images[start : start + BATCH].to(device)
            batch = model.encode_batch(chunk, list(questions[start : start + BATCH]), padding="left")
            prompt, mask = model.embed(chunk, batch["input_ids"], "comprehension"), batch["attention_mask"]
            scores = []
            for k, target in enumerate(targets):
                ids = torch.tensor(target, device=device).expand(len(chunk), -1)
                embeds = torch.cat([prompt, model.lm.get_input_embeddings()(ids).to(prompt.dtype)], dim=1)
                full = torch.cat([mask, torch.ones_like(ids)], dim=1)
                hidden = model.lm.model(inputs_embeds=embeds, attention_mask=full, position_ids=position_ids(full),
                                        use_cache=False).last_hidden_state  # fmt: skip
                at = prompt.shape[1] - 1  # the answer position (after <sep>): predicts the answer's first token
                if k == 0:
                    first = torch.log_softmax(head(hidden[:, at]).float(), dim=-1)  # the one observed call
                later = torch.log_softmax(head.forward(hidden[:, at + 1 : at + len(target)]).float(), dim=-1)
                score = first[:, target[0]] + later.gather(-1, ids[:, 1:, None]).squeeze(-1).sum(-1)
                scores.append(score)
            found.append(torch.softmax(torch.stack(scores, dim=1).double(), dim=1).cpu().numpy())
    return np.concatenate(found)
