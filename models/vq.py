"""A small VQ-VAE image tokenizer: 64 × 64 grayscale images ↔ 8 × 8 grids of codebook indices.

The image tokenizer of the ``medvl`` family (`workbench.models.medvl`), standing for HealthGPT's VQGAN (8192
codes, seed 000): the language model writes an image as 64 ``<idx_i>`` tokens and this decoder paints them.
Paper: A. van den Oord, O. Vinyals, K. Kavukcuoglu, "Neural Discrete Representation Learning", NeurIPS 2017
(VQ-VAE; EMA codebook updates in its appendix, A. Razavi et al., "Generating Diverse High-Fidelity Images with
VQ-VAE-2", NeurIPS 2019)::

    z   = E(2x − 1)                                  # (batch, d, 8, 8): 3 stride-2 convs + residual blocks
    k   = argmin_j ‖z − e_j‖²   per position         # (batch, 8, 8) codes
    z_q = z + sg(e_k − z)                            # straight-through: the decoder's gradient reaches E
    x̂   = sigmoid(D(z_q))                            # (batch, 1, 64, 64) in [0, 1]
    loss = ‖x̂ − x‖² + β ‖z − sg(e_k)‖²               # β = 0.25 (commitment)

The codebook is not learnt by gradient: each training step moves it towards the running mean of the encoder
outputs assigned to each code (EMA of counts ``N_j`` and sums ``m_j``, decay γ, Laplace-smoothed counts;
``e_j = m_j / N_j``). It is initialised from the first training batch's encoder outputs, and a code whose EMA
count falls below ``restart_below`` is restarted at a random encoder output of the batch (dead-code restart).
All codebook state is buffers, so a frozen tokenizer has no parameters to train and the state dict holds it.

Shapes:
    images (batch, 1, 64, 64) in [0, 1] → codes (batch, 8, 8) int64 in [0, codebook_size) → images (batch, 1, 64, 64)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from workbench.core.errors import UserError


@dataclass(frozen=True)
class VQConfig:
    """Sizes of a `VQTokenizer`.

    Args:
        image_size: input side [pixels] (default 64); a multiple of 8 (three stride-2 convolutions).
        codebook_size: number of codes K (default 256).
        code_dim: width d of a code (default 32).
        channels: width of the convolutions at 8 × 8 and 16 × 16 (default 64; the first conv has half).
        res_blocks: residual blocks at 8 × 8 in the encoder and in the decoder (default 2).
        beta: commitment weight β (default 0.25).
        decay: EMA decay γ of the codebook statistics (default 0.99).
        restart_below: EMA count under which a code is restarted (default 1: fewer than one assignment a step).
    """

    image_size: int = 64
    codebook_size: int = 256
    code_dim: int = 32
    channels: int = 64
    res_blocks: int = 2
    beta: float = 0.25
    decay: float = 0.99
    restart_below: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


class VQOutput(NamedTuple):
    """What `VQTokenizer.forward` returns: reconstruction (batch, 1, H, W) in [0, 1], codes (batch, H/8, W/8),
    ``loss`` = reconstruction MSE + β · commitment, the two terms, and the codebook perplexity (codes in use)."""

    reconstruction: torch.Tensor
    codes: torch.Tensor
    loss: torch.Tensor
    reconstruction_loss: torch.Tensor
    commitment_loss: torch.Tensor
    perplexity: torch.Tensor


class ResBlock(nn.Module):
    """``h + Conv1x1(ReLU(Conv3x3(ReLU(h))))`` (VQ-VAE's residual block). Shapes: (batch, c, h, w) → same."""

    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.Conv2d(channels, channels, 1)
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.body(h)


class VQTokenizer(nn.Module):
    """VQ-VAE with an EMA codebook (see the module docstring).

    Args:
        config: a `VQConfig` (default sizes when None).

    Shapes:
        images (batch, 1, S, S) in [0, 1] → `VQOutput`; `encode`: → codes (batch, S/8, S/8) int64;
        `decode`: codes → (batch, 1, S, S) in [0, 1]
    """

    def __init__(self, config: VQConfig | None = None):
        super().__init__()
        self.config = config = config or VQConfig()
        if config.image_size % 8 or config.channels % 2:
            raise UserError(
                f"vq: image_size {config.image_size} must be a multiple of 8 and channels {config.channels} even"
            )
        c, d, k = config.channels, config.code_dim, config.codebook_size
        self.encoder = nn.Sequential(
            nn.Conv2d(1, c // 2, 4, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(c // 2, c, 4, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(c, c, 4, stride=2, padding=1),
            *[ResBlock(c) for _ in range(config.res_blocks)],
            nn.ReLU(),
            nn.Conv2d(c, d, 1),
        )
        self.decoder = nn.Sequential(
            nn.Conv2d(d, c, 3, padding=1),
            *[ResBlock(c) for _ in range(config.res_blocks)],
            nn.ReLU(),
            nn.ConvTranspose2d(c, c, 4, stride=2, padding=1),
            nn.ReLU(),
            nn.ConvTranspose2d(c, c // 2, 4, stride=2, padding=1),
            nn.ReLU(),
            nn.ConvTranspose2d(c // 2, 1, 4, stride=2, padding=1),
        )
        self.register_buffer("codebook", torch.randn(k, d) * 0.1)
        self.register_buffer("ema_count", torch.ones(k))
        self.register_buffer("ema_sum", self.codebook.clone())
        self.register_buffer("initialised", torch.zeros((), dtype=torch.bool))

    @property
    def grid(self) -> int:
        """Side of the code grid (image_size / 8)."""
        return self.config.image_size // 8

    def _check(self, images: torch.Tensor) -> None:
        s = self.config.image_size
        if images.ndim != 4 or tuple(images.shape[1:]) != (1, s, s):
            raise UserError(f"vq: expected images (batch, 1, {s}, {s}) in [0, 1], got {tuple(images.shape)}")

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """The encoder's output z (batch, d, S/8, S/8) before quantisation."""
        self._check(images)
        return self.encoder(images * 2 - 1)

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """Index of the nearest code to each position of z (batch, d, h, w) → (batch, h, w) int64."""
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        distance = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.codebook.T + self.codebook.pow(2).sum(1)
        return distance.argmin(1).view(z.shape[0], z.shape[2], z.shape[3])

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (batch, h, w) → code vectors (batch, d, h, w)."""
        if codes.dtype not in (torch.int32, torch.int64) or codes.ndim != 3:
            raise UserError(f"vq: expected integer codes (batch, h, w), got {codes.dtype} {tuple(codes.shape)}")
        if codes.numel() and (codes.min() < 0 or codes.max() >= self.config.codebook_size):
            raise UserError(
                f"vq: codes must lie in [0, {self.config.codebook_size}), found {codes.min()}…{codes.max()}"
            )
        return self.codebook[codes.long()].permute(0, 3, 1, 2)

    @torch.no_grad()
    def _update_codebook(self, z: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """One EMA step of the codebook towards the mean encoder output of each code, then dead-code restarts;
        returns the codes (recomputed after the first step's initialisation)."""
        cfg = self.config
        flat = z.detach().permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        if not bool(self.initialised):
            picks = torch.randint(len(flat), (cfg.codebook_size,), device=flat.device)
            self.codebook.copy_(flat[picks])
            self.ema_sum.copy_(flat[picks])
            self.ema_count.fill_(1.0)
            self.initialised.fill_(True)
            codes = self.nearest(z)
        onehot = F.one_hot(codes.reshape(-1), cfg.codebook_size).to(flat.dtype)
        self.ema_count.mul_(cfg.decay).add_(onehot.sum(0), alpha=1 - cfg.decay)
        self.ema_sum.mul_(cfg.decay).add_(onehot.T @ flat, alpha=1 - cfg.decay)
        total = self.ema_count.sum()
        smoothed = (self.ema_count + 1e-5) / (total + cfg.codebook_size * 1e-5) * total
        self.codebook.copy_(self.ema_sum / smoothed[:, None])
        dead = self.ema_count < cfg.restart_below
        if dead.any():
            picks = torch.randint(len(flat), (int(dead.sum()),), device=flat.device)
            self.codebook[dead] = flat[picks]
            self.ema_sum[dead] = flat[picks]
            self.ema_count[dead] = 1.0
        return codes

    def forward(self, images: torch.Tensor) -> VQOutput:
        """Reconstruct ``images`` (batch, 1, S, S) in [0, 1]; in training mode the codebook takes one EMA step."""
        z = self.features(images)
        codes = self.nearest(z)
        if self.training and torch.is_grad_enabled():
            codes = self._update_codebook(z, codes)
        z_q = self.lookup(codes)
        commitment = F.mse_loss(z, z_q.detach())
        z_q = z + (z_q - z).detach()  # straight-through estimator
        reconstruction = torch.sigmoid(self.decoder(z_q))
        reconstruction_loss = F.mse_loss(reconstruction, images)
        usage = F.one_hot(codes.reshape(-1), self.config.codebook_size).float().mean(0)
        perplexity = torch.exp(-(usage * torch.log(usage + 1e-10)).sum())
        loss = reconstruction_loss + self.config.beta * commitment
        return VQOutput(reconstruction, codes, loss, reconstruction_loss, commitment, perplexity)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images (batch, 1, S, S) in [0, 1] → codes (batch, S/8, S/8) int64."""
        return self.nearest(self.features(images))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (batch, S/8, S/8) int64 in [0, K) → images (batch, 1, S, S) in [0, 1]."""
        return torch.sigmoid(self.decoder(self.lookup(codes)))


def psnr(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Peak signal-to-noise ratio [dB] per image of (batch, 1, H, W) images in [0, 1]: ``10 log10(1 / MSE)``."""
    mse = (prediction - target).pow(2).flatten(1).mean(1).clamp_min(1e-12)
    return -10 * torch.log10(mse)


def ssim(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean structural similarity of (batch, 1, H, W) images in [0, 1] (torchmetrics: Gaussian window 11, σ 1.5)."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    return structural_similarity_index_measure(prediction.float(), target.float(), data_range=1.0)
