"""Ray plumbing shared by the distributed classes: starting Ray, waiting with a deadline, and
turning Ray's failures into errors that name the shard (or actor) and what to do."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray import exceptions as ray_exceptions

import marlbuf

#: Default seconds a driver waits for any one answer of a remote actor before it reports the
#: actor as unresponsive (never a hang).
DEFAULT_TIMEOUT_S = 60.0


class ShardError(RuntimeError):
    """A shard (or rollout) actor died or did not answer in time.

    Attributes
    ----------
    shard : int or None
        The shard's index (``None`` for an actor that is not a shard).
    """

    def __init__(self, shard: int | None, message: str) -> None:
        super().__init__(message)
        self.shard = shard


def repo_root() -> str:
    """The folder that holds the ``marlbuf`` package this process imported (what Ray workers
    must find first on their ``PYTHONPATH`` to run the same code)."""
    return str(Path(marlbuf.__file__).resolve().parent.parent)


#: The modules whose code a shard and the learner must share (the packed round format, the
#: samplers' draws, the storage's batch blocks).
_FINGERPRINTED = (
    "buffer.py",
    "reading.py",
    "samplers",
    "prioritized.py",
    "storage.py",
    "staging",
    "spec.py",
    "distributed/_shard.py",
)


def code_fingerprint() -> str:
    """A hash of the marlbuf sources a shard and the learner must share: equal fingerprints
    mean the same code even where the package sits at another path (another node)."""
    digest = hashlib.sha256()
    root = Path(marlbuf.__file__).resolve().parent
    for name in _FINGERPRINTED:
        path = root / name
        for source in sorted(path.glob("*.py")) if path.is_dir() else [path]:
            digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def worker_env() -> dict[str, Any]:
    """A Ray ``runtime_env`` whose workers import this process's ``marlbuf``."""
    paths = [repo_root(), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
    # idle OpenMP pools busy-wait on small machines (see marlbuf.bench.tools.common.quiet_threads)
    env["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    return {"env_vars": env}


def init_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    object_store_memory: int | None = None,
    **kwargs: Any,
) -> bool:
    """Start a local Ray instance, or connect to ``address`` (``"auto"``: the running
    cluster), so that workers import this process's ``marlbuf``.

    Parameters
    ----------
    address : str, optional
        ``None`` starts a local instance limited to ``num_cpus``; otherwise passed to
        ``ray.init(address=...)``.
    num_cpus : int, optional
        CPUs the local instance may schedule on (default: this machine's count).
    object_store_memory : int, optional
        Bytes of the local object store (default: Ray's, 30% of memory).
    **kwargs
        More ``ray.init`` arguments.

    Returns
    -------
    bool
        ``True`` if this call started or connected Ray, ``False`` if it was running already.
    """
    if ray.is_initialized():
        return False
    kwargs.setdefault("runtime_env", worker_env())
    kwargs.setdefault("log_to_driver", False)
    if address is None:
        ray.init(
            num_cpus=num_cpus if num_cpus is not None else os.cpu_count(),
            object_store_memory=object_store_memory,
            include_dashboard=False,
            **kwargs,
        )
    else:
        ray.init(address=address, **kwargs)
    return True


def unwrap(exc: BaseException) -> BaseException:
    """The user-facing error inside a failed remote call: a ``ValueError``/``TypeError``/...
    raised by the remote code comes back as itself, without Ray's wrapper."""
    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray_exceptions.RayTaskError) and isinstance(
        cause, (ValueError, TypeError, MemoryError, OSError, KeyError, TimeoutError)
    ):
        return cause
    return exc


def get(ref: Any, timeout: float, what: str, shard: int | None, hint: str = "") -> Any:
    """``ray.get(ref)`` within ``timeout`` seconds, or a :class:`ShardError` / the remote
    call's own error.

    Parameters
    ----------
    ref : ObjectRef
        The result of one remote call.
    timeout : float
        Seconds to wait.
    what : str
        What was asked (for the message), e.g. ``"sample_round"``.
    shard : int or None
        The shard asked, named in the message.
    hint : str
        What the caller can do about a dead actor (appended to the message).
    """
    name = f"shard {shard}" if shard is not None else "the actor"
    try:
        return ray.get(ref, timeout=timeout)
    except ray_exceptions.GetTimeoutError:
        raise ShardError(
            shard,
            f"{name} did not answer {what} within {timeout:g} s (dead, hung or overloaded); "
            f"{hint or 'raise timeout= if the machine is just busy'}",
        ) from None
    except ray_exceptions.RayActorError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ShardError(
            shard, f"{name} died before answering {what} ({first[:200]}); {hint}".rstrip("; ")
        ) from None
    except ray_exceptions.RayTaskError as exc:
        inner = unwrap(exc)
        if inner is not exc:
            raise inner from None
        raise


def get_all(
    refs: Sequence[tuple[int | None, Any]],
    timeout: float,
    what: str,
    hint: Callable[[int | None], str] | None = None,
) -> list[Any]:
    """:func:`get` of several ``(shard, ref)`` pairs with one shared deadline, in order;
    ``hint(shard)`` says what to do about a dead one."""
    deadline = time.monotonic() + timeout
    return [
        get(
            ref,
            max(0.0, deadline - time.monotonic()),
            what,
            shard,
            "" if hint is None else hint(shard),
        )
        for shard, ref in refs
    ]


__all__ = ["DEFAULT_TIMEOUT_S", "ShardError", "get", "get_all", "init_ray", "repo_root"]
