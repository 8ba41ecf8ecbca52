"""Network pieces shared by both trainer formulations.

Every network is a 3-layer ReLU MLP ``in -> hidden -> hidden -> out`` stored as plain tensors
``W`` of shape ``(in, out)`` and ``b`` of shape ``(out,)`` (``y = x @ W + b``), so that the
per-agent reference and the batched formulation (the same tensors stacked over trainers) hold
literally the same numbers. Initialisation follows TensorFlow's ``fully_connected`` defaults,
which openai/maddpg used: Glorot-uniform weights, zero biases.
"""

from __future__ import annotations

import math
from typing import Any

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "marlbuf.algos needs PyTorch: pip install 'marlbuf[algos]' "
        "(install torch==2.13.0 CPU first on CPU-only machines)"
    ) from exc

Tensor = torch.Tensor

#: Layer names of one MLP in order; parameter tensors are named ``f"{layer}.W"``/``f"{layer}.b"``.
LAYERS = ("l0", "l1", "l2")


def mlp_shapes(in_dim: int, hidden: int, out_dim: int) -> list[tuple[int, int]]:
    """(fan_in, fan_out) of the three layers."""
    return [(in_dim, hidden), (hidden, hidden), (hidden, out_dim)]


def glorot_mlp(
    in_dim: int, hidden: int, out_dim: int, generator: torch.Generator
) -> dict[str, Tensor]:
    """Fresh float32 parameters of one MLP: ``{"l0.W": (in, hidden), "l0.b": (hidden,), ...}``."""
    params: dict[str, Tensor] = {}
    for name, (fan_in, fan_out) in zip(LAYERS, mlp_shapes(in_dim, hidden, out_dim)):
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        weight = torch.rand((fan_in, fan_out), generator=generator, dtype=torch.float32)
        params[f"{name}.W"] = weight * (2 * bound) - bound
        params[f"{name}.b"] = torch.zeros(fan_out, dtype=torch.float32)
    return params


def gumbel_softmax(logits: Tensor, uniform: Tensor, temperature: float = 1.0) -> Tensor:
    """A soft Gumbel-softmax sample, as openai/maddpg's ``SoftCategoricalPd.sample``.

    Parameters
    ----------
    logits : Tensor, shape (..., A)
    uniform : Tensor, shape (..., A)
        Uniform(0, 1) noise, drawn by the caller (so both formulations consume the same draws).
    """
    scores = (logits - torch.log(-torch.log(uniform))) / temperature
    # softmax spelled out: torch.softmax is slow over a last axis of 5 on the CPU
    scores = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return scores / scores.sum(dim=-1, keepdim=True)


def draw_uniform(shape: tuple[int, ...], generator: torch.Generator, dtype: Any) -> Tensor:
    """Uniform noise in (0, 1), never exactly 0 (whose double log would be inf)."""
    tiny = torch.finfo(torch.float32).tiny
    return torch.rand(shape, generator=generator, dtype=dtype).clamp_(min=tiny)


@torch.no_grad()
def clip_grad_by_norm_(grads: list[Tensor], clip: float, stacked: bool) -> None:
    """TensorFlow ``clip_by_norm`` on each gradient tensor, in place:
    ``g * clip / max(||g||, clip)``.

    With ``stacked=True`` the leading axis indexes trainers and each trainer's slice is clipped
    by its own norm (exactly what the per-agent reference does to its own tensor).
    """
    for grad in grads:
        if stacked:
            norms = grad.flatten(1).norm(dim=1)
            scale = clip / torch.clamp(norms, min=clip)
            grad.mul_(scale.view(-1, *([1] * (grad.dim() - 1))))
        else:
            norm = grad.norm()
            grad.mul_(clip / torch.clamp(norm, min=clip))


@torch.no_grad()
def polyak_(targets: list[Tensor], sources: list[Tensor], tau: float) -> None:
    """``target <- (1 - tau) * target + tau * source`` for each pair, in place."""
    for target, source in zip(targets, sources):
        target.mul_(1.0 - tau).add_(source, alpha=tau)
