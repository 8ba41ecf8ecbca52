"""MADDPG / MATD3 fed by a device-resident buffer: the whole update round on the device.

With ``TrainConfig(buffer_device="cuda", device="cuda")`` (``marlbuf train --device cuda
--buffer-device cuda``) the runner's buffer keeps its rows on the GPU (a
:class:`marlbuf.MultiAgentReplayBuffer` built with ``device=``, a torch store) and its learner
is a :class:`DeviceBatchedLearner`. One round then reads nothing back from the device:

* ``sample_for_trainers`` draws every trainer's indices on the host (the buffer's samplers),
  sends them to the device without waiting for it, and gathers the round in one
  ``index_select`` into one ``(T, B, row)`` block;
* the learner reads the critic input, next observations, each trainer's own reward, done and
  observation as strided views of that block (:func:`marlbuf.stores.torch.stack_span`,
  :meth:`marlbuf.stores.torch.RowLayout.field_block`), draws its Gumbel and smoothing noise
  with a generator on the device, and returns its losses and TD errors as device tensors
  (:class:`DeviceUpdateStats`);
* prioritized samplers get the TD errors back through one batched
  ``update_priorities_for_trainers(..., sync=False)``: the copy to the host priority trees
  starts at once and is applied before the next draw; a bad update is reported then, or by
  ``check_priority_errors`` at the end of the episode.

``buffer_device="cpu"`` with ``device="cpu"`` runs the same code on the host (the torch CPU
buffer), where the learner draws its noise from the CPU generator exactly as
:class:`marlbuf.algos.maddpg.BatchedLearner` does: given the same batches, both learners give the
same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from marlbuf import _config
from marlbuf.algos.config import TrainConfig
from marlbuf.algos.maddpg import (
    BatchedLearner,
    PhaseHook,
    RoundNoise,
    UpdateStats,
    _no_phase,
)
from marlbuf.algos.nets import Tensor, torch
from marlbuf.stores.torch import DeviceBatch, RowLayout, round_of, round_rows, stack_span


@dataclass
class DeviceUpdateStats:
    """What one device round reports, as tensors on the device (reading them waits for it).

    Attributes
    ----------
    critic_loss : Tensor, shape (T,), float
        Critic (1) loss per trainer.
    actor_loss : Tensor, shape (T,), float
        Actor loss per trainer, NaN where the actor did not update (MATD3's delay).
    td_errors : Tensor, shape (T, B), float
        |Q_1 - y| per trainer and row (for priority updates).
    actor_updated : bool
        Whether actors and targets updated this round.
    """

    critic_loss: Tensor
    actor_loss: Tensor
    td_errors: Tensor
    actor_updated: bool

    def to_host(self) -> UpdateStats:
        """The same numbers as a host :class:`marlbuf.algos.maddpg.UpdateStats`."""
        return UpdateStats(
            critic_loss=self.critic_loss.detach().double().cpu().numpy(),
            actor_loss=self.actor_loss.detach().double().cpu().numpy(),
            td_errors=list(self.td_errors.detach().float().cpu().numpy()),
            actor_updated=self.actor_updated,
        )


class DeviceBatchedLearner(BatchedLearner):
    """:class:`BatchedLearner` for batches of a device buffer (:meth:`update_device`).

    Parameters are those of :class:`BatchedLearner`. On a CUDA device the round noise is drawn
    by a generator on the device (seeded from ``seed``; its state is part of
    :meth:`state_dict`), so no noise crosses the bus; on the CPU it comes from the learner's
    CPU generator, as in :class:`BatchedLearner`.
    """

    def __init__(
        self,
        config: TrainConfig,
        obs_dims: Sequence[int],
        action_dim: int,
        seed: int = 0,
        dtype: Any = None,
    ) -> None:
        super().__init__(config, obs_dims, action_dim, seed, dtype)
        self.device_generator: torch.Generator | None = None
        if self.device.type != "cpu":
            self.device_generator = torch.Generator(device=self.device)
            self.device_generator.manual_seed(int(seed))

    # ------------------------------------------------------------------ inputs
    def _tensor(self, arr: Any) -> Tensor:
        """Tensors (device batches) are only cast; NumPy arrays as in the parent."""
        if isinstance(arr, Tensor):
            return arr.to(self.device, self.dtype)
        return super()._tensor(arr)

    def draw_round_noise(self, batch_size: int) -> RoundNoise:
        if self.device_generator is None:
            return super().draw_round_noise(batch_size)
        gen = self.device_generator
        shape = (self.n_trainers, self.n_trainers, batch_size, self.action_dim)
        tiny = torch.finfo(torch.float32).tiny

        def uniform(size: tuple[int, ...]) -> Tensor:
            out = torch.rand(size, generator=gen, dtype=self.dtype, device=self.device)
            return out.clamp_(min=tiny)

        target_uniform = uniform(shape)
        actor_uniform = uniform(shape[:1] + shape[2:])
        smoothing = None
        if self.config.twin_critics and self.config.target_noise > 0:
            noise = torch.randn(shape, generator=gen, dtype=self.dtype, device=self.device)
            clip = self.config.target_noise_clip
            smoothing = (noise * self.config.target_noise).clamp_(-clip, clip)
        return RoundNoise(target_uniform, actor_uniform, smoothing)

    def _own(self, batches: Sequence[DeviceBatch], rows: Tensor | None, name: str) -> Tensor:
        """Trainer t's own agent's ``name`` field (reward, done) in batch t: shape (T, B)."""
        agents = batches[0].agents
        if rows is not None and len(batches) == len(agents):
            block = batches[0].layout.field_block(rows, name, 0, len(agents))  # (T, B, N)
            if block is not None:
                return self._tensor(block.diagonal(dim1=0, dim2=2).t())
        return self._tensor(torch.stack([b.field(name)[a] for b, a in zip(batches, agents)]))

    def _own_obs_groups(self, batches: Sequence[DeviceBatch], rows: Tensor | None) -> list[Tensor]:
        """Per group of equal observation size, trainer t's own observation in batch t:
        shapes (G, B, obs_dim) (strided views of a round's rows where possible)."""
        agents = batches[0].agents
        layout: RowLayout = batches[0].layout
        out = []
        for start, stop, _ in self.obs_groups:
            block = None
            if rows is not None:
                block = layout.field_block(rows[start:stop], "obs", start, stop)  # (G, B, G, d)
            if block is not None:
                out.append(block.diagonal(dim1=0, dim2=2).permute(2, 0, 1))
            else:
                out.append(torch.stack([batches[t].obs[agents[t]] for t in range(start, stop)]))
        return out

    def _device_target_logits(self, batches: Sequence[DeviceBatch], rows: Tensor | None) -> Tensor:
        """Target actor of every agent j on its next obs in every trainer's batch: logits of
        shape (T, N, B, A), trainers in chunks of ``TARGET_CHUNK_ROWS`` rows (as the parent)."""
        agents = batches[0].agents
        n, batch_size = len(agents), len(batches[0])
        if len(batches) > 1 and all(b is batches[0] for b in batches):
            one = self._device_target_logits(batches[:1], None)  # shared_index: same rows
            return one.expand(len(batches), *one.shape[1:])
        layout: RowLayout = batches[0].layout
        per_chunk = max(1, _config.TARGET_CHUNK_ROWS // batch_size)
        chunks = []
        for first in range(0, len(batches), per_chunk):
            chunk = batches[first : first + per_chunk]
            groups = []
            for start, stop, _ in self.obs_groups:
                block = None
                if rows is not None:
                    flat = rows[first : first + len(chunk)].reshape(-1, rows.shape[-1])
                    block = layout.field_block(flat, "next_obs", start, stop)  # (cB, G, d)
                if block is not None:
                    groups.append(block.transpose(0, 1))
                else:
                    groups.append(
                        torch.stack(
                            [torch.cat([b.next_obs[a] for b in chunk]) for a in agents[start:stop]]
                        )
                    )
            logits = self._actor_groups("target_actor", cast(Any, groups), relu_inplace=True)
            chunks.append(logits.view(n, len(chunk), batch_size, -1).transpose(0, 1))
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks)

    # ------------------------------------------------------------------ one round
    def update_device(
        self, batches: Sequence[DeviceBatch], phase: PhaseHook = _no_phase
    ) -> DeviceUpdateStats:
        """One update round of every trainer, trainer t on ``batches[t]`` (a round of a device
        buffer): the computation of :meth:`BatchedLearner.update`, with every input a view of
        the gathered rows and every output left on the device."""
        rows = round_rows(batches)

        def weights() -> Tensor | None:
            if batches[0].weights is None:
                return None
            whole = round_of(batches)
            stacked = whole.weights if whole is not None else None
            if stacked is None:
                stacked = torch.stack([cast(Tensor, b.weights) for b in batches])
            return self._tensor(stacked)

        critic_loss, td, actor_loss, actor_updates = self._round(
            len(batches[0]),
            phase,
            next_obs=lambda: self._tensor(stack_span(batches, "next_obs")),
            target_logits=lambda: self._device_target_logits(batches, rows),
            own=lambda name: self._own(batches, rows, name),
            critic_in=lambda: self._tensor(stack_span(batches, "obs", "action")),
            weights=weights,
            own_obs_groups=lambda: self._own_obs_groups(batches, rows),
        )
        if actor_loss is None:
            actor_loss = torch.full((self.n_trainers,), math.nan, device=self.device)
        return DeviceUpdateStats(critic_loss, actor_loss, td.abs(), actor_updates)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.device_generator is not None:
            state["device_generator"] = self.device_generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # generator states are CPU byte tensors; torch.load(map_location=device) moved them
        state = dict(state)
        state["generator"] = state["generator"].cpu()
        super().load_state_dict(state)
        saved = state.get("device_generator")
        if self.device_generator is not None and saved is not None:
            self.device_generator.set_state(saved.cpu())


__all__ = ["DeviceBatchedLearner", "DeviceUpdateStats"]
