"""BufferConfig: the constructor's checks, and the configuration written and parsed in one
place (saved states, mapped manifests and the sharded buffer's config read back the same)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marlbuf import AgentSpec, FieldSpec, MultiAgentReplayBuffer
from marlbuf.config import BufferConfig
from marlbuf.samplers import Neighbor, Prioritized, Sequence

SPECS = {
    "a": AgentSpec(obs_shape=(4,), action_shape=(2,)),
    "b": AgentSpec(obs_shape=(3,), action_shape=(3,), obs_dtype=np.float64),
}


def test_from_arguments_fills_the_defaults():
    config, sampler = BufferConfig.from_arguments(SPECS, 1e3)
    assert (config.capacity, config.n_trainers, config.next_obs) == (1000, 2, "auto")
    assert config.sampler_type == type(sampler).__name__ == "Uniform"
    assert (config.global_fields, config.alive) == ({}, False)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"capacity": 0}, ValueError, "capacity must be at least 1"),
        ({"capacity": "8"}, TypeError, "capacity must be an int"),
        ({"layout": "diagonal"}, ValueError, "layout must be one of"),
        ({"next_obs": "twice"}, ValueError, "next_obs must be one of"),
        ({"n_trainers": 0}, ValueError, "n_trainers must be >= 1"),
        ({"n_trainers": True}, TypeError, "n_trainers must be an int"),
        ({"sampler": "uniform"}, TypeError, "sampler must be a marlbuf.samplers.Sampler"),
        ({"parallel_gather": 1}, TypeError, "parallel_gather must be a bool"),
        ({"alive": 1}, TypeError, "alive must be a bool"),
    ],
)
def test_from_arguments_refuses_what_the_constructor_refuses(kwargs, error, match):
    arguments = {"capacity": 8, **kwargs}
    with pytest.raises(error, match=match):
        BufferConfig.from_arguments(SPECS, **arguments)
    with pytest.raises(error, match=match):
        MultiAgentReplayBuffer(SPECS, **arguments)


def test_to_dict_and_from_dict_round_trip_through_json():
    config, _ = BufferConfig.from_arguments(
        SPECS,
        64,
        "agent_major",
        Sequence(4, prioritized=True),
        3,
        "stored",
        "per_agent",
        "storage",
        {"state": FieldSpec((5,))},
        True,
    )
    for batch_options in (True, False):
        text = json.dumps(config.to_dict(batch_options))
        back = BufferConfig.from_dict(json.loads(text), strict=batch_options)
        expected = (
            config
            if batch_options
            else config.__class__(
                **{**config.__dict__, "batch_layout": "rows", "batch_dtype": "float32"}
            )
        )
        assert back == expected
    assert back.sampler().config() == config.sampler().config()


def test_buffer_config_is_what_its_state_and_manifest_say(tmp_path):
    buf = MultiAgentReplayBuffer(
        SPECS, 32, sampler=Prioritized(), n_trainers=1, next_obs="once", path=tmp_path / "m"
    )
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert BufferConfig.from_dict(manifest, strict=True) == buf.config
    state = buf.state_dict()
    assert BufferConfig.from_dict(state).to_dict(False) == buf.config.to_dict(False)
    buf.close()


def test_an_auto_buffer_config_tells_the_format_it_chose():
    buf = MultiAgentReplayBuffer(SPECS, 16, next_obs="auto", seed=0)
    assert buf.config.next_obs == buf.next_obs
    config, _ = BufferConfig.from_arguments(SPECS, 16)
    assert config.initial_next_obs() == buf.next_obs


def test_trainer_checks_name_the_argument():
    config, _ = BufferConfig.from_arguments(SPECS, 16, sampler=Neighbor(2), n_trainers=2)
    assert config.check_trainer(np.int64(1)) == 1
    assert config.check_n_trainers(None) == 2
    with pytest.raises(ValueError, match=r"trainer must be in \[0, 2\)"):
        config.check_trainer(2)
    with pytest.raises(TypeError, match="trainer must be an int"):
        config.check_trainer(True)
    with pytest.raises(ValueError, match=r"n_trainers must be in \[1, 2\]"):
        config.check_n_trainers(3)


@pytest.mark.parametrize("missing", ["specs", "capacity", "n_trainers", "sampler", "layout"])
def test_from_dict_refuses_a_header_without_an_entry(missing):
    config, _ = BufferConfig.from_arguments(SPECS, 16)
    header = config.to_dict()
    del header[missing]
    with pytest.raises(KeyError):
        BufferConfig.from_dict(header, strict=True)


def test_from_dict_strict_wants_ints_as_written():
    config, _ = BufferConfig.from_arguments(SPECS, 16)
    header = {**config.to_dict(), "capacity": 16.0}
    assert BufferConfig.from_dict(header).capacity == 16.0  # the constructor converts it
    with pytest.raises(ValueError, match=r"capacity=16\.0"):
        BufferConfig.from_dict(header, strict=True)
