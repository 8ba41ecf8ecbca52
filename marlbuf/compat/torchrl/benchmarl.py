"""marlbuf's storage and prioritized sampler in a BenchMARL experiment.

BenchMARL builds one replay buffer per agent group in ``Algorithm.get_replay_buffer``
(``benchmarl/algorithms/common.py``): a ``TensorDictReplayBuffer`` over ``LazyTensorStorage``
(``LazyMemmapStorage`` with ``buffer_device="disk"``), with ``RandomSampler``, or
``PrioritizedSampler`` when ``off_policy_use_prioritized_replay_buffer`` is set: the sampler
whose compiled extension fails to load against recent torch builds, so that such an experiment
stops at construction (``SumSegmentTreeFp32 is not available``).

:func:`with_marlbuf` takes an algorithm configuration and returns the same configuration whose
algorithm builds its off-policy buffers from :class:`~marlbuf.compat.torchrl.MarlbufStorage`
and, with prioritized replay, :class:`~marlbuf.compat.torchrl.MarlbufPrioritizedSampler` (same
``alpha``, ``beta``, ``priority_key=(group, "td_error")``: the priorities the loss computes flow
back through ``update_tensordict_priority`` as before). Everything else is BenchMARL's::

    from benchmarl.algorithms import MaddpgConfig
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig
    from marlbuf.compat.torchrl.benchmarl import with_marlbuf

    experiment_config = ExperimentConfig.get_from_yaml()
    experiment_config.off_policy_use_prioritized_replay_buffer = True
    experiment = Experiment(
        task=VmasTask.BALANCE.get_from_yaml(),
        algorithm_config=with_marlbuf(MaddpgConfig.get_from_yaml()),
        model_config=MlpConfig.get_from_yaml(),
        critic_model_config=MlpConfig.get_from_yaml(),
        seed=0,
        config=experiment_config,
    )
    experiment.run()

On-policy algorithms (their buffer is emptied every iteration) keep BenchMARL's buffers.
``buffer_device="disk"`` keeps the rows in memory-mapped files in the experiment folder
(``buffer_<group>``). Tested with BenchMARL 1.5.2 (TorchRL 0.11.1).
"""

from __future__ import annotations

import dataclasses
from typing import Any

try:
    from torchrl.data import RandomSampler, TensorDictReplayBuffer
    from torchrl.envs import Compose
    from torchrl.objectives.multiagent import QMixerLoss
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "marlbuf.compat.torchrl.benchmarl needs TorchRL and BenchMARL: pip install "
        "'marlbuf[torchrl]' benchmarl"
    ) from exc

from marlbuf.compat.torchrl.samplers import MarlbufPrioritizedSampler
from marlbuf.compat.torchrl.storage import MarlbufStorage


def marlbuf_replay_buffer(algorithm: Any, group: str, transforms: Any = None) -> Any:
    """The replay buffer of ``group`` that BenchMARL's ``Algorithm.get_replay_buffer`` builds
    for an off-policy ``algorithm``, with marlbuf's storage and prioritized sampler."""
    experiment_config = algorithm.experiment_config
    memory_size = experiment_config.replay_buffer_memory_size(algorithm.on_policy)
    sampling_size = experiment_config.train_minibatch_size(algorithm.on_policy)
    if algorithm.has_rnn:  # items are sequences of one collection per environment
        sequence_length = -(
            -experiment_config.collected_frames_per_batch(algorithm.on_policy)
            // experiment_config.n_envs_per_worker(algorithm.on_policy)
        )
        memory_size = -(-memory_size // sequence_length)
        sampling_size = -(-sampling_size // sequence_length)
    if experiment_config.off_policy_use_prioritized_replay_buffer:
        sampler: Any = MarlbufPrioritizedSampler(
            memory_size,
            experiment_config.off_policy_prb_alpha,
            experiment_config.off_policy_prb_beta,
        )
    else:
        sampler = RandomSampler()
    if algorithm.buffer_device == "disk":
        folder = algorithm.experiment.folder_name / f"buffer_{group}"
        storage = MarlbufStorage(memory_size, path=folder)
    else:
        storage = MarlbufStorage(memory_size, device=algorithm.buffer_device)
    return GroupReplayBuffer(
        group,
        storage=storage,
        sampler=sampler,
        batch_size=sampling_size,
        priority_key=(group, "td_error"),
        transform=Compose(*transforms) if transforms is not None else None,
    )


def agent_weights_key(group: str) -> str:
    """Where :class:`GroupReplayBuffer` puts the importance weights expanded over ``group``'s
    agents (a key at the root: TorchRL's losses look their weight key up among the root keys)."""
    return f"{group}_priority_weight"


class GroupReplayBuffer(TensorDictReplayBuffer):
    """A ``TensorDictReplayBuffer`` of one agent group whose samples also hold the importance
    weights in the group's shape (``[B, n_agents]``) at :func:`agent_weights_key`.

    TorchRL puts one weight per item at ``"priority_weight"``, but a multi-agent loss that
    reduces a value per item and agent (DDPG, SAC, DQN losses of a group) refuses weights of
    another shape (``Tensor and weights shapes must match``): BenchMARL's prioritized MADDPG
    stops at its first gradient step with any prioritized sampler. With the weights expanded
    over the group's agents (and such a loss's ``priority_weight`` key pointed there by
    :func:`with_marlbuf`), the weighted mean is that of one weight per item. Mixer losses
    (QMIX, VDN: one value per item) keep ``"priority_weight"``.
    """

    def __init__(self, group: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.group = group

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        out = super().sample(*args, **kwargs)
        data = out[0] if isinstance(out, tuple) else out
        weights = data.get("priority_weight", None)
        if weights is not None and self.group in data.keys():
            shape = data.get(self.group).batch_size
            extra = len(shape) - weights.dim()
            data.set(
                agent_weights_key(self.group),
                weights.reshape(*weights.shape, *(1,) * extra).expand(shape),
            )
        return out


def with_marlbuf(algorithm_config: Any) -> Any:
    """``algorithm_config`` (a BenchMARL ``AlgorithmConfig`` instance) as a configuration whose
    algorithm builds its off-policy replay buffers with :func:`marlbuf_replay_buffer`: an
    instance of a subclass of its class (``Marlbuf<Name>``) with the same field values."""
    if not dataclasses.is_dataclass(algorithm_config) or isinstance(algorithm_config, type):
        raise TypeError(
            "with_marlbuf takes a BenchMARL algorithm configuration instance (e.g. "
            f"MaddpgConfig.get_from_yaml()); got {algorithm_config!r:.80}"
        )
    if type(algorithm_config) in CONFIG_CLASSES.values():
        return algorithm_config  # already marlbuf's
    config = marlbuf_config_class(type(algorithm_config))
    return config(**_values(algorithm_config))


def _values(config: Any) -> dict[str, Any]:
    """A dataclass configuration's constructor arguments."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}


#: configuration class -> its marlbuf subclass (one per class, so that configurations made by
#: separate calls compare equal, as BenchMARL's do)
CONFIG_CLASSES: dict[type, type] = {}


def marlbuf_config_class(config_class: type) -> type:
    """``Marlbuf<Name>Config``: the subclass of a BenchMARL algorithm configuration class whose
    ``associated_class`` is ``Marlbuf<Name>``, the algorithm that builds its off-policy buffers
    with :func:`marlbuf_replay_buffer` (made once per class)."""
    if config_class in CONFIG_CLASSES:
        return CONFIG_CLASSES[config_class]
    algorithm_class = config_class.associated_class()  # type: ignore[attr-defined]

    def get_replay_buffer(self: Any, group: str, transforms: Any = None) -> Any:
        if self.on_policy:
            return algorithm_class.get_replay_buffer(self, group, transforms)
        return marlbuf_replay_buffer(self, group, transforms)

    def _get_loss(self: Any, group: str, *args: Any, **kwargs: Any) -> Any:
        loss, has_target = algorithm_class._get_loss(self, group, *args, **kwargs)
        per_agent = not isinstance(loss, QMixerLoss)  # a mixer's value is one per item
        has_key = getattr(loss.tensor_keys, "priority_weight", None) is not None
        if not self.on_policy and per_agent and has_key:  # the group-shaped weights
            loss.set_keys(priority_weight=agent_weights_key(group))
        return loss, has_target

    algorithm = type(
        f"Marlbuf{algorithm_class.__name__}",
        (algorithm_class,),
        {
            "get_replay_buffer": get_replay_buffer,
            "_get_loss": _get_loss,
            "__doc__": f"BenchMARL's {algorithm_class.__name__} with marlbuf's replay buffers.",
        },
    )

    def reduce(self: Any) -> tuple[Any, tuple[Any]]:
        # BenchMARL pickles the configuration into the experiment folder: it unpickles as
        # with_marlbuf of the plain configuration (the classes made here have no import path)
        return with_marlbuf, (config_class(**_values(self)),)

    config = type(
        f"Marlbuf{config_class.__name__}",
        (config_class,),
        {"associated_class": staticmethod(lambda: algorithm), "__reduce__": reduce},
    )
    CONFIG_CLASSES[config_class] = config
    return config


__all__ = [
    "GroupReplayBuffer",
    "agent_weights_key",
    "marlbuf_config_class",
    "marlbuf_replay_buffer",
    "with_marlbuf",
]
