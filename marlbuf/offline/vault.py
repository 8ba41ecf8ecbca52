"""Flashbax vaults (format 1.x) read and written with TensorStore alone: no JAX, Flax or Chex.

A vault is the folder Flashbax's ``Vault`` writes and OG-MARL distributes its datasets in::

    <base>/<vault name>/<uid>/
        metadata.json      {"version": 1.2, "structure_shape": {...}, "structure_dtype": {...},
                            ...user keys}
        manifest.ocdbt     one OCDBT key-value store holding every array below
        d/...              its data files

* ``structure_shape`` and ``structure_dtype`` are the same nested dictionary of the experience's
  leaves (OG-MARL: ``observations``, ``actions``, ``rewards``, ``terminals``, ``truncations``,
  ``infos.legals``, ``infos.state``): per leaf, its shape as a Python tuple's text
  (``"(1, 5000, 3, 30)"``; the time axis there is the writing buffer's, not the vault's) and
  its dtype name.
* Each leaf is a zarr (version 2) array in the store, under its key path joined by dots with a
  dot after every key (``observations.``, ``infos.legals.``), of shape ``(B, 10**13, *E)``: ``B``
  streams written side by side, a time axis of fixed, huge length that writes extend, and the
  per-step shape ``E``. Flashbax compresses chunks with gzip (level 5) by default.
* ``vault_index`` is a zarr ``int32`` array of shape ``(1,)``: the number of valid time steps.
  Data past it is ignored; writers write the data first and the index last, so a vault is
  consistent after every write.
* Readers refuse another major version (``version // 1 != 1``), as Flashbax does.

:func:`vault_info` opens a vault read-only and checks it as a whole before anything is read:
the metadata (size bounded, version, structure), every leaf's zarr metadata against the
structure (dtype, per-step shape, streams; chunks of at most :data:`MAX_CHUNK_BYTES`), and that
every chunk holding a step below ``vault_index`` is present in the store, so a truncated vault
or an index past the data is refused with a :class:`VaultError` before any step is read. The
folder must hold only regular files and folders (no symbolic links, devices or sockets), so the
reader opens nothing outside it and no read is larger than the files. :class:`VaultReader`
then reads ranges of steps; a chunk that fails to decode (a damaged leaf) is a
:class:`VaultError` naming the leaf.

:class:`VaultWriter` writes a new vault: ``metadata.json`` first (as Flashbax does), then steps
appended in chunk-aligned commits (every leaf, then marlbuf's private arrays, then
``vault_index``), so a vault being written reads consistently at any time.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: The vault format this module writes, and the major version it reads.
WRITE_VERSION = 1.2
READ_MAJOR = 1
METADATA = "metadata.json"
INDEX = "vault_index"
#: marlbuf's count of the rows of each private array (not a leaf: Flashbax never reads it).
PRIVATE_ROOT = "marlbuf"
PRIVATE_ROWS = PRIVATE_ROOT + ".rows."
#: Length of every leaf's time axis in its zarr metadata, as Flashbax creates it.
TIME_AXIS = 10**13
#: Flashbax's default compressor.
GZIP5 = {"id": "gzip", "level": 5}
#: Compressors TensorStore's zarr driver decodes.
COMPRESSORS = ("gzip", "zlib", "blosc", "zstd", "bz2")
#: Bytes of one chunk of a private array (rows are appended a few at a time, and each append
#: rewrites the chunk it ends in: measured, 4 MiB chunks made writing a vault 1.6x slower).
PRIVATE_CHUNK_BYTES = 256 * 1024
#: Bytes of one chunk, in memory, that a written vault aims at (TensorStore's choice for
#: Flashbax's vaults is about 4 MiB too).
TARGET_CHUNK_BYTES = 4 * 1024**2

#: Limits that keep a crafted vault from making the reader allocate without bound.
MAX_METADATA_BYTES = 16 * 1024**2
MAX_ZARRAY_BYTES = 1024**2
MAX_CHUNK_BYTES = 512 * 1024**2
MAX_LEAVES = 256
MAX_DEPTH = 8
MAX_FILES = 1_000_000
#: A key of the structure: printable, no dot (dots join keys into store paths), no slash.
_KEY = re.compile(r"[A-Za-z0-9_\-+:@ ]{1,128}")
_SHAPE = re.compile(r"\(\s*(\d+\s*(,\s*\d+\s*)*,?)?\s*\)")


class VaultError(ValueError):
    """A folder that is not a readable vault: damaged, truncated, of another major version,
    inconsistent, crafted, or holding what the reader cannot place. The message says what
    was found and where."""


def tensorstore() -> Any:
    """The ``tensorstore`` module, or an ``ImportError`` naming the extra to install."""
    try:
        import tensorstore as ts
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "reading and writing Flashbax vaults needs TensorStore: pip install 'marlbuf[vault]'"
        ) from exc
    return ts


def store_name(key: str) -> str:
    """The store path of leaf ``key`` (``"infos.legals"`` -> ``"infos.legals."``), as Flashbax
    names its datastores: every key of the path followed by a dot."""
    return key + "."


def shape_text(shape: Sequence[int]) -> str:
    """``shape`` written as ``metadata.json`` holds it: the text of a Python tuple."""
    return str(tuple(int(d) for d in shape))


def _file_spec(folder: Path) -> dict[str, Any]:
    return {"driver": "file", "path": str(folder) + os.sep}


def _kvstore_spec(folder: Path) -> dict[str, Any]:
    return {"driver": "ocdbt", "base": _file_spec(folder)}


@dataclass(frozen=True)
class Leaf:
    """One leaf of a vault's experience.

    Attributes
    ----------
    key : str
        Its key path joined by dots (``"infos.legals"``).
    step_shape : tuple of int
        Shape of one step of one stream (``E``; the array is ``(B, T, *E)``).
    dtype : numpy dtype
    chunk_steps : int
        Steps per chunk along the time axis.
    chunks : tuple of int
        The zarr chunk shape.
    separator : str
        The zarr chunk-key separator (``"."`` or ``"/"``).
    """

    key: str
    step_shape: tuple[int, ...]
    dtype: np.dtype
    chunk_steps: int
    chunks: tuple[int, ...]
    separator: str

    @property
    def step_bytes(self) -> int:
        """Bytes of one step of one stream."""
        return math.prod(self.step_shape) * self.dtype.itemsize


@dataclass(frozen=True)
class VaultInfo:
    """What :func:`vault_info` found in a vault (everything checked).

    Attributes
    ----------
    path : Path
        The vault's folder (``<base>/<name>/<uid>``).
    version : float
        Its format version (1.x).
    steps : int
        Valid time steps (``vault_index``) of each stream.
    streams : int
        ``B``, streams stored side by side.
    leaves : dict of str to Leaf
        By key, in the structure's order.
    metadata : dict
        The user keys of ``metadata.json`` (everything but version and structure).
    """

    path: Path
    version: float
    steps: int
    streams: int
    leaves: dict[str, Leaf]
    metadata: dict[str, Any]

    @property
    def nbytes(self) -> int:
        """Bytes of the valid data, uncompressed (every leaf, every stream)."""
        return self.streams * self.steps * sum(leaf.step_bytes for leaf in self.leaves.values())

    @property
    def step_bytes(self) -> int:
        """Bytes of one time step of every stream, uncompressed."""
        return self.streams * sum(leaf.step_bytes for leaf in self.leaves.values())


# ------------------------------------------------------------------------------ reading
def _check_folder(folder: Path) -> None:
    """Refuse anything in ``folder`` but regular files and folders (symbolic links, devices,
    sockets, pipes), so nothing outside it is opened and no file is read past its size."""
    if folder.is_symlink() or not folder.is_dir():
        what = "a symbolic link" if folder.is_symlink() else "not a folder"
        raise VaultError(f"the vault path {str(folder)!r} is {what}; pass a vault's folder")
    count = 0
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            count += 1
            if count > MAX_FILES:
                raise VaultError(f"{str(folder)!r} holds more than {MAX_FILES:,} files")
            mode = os.lstat(os.path.join(root, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                raise VaultError(
                    f"{os.path.join(root, name)!r} is {kind}; a vault holds regular files only "
                    "(crafted or damaged vault)"
                )


def _read_metadata(folder: Path) -> dict[str, Any]:
    path = folder / METADATA
    if not path.is_file():
        inside = sorted(p.name for p in folder.iterdir() if (p / METADATA).is_file())
        hint = (
            f"; it holds the vaults {', '.join(inside[:8])}: pass one of them "
            f"(e.g. {str(folder / inside[0])!r})"
            if inside
            else ""
        )
        raise VaultError(f"{str(folder)!r} holds no {METADATA}, so it is no vault{hint}")
    with open(path, "rb") as fh:
        raw = fh.read(MAX_METADATA_BYTES + 1)
    if len(raw) > MAX_METADATA_BYTES:
        raise VaultError(f"{str(path)!r} is larger than {MAX_METADATA_BYTES:,} bytes")
    try:
        metadata = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise VaultError(f"{str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(metadata, dict):
        raise VaultError(f"{str(path)!r} holds no JSON object")
    version = metadata.get("version")
    if isinstance(version, bool) or not isinstance(version, (int, float)):
        raise VaultError(f"{str(path)!r} has no numeric 'version'; got {version!r}")
    if int(version // 1) != READ_MAJOR:
        raise VaultError(
            f"{str(path)!r} is a vault of format version {version}; this marlbuf reads "
            f"version {READ_MAJOR}.x (Flashbax's vaults since flashbax 0.1.0)"
        )
    return metadata


def _flatten(
    tree: Any, what: str, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """The leaves of a nested dict of ``metadata.json`` as (key path, value), checked."""
    if not isinstance(tree, dict):
        yield prefix, tree
        return
    if len(prefix) >= MAX_DEPTH:
        raise VaultError(f"{what} nests deeper than {MAX_DEPTH} levels")
    for key, value in tree.items():
        if not _KEY.fullmatch(key):
            raise VaultError(
                f"{what} has the key {key!r}: keys are 1 to 128 letters, digits, spaces or "
                "_-+:@ (no dots or slashes)"
            )
        yield from _flatten(value, what, (*prefix, key))


def _structure(metadata: Mapping[str, Any], path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Key -> (structure shape, dtype name) of every leaf, from ``structure_shape`` and
    ``structure_dtype``."""
    where = str(path / METADATA)
    shapes, dtypes = metadata.get("structure_shape"), metadata.get("structure_dtype")
    if not isinstance(shapes, dict) or not isinstance(dtypes, dict):
        raise VaultError(f"{where!r} lacks 'structure_shape' or 'structure_dtype'")
    by_shape = {".".join(k): v for k, v in _flatten(shapes, f"{where} structure_shape")}
    by_dtype = {".".join(k): v for k, v in _flatten(dtypes, f"{where} structure_dtype")}
    if set(by_shape) != set(by_dtype):
        raise VaultError(
            f"{where!r}: structure_shape and structure_dtype name different leaves "
            f"({sorted(set(by_shape) ^ set(by_dtype))})"
        )
    if not by_shape or len(by_shape) > MAX_LEAVES:
        raise VaultError(f"{where!r} names {len(by_shape)} leaves (1 to {MAX_LEAVES} expected)")
    out = {}
    for key, text in by_shape.items():
        if not isinstance(text, str) or len(text) > 256 or not _SHAPE.fullmatch(text):
            raise VaultError(f"{where!r}: the shape of leaf {key!r} is not a tuple: {text!r}")
        shape = tuple(int(d) for d in re.findall(r"\d+", text))
        if len(shape) < 2:
            raise VaultError(
                f"{where!r}: leaf {key!r} has shape {shape}; leaves are (B, T, ...) arrays"
            )
        dtype = by_dtype[key]
        if not isinstance(dtype, str):
            raise VaultError(f"{where!r}: the dtype of leaf {key!r} is not a name: {dtype!r}")
        out[key] = (shape, dtype)
    return out


def _dtype(name: str, where: str) -> np.dtype:
    try:
        dtype = np.dtype(name)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biuf" or dtype.itemsize > 8:
        raise VaultError(
            f"{where} has dtype {name!r}; marlbuf stores bool, integer and float data of at "
            "most 8 bytes (leave the leaf out with keys={KEY: None}, or convert it)"
        )
    return dtype


def _zarray(kv: Any, name: str, path: Path) -> dict[str, Any]:
    key = f"{name}/.zarray"
    try:  # a value larger than the bound is refused unread
        kv.read(key, byte_range=slice(MAX_ZARRAY_BYTES, MAX_ZARRAY_BYTES + 1)).result()
        too_large = True
    except ValueError:  # out of range: the value is smaller (or missing)
        too_large = False
    result = None if too_large else kv.read(key).result()
    if result is not None and result.state != "value":
        raise VaultError(
            f"vault {str(path)!r}: leaf {name!r} has no array in the store (truncated or "
            "damaged vault)"
        )
    if result is None:
        raise VaultError(f"vault {str(path)!r}: the zarr metadata of {name!r} is too large")
    try:
        meta = json.loads(bytes(result.value).decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise VaultError(f"vault {str(path)!r}: the zarr metadata of {name!r}: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("zarr_format") != 2:
        raise VaultError(f"vault {str(path)!r}: {name!r} is not a zarr (version 2) array")
    return meta


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value
    ):
        raise VaultError(f"{what} must be a list of positive ints; got {value!r}")
    return tuple(value)


def _check_leaf(
    meta: Mapping[str, Any], key: str, structure: tuple[tuple[int, ...], str], path: Path
) -> Leaf:
    where = f"vault {str(path)!r}, leaf {key!r}"
    shape = _ints(meta.get("shape"), f"{where}: zarr 'shape'")
    chunks = _ints(meta.get("chunks"), f"{where}: zarr 'chunks'")
    if len(chunks) != len(shape) or len(shape) < 2:
        raise VaultError(f"{where}: zarr shape {list(shape)} and chunks {list(chunks)} differ")
    dtype = _dtype(str(meta.get("dtype")), where)
    declared = _dtype(structure[1], f"{where} (structure_dtype)")
    if dtype != declared:
        raise VaultError(f"{where}: stored as {dtype}, but metadata.json says {declared}")
    if shape[0] != structure[0][0] or shape[2:] != structure[0][2:]:
        raise VaultError(
            f"{where}: stored with shape {shape}, but metadata.json says {structure[0]} "
            "(all but the time axis must agree)"
        )
    if math.prod(chunks) * dtype.itemsize > MAX_CHUNK_BYTES:
        raise VaultError(
            f"{where}: chunks of {list(chunks)} {dtype} exceed {MAX_CHUNK_BYTES:,} bytes"
        )
    compressor = meta.get("compressor")
    if compressor is not None and (
        not isinstance(compressor, dict) or compressor.get("id") not in COMPRESSORS
    ):
        raise VaultError(f"{where}: unsupported compressor {compressor!r}")
    if meta.get("filters") not in (None, []):
        raise VaultError(f"{where}: zarr filters are not supported; got {meta.get('filters')!r}")
    if meta.get("order", "C") not in ("C", "F"):
        raise VaultError(f"{where}: zarr order must be 'C' or 'F'; got {meta.get('order')!r}")
    separator = meta.get("dimension_separator", ".")
    if separator not in (".", "/"):
        raise VaultError(f"{where}: unknown dimension_separator {separator!r}")
    return Leaf(key, shape[2:], dtype, chunks[1], chunks, separator)


def _check_chunks(keys: Sequence[bytes], leaf: Leaf, streams: int, steps: int, path: Path) -> None:
    """Every chunk holding a step below ``steps`` must be in the store."""
    grid = [-(-streams // leaf.chunks[0]), -(-steps // leaf.chunk_steps)]
    grid += [-(-e // c) for e, c in zip(leaf.step_shape, leaf.chunks[2:])]
    expected = math.prod(grid)
    if expected == 0:
        return
    prefix = store_name(leaf.key).encode() + b"/"
    found = 0
    for key in keys:
        if not key.startswith(prefix):
            continue
        parts = key[len(prefix) :].split(leaf.separator.encode())
        if len(parts) != len(grid) or not all(p.isdigit() for p in parts):
            continue
        index = [int(p) for p in parts]
        found += all(i < g for i, g in zip(index, grid))
    if found < expected:
        raise VaultError(
            f"vault {str(path)!r}: leaf {leaf.key!r} holds {found} of the {expected} chunks its "
            f"{steps} valid steps (vault_index) need: the vault is truncated or its index is "
            "past the data"
        )


def vault_info(path: str | os.PathLike[str]) -> VaultInfo:
    """Open the vault at ``path`` (the ``<uid>`` folder holding ``metadata.json``) read-only,
    and check it as a whole (see the module's docstring).

    Raises
    ------
    VaultError
        For anything that is not a readable vault of format 1.x, with what was found.
    FileNotFoundError
        When ``path`` does not exist.
    """
    ts = tensorstore()
    folder = Path(path)
    if not folder.exists() and not folder.is_symlink():
        raise FileNotFoundError(f"no vault at {str(folder)!r}")
    folder = folder.absolute()
    _check_folder(folder)
    metadata = _read_metadata(folder)
    structure = _structure(metadata, folder)
    try:
        kv = ts.KvStore.open(_kvstore_spec(folder)).result()
        keys = kv.list().result()
        index_meta = _zarray(kv, INDEX, folder)
    except ValueError as exc:
        if isinstance(exc, VaultError):
            raise
        raise VaultError(f"vault {str(folder)!r}: its key-value store: {exc}") from exc
    if index_meta.get("shape") != [1] or _dtype(str(index_meta.get("dtype")), INDEX).kind != "i":
        raise VaultError(f"vault {str(folder)!r}: {INDEX} is not one integer")
    try:
        steps = int(_open(folder, INDEX).read().result()[0])
    except ValueError as exc:
        raise VaultError(f"vault {str(folder)!r}: {INDEX} cannot be read: {exc}") from exc
    if steps < 0:
        raise VaultError(f"vault {str(folder)!r}: {INDEX} is negative ({steps})")
    leaves: dict[str, Leaf] = {}
    streams = None
    for key, declared in structure.items():
        meta = _zarray(kv, store_name(key), folder)
        leaf = _check_leaf(meta, key, declared, folder)
        if int(meta["shape"][1]) < steps:
            raise VaultError(
                f"vault {str(folder)!r}: {INDEX} is {steps} but leaf {key!r} has room for "
                f"{meta['shape'][1]} steps"
            )
        b = int(meta["shape"][0])
        if streams is not None and b != streams:
            raise VaultError(
                f"vault {str(folder)!r}: leaf {key!r} holds {b} streams, others {streams}"
            )
        streams = b
        _check_chunks(keys, leaf, b, steps, folder)
        leaves[key] = leaf
    assert streams is not None
    user = {
        k: v
        for k, v in metadata.items()
        if k not in ("version", "structure_shape", "structure_dtype")
    }
    return VaultInfo(folder, float(metadata["version"]), steps, streams, leaves, user)


def _open(folder: Path, name: str, context: Any = None) -> Any:
    """An existing zarr array of the store, read-only; missing chunks are errors."""
    ts = tensorstore()
    spec = {
        "driver": "zarr",
        "kvstore": {**_kvstore_spec(folder), "path": name},
        "fill_missing_data_reads": False,
    }
    kwargs = {} if context is None else {"context": context}
    return ts.open(spec, read=True, write=False, open=True, **kwargs).result()


class VaultReader:
    """Ranges of steps of a checked vault (:func:`vault_info`), every leaf at once.

    Parameters
    ----------
    info : VaultInfo
    keys : sequence of str, optional
        The leaves to read (default: all).
    cache_bytes : int
        TensorStore's chunk cache: a chunk that two consecutive reads share is decoded once.
    private : sequence of str
        Names of further arrays of the store to open (marlbuf's private arrays).
    """

    def __init__(
        self,
        info: VaultInfo,
        keys: Sequence[str] | None = None,
        cache_bytes: int = 0,
        private: Sequence[str] = (),
    ) -> None:
        ts = tensorstore()
        self.info = info
        self.keys = list(info.leaves) if keys is None else list(keys)
        self.context = ts.Context({"cache_pool": {"total_bytes_limit": int(cache_bytes)}})
        try:
            self.arrays = {k: _open(info.path, store_name(k), self.context) for k in self.keys}
            self.private = {n: _open(info.path, n, self.context) for n in private}
        except ValueError as exc:
            raise VaultError(f"vault {str(info.path)!r} cannot be opened: {exc}") from exc

    def start(self, t0: int, t1: int, one_more: Sequence[str] = ()) -> dict[str, Any]:
        """Start reading steps ``[t0, t1)`` of every stream of every leaf (and the step after
        them, where there is one, of the leaves in ``one_more``); :meth:`finish` waits for
        them. TensorStore reads and decodes in its own threads meanwhile."""
        more = min(self.info.steps, t1 + 1)
        return {k: a[:, t0 : more if k in one_more else t1].read() for k, a in self.arrays.items()}

    def finish(self, futures: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The arrays of :meth:`start`: key -> ``(B, t1 - t0, *E)``."""
        out = {}
        for key, future in futures.items():
            try:
                out[key] = future.result()
            except ValueError as exc:  # a chunk that does not decode, or that is missing
                raise VaultError(
                    f"vault {str(self.info.path)!r}: leaf {key!r} cannot be read (damaged "
                    f"vault): {exc}"
                ) from exc
        return out

    def read(self, t0: int, t1: int) -> dict[str, np.ndarray]:
        """Steps ``[t0, t1)`` of every stream of every leaf: key -> ``(B, t1 - t0, *E)``."""
        return self.finish(self.start(t0, t1))

    def read_private(self, name: str, index: Any) -> np.ndarray:
        """Elements of the private array ``name`` (``index`` as for NumPy)."""
        try:
            return np.asarray(self.private[name][index].read().result())
        except ValueError as exc:
            raise VaultError(
                f"vault {str(self.info.path)!r}: {name!r} cannot be read (damaged vault): {exc}"
            ) from exc


def read_private_meta(info: VaultInfo, name: str) -> dict[str, Any]:
    """The zarr metadata of one of marlbuf's private arrays in the vault's store, checked
    like a leaf's."""
    ts = tensorstore()
    kv = ts.KvStore.open(_kvstore_spec(info.path)).result()
    meta = _zarray(kv, name, info.path)
    _ints(meta.get("shape"), f"vault {str(info.path)!r}: {name!r} shape")
    chunks = _ints(meta.get("chunks"), f"vault {str(info.path)!r}: {name!r} chunks")
    dtype = _dtype(str(meta.get("dtype")), f"vault {str(info.path)!r}: {name!r}")
    if math.prod(chunks) * dtype.itemsize > MAX_CHUNK_BYTES:
        raise VaultError(f"vault {str(info.path)!r}: {name!r} has chunks that are too large")
    return meta


# ------------------------------------------------------------------------------ writing
@dataclass(frozen=True)
class LeafSpec:
    """A leaf to write: its per-step shape ``E`` (the array is ``(B, T, *E)``) and dtype."""

    step_shape: tuple[int, ...]
    dtype: np.dtype


def _chunk_steps(streams: int, leaves: Mapping[str, LeafSpec], target: int) -> int:
    """Steps per chunk, the same for every leaf: the widest leaf's chunk holds about
    ``target`` bytes."""
    widest = max(streams * math.prod(s.step_shape) * s.dtype.itemsize for s in leaves.values())
    return max(1, target // max(1, widest))


class VaultWriter:
    """Write a new vault (format 1.2), a range of steps at a time.

    ``metadata.json`` is written when the writer is made (as Flashbax does); each
    :meth:`append` starts writing its steps to every leaf and its rows of the private arrays
    (TensorStore compresses them in its own threads) and returns; the next append,
    :meth:`flush` or :meth:`close` waits for them and commits them: the private arrays' row
    counts (:data:`PRIVATE_ROWS`), then ``vault_index``. A reader therefore always sees a
    consistent prefix, even of a vault still being written. Appends of whole chunks
    (:attr:`chunk_steps`) write each chunk once; a shorter append rewrites the chunk it ends in
    at the next append.

    Parameters
    ----------
    path : str or path-like
        The vault's folder (``<base>/<name>/<uid>``); must not exist. Missing parents are
        created.
    leaves : mapping of str to LeafSpec
        By key (dots join nested keys: ``"infos.legals"``), in structure order.
    streams : int
        ``B``: streams written side by side (each :meth:`append` gives every stream the same
        number of steps).
    metadata : mapping, optional
        User keys of ``metadata.json`` (JSON-safe).
    compression : mapping, optional
        The zarr compressor (default gzip level 5, Flashbax's).
    private : mapping of str to LeafSpec, optional
        Arrays of the store that are not leaves (readers of the Flashbax format never see
        them): store path -> the shape and dtype of one row; :meth:`append` appends rows.
    chunk_bytes : int
        About how many bytes one chunk of the widest leaf holds.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        leaves: Mapping[str, LeafSpec],
        streams: int = 1,
        metadata: Mapping[str, Any] | None = None,
        compression: Mapping[str, Any] | None = None,
        private: Mapping[str, LeafSpec] | None = None,
        chunk_bytes: int = TARGET_CHUNK_BYTES,
    ) -> None:
        ts = tensorstore()
        folder = Path(path).absolute()
        if folder.exists() or folder.is_symlink():
            raise FileExistsError(
                f"{str(folder)!r} already exists; a vault is written into a new folder"
            )
        if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
            raise ValueError(f"streams must be a positive int; got streams={streams!r}")
        if not leaves:
            raise ValueError("leaves must name at least one leaf")
        for key in leaves:
            if not all(_KEY.fullmatch(part) for part in key.split(".")):
                raise ValueError(f"leaf keys are dotted paths of plain names; got {key!r}")
            if key.split(".")[0] == PRIVATE_ROOT:
                raise ValueError(f"leaf keys may not begin with {PRIVATE_ROOT!r}; got {key!r}")
        reserved = {"version", "structure_shape", "structure_dtype"} & set(metadata or {})
        if reserved:
            raise ValueError(f"metadata may not set {sorted(reserved)} (the format's keys)")
        self._ts = ts
        self.path = folder
        self.streams = streams
        self.leaves = {
            k: LeafSpec(tuple(s.step_shape), np.dtype(s.dtype)) for k, s in leaves.items()
        }
        #: steps per chunk of every leaf (appends of multiples of it write each chunk once)
        self.chunk_steps = _chunk_steps(streams, self.leaves, chunk_bytes)
        self.compression = dict(GZIP5 if compression is None else compression)
        shapes: dict[str, Any] = {}
        dtypes: dict[str, Any] = {}
        for key, spec in self.leaves.items():
            *parents, last = key.split(".")
            node_s, node_d = shapes, dtypes
            for part in parents:
                node_s, node_d = node_s.setdefault(part, {}), node_d.setdefault(part, {})
            node_s[last] = shape_text((streams, self.chunk_steps, *spec.step_shape))
            node_d[last] = spec.dtype.name
        document = json.dumps(
            {
                "version": WRITE_VERSION,
                "structure_shape": shapes,
                "structure_dtype": dtypes,
                **dict(metadata or {}),
            }
        )
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir()
        tmp = folder / (METADATA + ".tmp")
        tmp.write_text(document)
        os.replace(tmp, folder / METADATA)
        self.arrays = {
            key: self._create(
                store_name(key),
                (streams, TIME_AXIS, *s.step_shape),
                s.dtype,
                (streams, self.chunk_steps, *s.step_shape),
            )
            for key, s in self.leaves.items()
        }
        self.private_specs = {
            n: LeafSpec(tuple(s.step_shape), np.dtype(s.dtype)) for n, s in (private or {}).items()
        }
        self.private = {}
        for name, spec in self.private_specs.items():
            # small chunks: appends add a few rows each, and rewrite the chunk they end in
            row = max(1, math.prod(spec.step_shape) * spec.dtype.itemsize)
            rows = max(1, min(chunk_bytes, PRIVATE_CHUNK_BYTES) // row)
            self.private[name] = self._create(
                name, (TIME_AXIS, *spec.step_shape), spec.dtype, (rows, *spec.step_shape)
            )
        #: rows written to each private array, in declaration order
        self.private_rows = np.zeros(len(self.private), np.int64)
        if self.private:
            self.rows = self._create(
                PRIVATE_ROWS, (len(self.private),), np.dtype(np.int64), (len(self.private),)
            )
            self.rows.write(self.private_rows).result()
        self.index = self._create(INDEX, (1,), np.dtype(np.int32), (1,), compressor=False)
        self.index.write(np.zeros(1, np.int32)).result()
        #: steps committed (the vault's ``vault_index``)
        self.steps = 0
        #: the last append's writes in flight: (futures, private row counts, steps, arrays)
        self._pending: tuple[list[Any], np.ndarray, int, Any] | None = None

    def _create(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: Any,
        chunks: tuple[int, ...],
        compressor: bool = True,
    ) -> Any:
        metadata: dict[str, Any] = {"chunks": list(chunks)}
        if compressor:
            metadata["compressor"] = self.compression
        spec = {
            "driver": "zarr",
            "kvstore": {**_kvstore_spec(self.path), "path": name},
            "metadata": metadata,
        }
        return self._ts.open(spec, shape=shape, dtype=np.dtype(dtype).name, create=True).result()

    def append(self, steps: Mapping[str, Any], private: Mapping[str, Any] | None = None) -> None:
        """Write steps of every stream, then commit them.

        Parameters
        ----------
        steps : mapping of str to array
            For every leaf, shape ``(B, n, *E)`` (the same ``n`` for all), cast to the leaf's
            dtype with NumPy's ``same_kind`` rule.
        private : mapping of str to array, optional
            Rows ``(k, *shape)`` to append to private arrays.
        """
        if set(steps) != set(self.leaves):
            raise ValueError(f"append needs every leaf {sorted(self.leaves)}; got {sorted(steps)}")
        n = None
        checked = {}
        for key, value in steps.items():
            spec = self.leaves[key]
            arr = np.asarray(value)
            if (
                arr.ndim != 2 + len(spec.step_shape)
                or arr.shape[0] != self.streams
                or arr.shape[2:] != spec.step_shape
            ):
                expected = ", ".join(map(str, (self.streams, "n", *spec.step_shape)))
                raise ValueError(f"steps[{key!r}] must have shape ({expected}); got {arr.shape}")
            if n is not None and arr.shape[1] != n:
                raise ValueError(
                    f"every leaf needs the same number of steps; got {n} and {arr.shape[1]}"
                )
            n = arr.shape[1]
            if not np.can_cast(arr.dtype, spec.dtype, "same_kind"):
                raise TypeError(
                    f"steps[{key!r}] of dtype {arr.dtype} cannot be stored as {spec.dtype}"
                )
            checked[key] = np.ascontiguousarray(arr, dtype=spec.dtype)
        extra = {}
        for name, rows in (private or {}).items():
            if name not in self.private:
                raise ValueError(f"no private array {name!r}; declared: {sorted(self.private)}")
            spec = self.private_specs[name]
            arr = np.ascontiguousarray(rows, dtype=spec.dtype)
            if arr.ndim != 1 + len(spec.step_shape) or arr.shape[1:] != spec.step_shape:
                raise ValueError(
                    f"private[{name!r}] rows must have shape (k, "
                    f"{', '.join(map(str, spec.step_shape))}); got {arr.shape}"
                )
            extra[name] = arr
        n = int(n or 0)
        self.flush()  # the previous append's commit: its writes are done, its index written
        start = self.steps
        if start + n > np.iinfo(np.int32).max:
            raise ValueError(
                f"a vault holds at most {np.iinfo(np.int32).max:,} steps per stream "
                "(its index is an int32)"
            )
        futures = [self.arrays[k][:, start : start + n].write(a) for k, a in checked.items() if n]
        counts = self.private_rows.copy()
        for position, name in enumerate(self.private):
            if name in extra and len(extra[name]):
                first = int(counts[position])
                rows = extra[name]
                futures.append(self.private[name][first : first + len(rows)].write(rows))
                counts[position] += len(rows)
        # committed by the next append, flush() or close(): TensorStore compresses and writes
        # these steps in its own threads while the caller prepares the next ones
        self._pending = (futures, counts, start + n, (checked, extra))

    def flush(self) -> None:
        """Wait for the last :meth:`append`'s writes, then commit them: the counts of private
        rows, then ``vault_index`` (a reader ignores whatever lies past it)."""
        if self._pending is None:
            return
        futures, counts, steps, _ = self._pending
        self._pending = None
        for future in futures:
            future.result()
        if self.private:
            self.rows.write(counts).result()
        self.private_rows = counts
        self.steps = steps
        self.index.write(np.array([steps], np.int32)).result()

    def close(self) -> None:
        """:meth:`flush`: every appended step is committed. The writer may still append."""
        self.flush()

    def __enter__(self) -> VaultWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
