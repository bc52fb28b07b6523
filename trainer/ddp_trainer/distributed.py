"""Process group, device and model wrapping: the same code path on GPUs and on CPU.

The backend follows the device: NCCL when CUDA is available, gloo otherwise. LOCAL_RANK picks
the GPU. Launched alone (no WORLD_SIZE), there is no process group. With one rank, alone or under a
launcher, the model is not wrapped in DDP either: there is nothing to reduce, and the wrapper costs
2.5% of an H200's throughput (docs/benchmarks-history.md).
"""

from __future__ import annotations

import datetime
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

# Imported here, before any process group exists, on purpose. DDP imports torch.distributed.nn on first
# use, and its functions take `group=group.WORLD` as a default argument. Imported after
# init_process_group, those eleven defaults hold the default group for the life of the interpreter:
# destroy_process_group() cannot free it, and gloo's threads (NCCL's watchdog on GPUs) are still running
# when the interpreter finalizes, which now and then ends a finished rank with SIGABRT ("terminate called
# without an active exception"). tests/trainer/test_shutdown.py holds both halves of this.
import torch.distributed.nn
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer.config import DistConfig
from ddp_trainer.errors import ConfigError, RetryableError
from ddp_trainer.fence import Fence, Unfenced, for_rank
from ddp_trainer.launch import Launch

# Fragments of the messages gloo raises as plain RuntimeErrors when a peer disappears ("Read error
# ... Connection reset by peer") or a collective times out ("Timed out waiting 3000ms for recv").
# The store and NCCL raise DistError subclasses, which are caught by type.
_RETRYABLE_MESSAGES = (
    "connection closed by peer",
    "connection reset by peer",
    "connection refused",
    "broken pipe",
    "timed out",
    "socket timeout",
    "nccl",
)


class Pending(Protocol):
    """A collective's answer, read once it is needed."""

    def result(self) -> list[int]: ...


@dataclass(frozen=True)
class _Ready:
    values: list[int]

    def result(self) -> list[int]:
        return self.values


@dataclass(frozen=True)
class _InFlight:
    work: Any
    tensor: torch.Tensor

    def result(self) -> list[int]:
        self.work.wait()
        return [int(v) for v in self.tensor.tolist()]


@dataclass
class Dist:
    launch: Launch
    device: torch.device
    backend: str
    """nccl, gloo, or none when running alone."""
    fence: Fence
    """Whether this process is still its rank (checked before rank 0 writes a checkpoint)."""
    host_group: Any = None
    """A gloo group for small votes on the CPU (``max_async``): the default group where that is gloo already; with
    NCCL, a gloo group of its own, so a vote never waits on the GPU's stream."""

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def is_main(self) -> bool:
        return self.launch.rank == 0

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index or 0])
        elif self.backend == "gloo":
            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, indexed by rank (picklable objects only)."""
        if self.backend == "none":
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def max_async(self, values: list[int]) -> Pending:
        """The element-wise maximum of ``values`` over every rank, started now and read later: one small all-reduce
        through gloo on the CPU (no host-device sync), which runs while this rank goes on with its next step."""
        if self.backend == "none" or self.world_size == 1:
            return _Ready(list(values))
        tensor = torch.tensor(values, dtype=torch.int64)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.host_group, async_op=True)
        return _InFlight(work, tensor)

    def finish(self) -> None:
        """Leave the group together: nobody tears gloo or NCCL down while a peer is still in a collective.

        Every rank meets at a last barrier first. A rank that passes it knows every peer finished
        training too; a peer lost before it raises here, so the run is not reported done.
        """
        if self.backend != "none":
            self.barrier()
        self.close()

    def close(self) -> None:
        """Destroy the process group (alone, on the error path: the peers may be gone).

        Its backend (and gloo's threads) goes with it, while the interpreter is alive: nothing else holds
        the group once the DDP wrapper is gone (see the torch.distributed.nn import above).
        """
        if dist.is_initialized():
            dist.destroy_process_group()


def pick_device(launch: Launch) -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if launch.local_rank >= count:
        raise ConfigError(
            f"LOCAL_RANK={launch.local_rank} but this machine has {count} GPU(s); start at most one process per GPU"
        )
    torch.cuda.set_device(launch.local_rank)
    return torch.device("cuda", launch.local_rank)


def setup(launch: Launch, cfg: DistConfig) -> Dist:
    """Pick the device and, when launched distributed, join the process group (blocks for peers)."""
    if cfg.strategy == "dp" and launch.world_size > 1:
        raise ConfigError(
            f"--strategy dp (TRAIN_STRATEGY) runs a single process but WORLD_SIZE={launch.world_size}; "
            "use --strategy ddp, or start one process"
        )
    device = pick_device(launch)
    if not launch.distributed:
        return Dist(launch=launch, device=device, backend="none", fence=Unfenced())
    backend = "nccl" if device.type == "cuda" else "gloo"
    # A process of an earlier attempt (its pod deleted on a node cut off from the apiserver) never joins in the
    # place of the rank's current pod.
    rank_fence = for_rank(launch.rank_addr, launch.pod_ips, launch.rank)
    rank_fence.wait_until_current(cfg.pg_timeout_seconds)
    dist.init_process_group(
        backend=backend,
        # env:// rather than tcp://: under torchrun it reuses the agent's store on MASTER_PORT.
        init_method="env://",
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=datetime.timedelta(seconds=cfg.pg_timeout_seconds),
        device_id=device if backend == "nccl" else None,
    )
    host_group = dist.new_group(backend="gloo") if backend == "nccl" else None  # None: the default group
    return Dist(launch=launch, device=device, backend=backend, fence=rank_fence, host_group=host_group)


def wrap(model: nn.Module, d: Dist, cfg: DistConfig) -> tuple[nn.Module, DistributedDataParallel | None]:
    """The module to train, and the DDP wrapper when there is one (for ``no_sync``).

    DDP only with two ranks or more. Its gradients are views into its all-reduce buckets
    (``gradient_as_bucket_view``): no copy between the two after each backward, and no second copy
    of the gradients in memory. Checkpoints hold ``model``'s own state dict either way, so they load
    across world sizes.
    """
    if cfg.strategy == "dp":
        return nn.DataParallel(model), None  # with no GPU, DataParallel just calls the module
    if d.backend == "none" or d.world_size == 1:
        return model, None
    ddp = DistributedDataParallel(
        model,
        device_ids=[d.device] if d.device.type == "cuda" else None,
        bucket_cap_mb=cfg.bucket_cap_mb,
        gradient_as_bucket_view=True,
        static_graph=cfg.static_graph,
    )
    return ddp, ddp


def no_sync(ddp: DistributedDataParallel | None, sync: bool) -> AbstractContextManager[Any]:
    """Skip the gradient all-reduce on micro-batches that are not an accumulation boundary."""
    return nullcontext() if sync or ddp is None else ddp.no_sync()


def is_retryable(err: BaseException) -> bool:
    """A lost peer or a collective timeout: a restart of the gang from the checkpoint can fix it."""
    if isinstance(err, RetryableError | dist.DistError | TimeoutError | ConnectionError):
        return True
    if isinstance(err, RuntimeError):
        message = str(err).lower()
        return any(fragment in message for fragment in _RETRYABLE_MESSAGES)
    return False
