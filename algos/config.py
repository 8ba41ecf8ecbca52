"""Training configuration: one dataclass, one docstring per field, validated before any work."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

ALGOS = ("maddpg", "matd3")
ENVS = ("cooperative_navigation", "predator_prey")
SAMPLERS = ("uniform", "neighbor", "prioritized", "prioritized_neighbor")
#: Index orders of the uniform and prioritized samplers (``marlbuf.samplers.ORDERS``).
SAMPLE_ORDERS = ("random", "memory")
#: The order of configurations saved before :attr:`TrainConfig.sample_order` existed.
LEGACY_SAMPLE_ORDER = "random"
LAYOUTS = ("interleaved", "agent_major")
FORMULATIONS = ("batched", "loop")
ENV_IMPLS = ("fast", "mpe2")

#: Agent (or predator) counts accepted for the MPE scenarios.
MIN_AGENTS, MAX_AGENTS = 1, 48


def _same_device(name: str) -> str:
    """``"cuda"`` and ``"cuda:0"`` name the same device."""
    return "cuda:0" if name == "cuda" else name


@dataclass
class TrainConfig:
    """Everything a training run depends on. Defaults are the paper's (openai/maddpg's).

    Deviations from MADDPG/MATD3 are fields, off by default, and say so.
    """

    algo: str = "maddpg"
    """``"maddpg"`` or ``"matd3"`` (twin critics, target smoothing, delayed actor)."""
    env: str = "cooperative_navigation"
    """``"cooperative_navigation"`` (MPE simple_spread) or ``"predator_prey"`` (simple_tag)."""
    n_agents: int = 3
    """Agents (cooperative navigation) or predators (predator-prey; prey and landmarks follow
    the paper: M = max(1, N // 3) prey, L = max(2, N // 3) landmarks, all trained)."""
    n_prey: int | None = None
    """Predator-prey only: override the number of prey."""
    env_impl: str = "fast"
    """``"fast"``: marlbuf's vectorized MPE step (bit-identical results); ``"mpe2"``: mpe2's own
    code, unmodified (what the original trainers ran; the faithful end-to-end baseline)."""
    layout: str = "interleaved"
    """Buffer storage layout: ``"interleaved"`` (one gather per trainer) or ``"agent_major"``."""
    sampler: str = "uniform"
    """``uniform``, ``neighbor``, ``prioritized`` or ``prioritized_neighbor``."""
    sample_order: str | None = None
    """Uniform and prioritized samplers: ``"memory"`` (indices in ascending slot order: the
    same batch as a set, gathered front to back through the storage; see
    ``marlbuf.samplers.Uniform``), ``"random"`` (draw order), or ``None``: the sampler's
    default (uniform: memory, prioritized: random; docs/training.md, "Choosing a run length").
    The neighbor samplers draw runs in draw order and ignore it."""
    run_length: int = 1
    """Neighbor sampler: contiguous slots per reference. 1 (B distinct slots, no runs) is the
    longest that kept uniform's final return on cooperative navigation in the locality sweep
    (docs/training.md, "Choosing a run length"); longer runs sample faster but lost return."""
    alpha: float = 0.6
    """Prioritized samplers: priority exponent."""
    beta: float = 0.5
    """Prioritized samplers: importance-weight exponent at the start, annealed linearly to
    ``beta_final`` over ``beta_anneal_steps`` update rounds."""
    beta_final: float = 1.0
    """Prioritized samplers: importance-weight exponent at the end of the annealing."""
    beta_anneal_rounds: int = 10_000
    """Prioritized samplers: update rounds over which beta goes from ``beta`` to ``beta_final``."""
    priority_eps: float = 1e-6
    """Prioritized samplers: added to |TD error| so no slot gets probability zero."""
    priority_index: str = "host"
    """``prioritized``: where the priority trees live, ``"host"`` or ``"device"`` (tensor trees
    on the buffer's device when ``buffer_device`` is set; a host buffer keeps host trees)."""
    batch_size: int = 1024
    """Rows per trainer per update."""
    buffer_size: int = 1_000_000
    """Replay capacity in joint transitions."""
    episode_length: int = 25
    """Steps per episode (MPE truncates there)."""
    update_every: int = 100
    """Env steps between update rounds (every trainer updates once per round)."""
    warmup_steps: int | None = None
    """Stored transitions before the first update; ``None`` means ``batch_size * 25``
    (openai/maddpg's ``batch_size * max_episode_len``)."""
    gamma: float = 0.95
    """Discount."""
    tau: float = 0.01
    """Polyak rate of the target networks (target <- (1 - tau) target + tau online)."""
    lr_actor: float = 0.01
    """Adam learning rate of the actors."""
    lr_critic: float = 0.01
    """Adam learning rate of the critics."""
    hidden: int = 64
    """Units in each of the two hidden layers of every actor and critic."""
    grad_clip: float = 0.5
    """Clip-by-norm per parameter tensor (TensorFlow's ``clip_by_norm``), as openai/maddpg."""
    actor_reg: float = 1e-3
    """Weight of mean(logits^2) in the actor loss."""
    policy_delay: int = 2
    """MATD3: the actor and all target networks update every ``policy_delay``-th round."""
    target_noise: float = 0.2
    """MATD3: std of the Gaussian noise added to every target action (policy smoothing)."""
    target_noise_clip: float = 0.5
    """MATD3: the smoothing noise is clipped to +-this."""
    target_init: str = "copy"
    """``"copy"``: target networks start as copies of the online ones (the usual DDPG
    practice). ``"independent"``: their own random initial weights, as openai/maddpg (and the
    MATD3 code) do — it never copies, the polyak updates pull the targets in. **The default is
    a deviation**; ``"independent"`` reproduces the original."""
    shared_index: bool = False
    """One index array for all trainers (EPyMARL/BenchMARL). **A deviation from MADDPG**."""
    formulation: str = "batched"
    """``"batched"`` (stacked weights over agents, bmm) or ``"loop"`` (one module per agent,
    the readable reference). Both give the same numbers."""
    overlap_gather: bool = False
    """Loop formulation: gather trainer t+1's batch in a background thread while trainer t
    updates (the gather kernels release the GIL)."""
    seed: int = 0
    """Seeds the environment, the buffer's sampler, the networks and the exploration noise."""
    threads: int = 1
    """Torch intra-op threads. 1 by default: idle OpenMP pools busy-wait on small machines."""
    device: str = "cpu"
    """``"cpu"`` or ``"cuda"`` (networks and batches; the buffer stays in host memory unless
    ``buffer_device`` is set)."""
    buffer_device: str | None = None
    """``None``: the NumPy buffer in host memory (batches go to ``device`` through pinned,
    non-blocking copies). ``"cuda"``/``"cpu"``: a buffer whose rows live in a torch tensor on
    that device (a torch store), which must be ``device``: the whole update round (gathers,
    learner, priority updates; indices are drawn on the host and sent without waiting) then
    runs without reading anything back (batched formulation, interleaved
    layout)."""
    obs_dtype: str = "float32"
    """Storage dtype of observations in the replay buffer: ``"float32"``, or ``"float16"`` (half
    the observation bytes; batches are converted back to float32 in the gather, so the
    learner is unchanged), in the host buffer and in a device buffer (``buffer_device``)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form notes stored with checkpoints and logs (not used by the trainer)."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def twin_critics(self) -> bool:
        """Whether this is MATD3."""
        return self.algo == "matd3"

    @property
    def effective_warmup(self) -> int:
        """Transitions stored before the first update round."""
        return self.batch_size * 25 if self.warmup_steps is None else self.warmup_steps

    def validate(self) -> None:
        if self.obs_dtype not in ("float32", "float16"):
            raise ValueError(
                f"obs_dtype must be 'float32' or 'float16'; got obs_dtype={self.obs_dtype!r}"
            )
        """Raise ``ValueError``/``TypeError`` naming the first bad field; no side effects."""
        for name, allowed in (
            ("algo", ALGOS),
            ("env", ENVS),
            ("sampler", SAMPLERS),
            ("sample_order", (None, *SAMPLE_ORDERS)),
            ("layout", LAYOUTS),
            ("formulation", FORMULATIONS),
            ("env_impl", ENV_IMPLS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}; got {name}={value!r}")
        ints = (
            "n_agents",
            "run_length",
            "batch_size",
            "buffer_size",
            "episode_length",
            "update_every",
            "hidden",
            "policy_delay",
            "threads",
            "beta_anneal_rounds",
        )
        for name in ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
        if not MIN_AGENTS <= self.n_agents <= MAX_AGENTS:
            raise ValueError(
                f"n_agents must be in [{MIN_AGENTS}, {MAX_AGENTS}] for the MPE scenarios; "
                f"got n_agents={self.n_agents}"
            )
        if self.env == "cooperative_navigation" and self.n_prey is not None:
            raise ValueError("n_prey applies to predator_prey only; got n_prey with env=CN")
        if self.n_prey is not None and (not isinstance(self.n_prey, int) or self.n_prey < 1):
            raise ValueError(f"n_prey must be a positive int; got n_prey={self.n_prey!r}")
        if self.warmup_steps is not None and (
            not isinstance(self.warmup_steps, int) or self.warmup_steps < self.batch_size
        ):
            raise ValueError(
                f"warmup_steps must be an int >= batch_size ({self.batch_size}); "
                f"got warmup_steps={self.warmup_steps!r}"
            )
        if self.effective_warmup > self.buffer_size:
            raise ValueError(
                f"the buffer (buffer_size={self.buffer_size}) must hold the warm-up "
                f"({self.effective_warmup} transitions); raise buffer_size or lower warmup_steps"
            )
        if self.sampler in ("neighbor",) and self.batch_size % self.run_length:
            raise ValueError(
                f"run_length must divide batch_size for the neighbor sampler; got "
                f"run_length={self.run_length}, batch_size={self.batch_size}"
            )
        if self.sampler.startswith("prioritized") and self.shared_index:
            raise ValueError(
                "shared_index=True cannot be combined with a prioritized sampler (each trainer "
                "keeps its own priority tree); drop shared_index or use uniform/neighbor"
            )
        if self.target_init not in ("copy", "independent"):
            raise ValueError(
                f"target_init must be 'copy' or 'independent'; got target_init={self.target_init!r}"
            )
        if self.overlap_gather and self.formulation != "loop":
            raise ValueError(
                "overlap_gather applies to formulation='loop' (the batched formulation needs "
                "every batch before it starts); got formulation='batched'"
            )
        floats = {
            "gamma": (0.0, 1.0),
            "tau": (0.0, 1.0),
            "alpha": (0.0, 10.0),
            "beta": (0.0, 1.0),
            "beta_final": (0.0, 1.0),
        }
        for name, (lo, hi) in floats.items():
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not lo <= value <= hi:
                raise ValueError(f"{name} must be a number in [{lo}, {hi}]; got {name}={value!r}")
        positive = ("lr_actor", "lr_critic", "grad_clip", "priority_eps")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number; got {name}={value!r}")
        for name in ("actor_reg", "target_noise", "target_noise_clip"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0; got {name}={value!r}")
        if self.priority_index not in ("host", "device"):
            raise ValueError(
                "priority_index must be 'host' or 'device'; got "
                f"priority_index={self.priority_index!r}"
            )
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:k]'; got device={self.device!r}")
        if self.buffer_device is not None:
            bd = self.buffer_device
            if not isinstance(bd, str) or (
                bd not in ("cpu", "cuda") and not bd.startswith("cuda:")
            ):
                raise ValueError(
                    f"buffer_device must be None, 'cpu' or 'cuda[:k]'; got buffer_device={bd!r}"
                )
            if _same_device(bd) != _same_device(self.device):
                raise ValueError(
                    f"buffer_device must be the learner's device (the round's batches stay "
                    f"where they are gathered); got buffer_device={bd!r}, device={self.device!r}"
                )
            if self.formulation != "batched" or self.layout != "interleaved":
                raise ValueError(
                    "buffer_device needs formulation='batched' and layout='interleaved' (the "
                    f"device buffer's round); got formulation={self.formulation!r}, "
                    f"layout={self.layout!r}"
                )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (stored in checkpoints and logs)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error. A configuration saved before
        ``sample_order`` existed drew in :data:`LEGACY_SAMPLE_ORDER` and keeps it."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}; known: {sorted(names)}")
        return cls(**{"sample_order": LEGACY_SAMPLE_ORDER, **data})
