"""Reads the torchrun environment convention; the only launch contract the trainer knows.

Torchrun and the DDPJob operator both set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT. With none of them set the trainer runs alone, without a process group. A process that torchrun's
agent or the trainer's own supervisor restarted in place also has TORCHELASTIC_RESTART_COUNT. Under the DDPJob
operator, DDPJOB_RANK_ADDR and DDPJOB_POD_IPS say how to tell that this process is still its rank (``fence``).
Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ddp_trainer.errors import ConfigError
from ddpjob_contract.pods import (
    ENV_LOCAL_RANK,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_POD_IPS,
    ENV_RANK,
    ENV_RANK_ADDR,
    ENV_RESTART_COUNT,
    ENV_RESTART_REASON,
    ENV_WORLD_SIZE,
)


@dataclass(frozen=True, kw_only=True)
class Launch:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = ""
    master_port: int = 0
    restart_count: int = 0
    """In-place restarts of the gang's processes before this one (TORCHELASTIC_RESTART_COUNT)."""
    restart_reason: str = ""
    """Why the last of them happened, when the trainer's own supervisor made it (RESTART_REASON)."""
    under_agent: bool = False
    """Started by a launcher that restarts it in place (torchrun's agent, the trainer's supervisor): it must not
    supervise itself."""
    rank_addr: str = ""
    """The name its peers know this rank by (DDPJOB_RANK_ADDR, from the DDPJob operator; ``fence``)."""
    pod_ips: str = ""
    """This pod's addresses, comma-separated (DDPJOB_POD_IPS, from the DDPJob operator; ``fence``)."""

    @property
    def distributed(self) -> bool:
        """Whether a process group is needed: set by a launcher, even for a world of one."""
        return bool(self.master_addr)


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = environ.get(name)
    if text is None or text == "":
        if default is None:
            raise ConfigError(f"WORLD_SIZE is set but {name} is not; the launcher must set {name} too")
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not an integer; fix the launcher's environment") from None


def read_launch(environ: Mapping[str, str]) -> Launch:
    """Parse the launcher's variables, or return a single-process Launch when WORLD_SIZE is unset."""
    restarts = _int(environ, ENV_RESTART_COUNT, 0)
    if restarts < 0:
        raise ConfigError(f"{ENV_RESTART_COUNT}={restarts} must be at least 0")
    alone = Launch(
        restart_count=restarts,
        restart_reason=environ.get(ENV_RESTART_REASON, ""),
        under_agent=bool(environ.get(ENV_RESTART_COUNT)),
        rank_addr=environ.get(ENV_RANK_ADDR, ""),
        pod_ips=environ.get(ENV_POD_IPS, ""),
    )
    if not environ.get(ENV_WORLD_SIZE):
        return alone
    world_size = _int(environ, ENV_WORLD_SIZE)
    if world_size < 1:
        raise ConfigError(f"WORLD_SIZE={world_size} must be at least 1")
    if not environ.get(ENV_MASTER_ADDR):
        raise ConfigError(
            "WORLD_SIZE is set but MASTER_ADDR is not; set MASTER_ADDR and MASTER_PORT to rank 0's "
            "address, or unset WORLD_SIZE to train in a single process"
        )
    rank = _int(environ, ENV_RANK)
    if not 0 <= rank < world_size:
        raise ConfigError(f"RANK={rank} is outside 0..{world_size - 1} (WORLD_SIZE={world_size})")
    port = _int(environ, ENV_MASTER_PORT)
    if not 0 < port < 65536:
        raise ConfigError(f"MASTER_PORT={port} is not a TCP port (1-65535)")
    return replace(
        alone,
        rank=rank,
        world_size=world_size,
        local_rank=_int(environ, ENV_LOCAL_RANK, 0),
        master_addr=environ[ENV_MASTER_ADDR],
        master_port=port,
    )
