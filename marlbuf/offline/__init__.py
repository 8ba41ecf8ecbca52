"""Offline MARL data: Flashbax vaults in and out, and recorded PettingZoo runs.

* :func:`read_vault` loads a vault (OG-MARL's datasets; extra ``[vault]``: TensorStore, no JAX)
  into a :class:`~marlbuf.MultiAgentReplayBuffer`, a chunk at a time, into memory or into a
  memory-mapped buffer for data larger than RAM (``path=``; an interrupted conversion
  resumes). :func:`write_vault` writes a buffer as a vault that Flashbax reads and that reads
  back exactly. :func:`vault_info` checks a vault and tells what it holds.
* :func:`record` runs a policy in a PettingZoo parallel environment (or several, as separate
  streams) and writes the steps into a buffer or straight into a vault (``marlbuf record``).

See ``docs/offline.md``. TensorStore is imported only when a vault is opened.
"""

from marlbuf.offline.plan import DEFAULT_KEYS
from marlbuf.offline.read import read_vault
from marlbuf.offline.record import record
from marlbuf.offline.vault import VaultError, VaultInfo, VaultWriter, vault_info
from marlbuf.offline.write import write_vault

__all__ = [
    "DEFAULT_KEYS",
    "VaultError",
    "VaultInfo",
    "VaultWriter",
    "read_vault",
    "record",
    "vault_info",
    "write_vault",
]
