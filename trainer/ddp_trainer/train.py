"""The training loop: wires config, process group, data, model, metrics and checkpoints together.

A *step* is one optimizer step: ``grad_accum_steps`` micro-batches of ``batch_size`` per rank.
Positions are counted in micro-batches within an epoch, so a resumed run skips exactly the
batches it already trained on.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_trainer import checkpoint, compiling, data, distributed, models, signals, timing
from ddp_trainer.config import Config, OptimConfig
from ddp_trainer.errors import ConfigError, DataError, Stopped
from ddp_trainer.launch import Launch
from ddp_trainer.metrics import Metrics, Saved, StepTiming
from ddp_trainer.report import summary_lines
from ddp_trainer.stop_vote import StopVote
from ddpjob_contract.metrics import RESTART_REASON_LABEL

log = logging.getLogger("ddp_trainer")

_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_CRITERION = nn.CrossEntropyLoss()
Batch = tuple[torch.Tensor, torch.Tensor]


def setup_logging(rank: int) -> None:
    """Every rank logs its progress to stdout; rank 1 and up prefix their lines with their rank."""
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format="%(asctime)s %(message)s" if rank == 0 else f"%(asctime)s rank {rank}: %(message)s",
        datefmt="%H:%M:%S",
    )


@dataclass
class Result:
    """What a finished run leaves behind (tests compare ``model`` across ranks and runs)."""

    steps: int
    model: nn.Module
    timings: list[StepTiming]
    checkpoint: Saved | None = None
    """The newest complete checkpoint this run saved or resumed from."""


@dataclass
class Position:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of this epoch already trained on, per rank


def lr_lambda(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the peak lr after ``step`` optimizer steps: linear warm-up, then the schedule."""
    warmup = cfg.lr_warmup_steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if cfg.lr_schedule == "cosine":
            progress = (step - warmup) / max(1, total_steps - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        if cfg.lr_schedule == "step":
            return float(cfg.lr_gamma ** ((step - warmup) // cfg.lr_step_size))
        return 1.0

    return factor


def _seed_everything(cfg: OptimConfig) -> None:
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # same on every rank: identical initial weights
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by cuBLAS, before first use
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True


def _serve_metrics(metrics: Metrics, cfg: Config, launch: Launch) -> None:
    if not cfg.observe.metrics_port:
        return
    port = cfg.observe.metrics_port + launch.local_rank  # torchrun puts several ranks on one host
    try:
        metrics.serve(port)
    except OSError as err:
        raise ConfigError(
            f"--metrics-port (METRICS_PORT): cannot listen on port {port} ({err}); pick a free port"
        ) from None


def run(cfg: Config, launch: Launch) -> Result:
    metrics = Metrics()
    metrics.restart_count.set(launch.restart_count)
    if launch.restart_reason:
        metrics.restart.info({RESTART_REASON_LABEL: launch.restart_reason})
    _serve_metrics(metrics, cfg, launch)  # before joining, so a rank stuck at rendezvous is visible
    d = distributed.setup(launch, cfg.dist)
    metrics.pg_ready.set(1 if d.backend != "none" else 0)
    try:
        result = _train(cfg, d, metrics)
        if cfg.observe.metrics_linger_seconds and cfg.observe.metrics_port:
            log.info("%s", metrics.linger(cfg.observe.metrics_linger_seconds).line())
        d.finish()
        return result
    except BaseException:
        d.close()
        raise


@dataclass
class Parts:
    """Everything a run trains with, built once."""

    data: data.Data
    model: nn.Module  # unwrapped: what checkpoints hold
    forward: Callable[[torch.Tensor], torch.Tensor]  # the model wrapped in DDP or DP, maybe compiled
    ddp: DistributedDataParallel | None
    compilation: compiling.Compilation  # what the first compiled call cost (zeros without --compile)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    batch: int  # loader batch per process (x GPUs for DataParallel)
    steps_per_epoch: int
    total: int


def _build(cfg: Config, d: distributed.Dist) -> Parts:
    _seed_everything(cfg.optim)
    replicas = torch.cuda.device_count() if cfg.dist.strategy == "dp" and d.device.type == "cuda" else 1
    batch = cfg.optim.batch_size * replicas  # DataParallel splits one batch across the GPUs
    dataset = data.build(
        cfg.data,
        image_size=cfg.model.image_size,
        num_classes=cfg.model.num_classes,
        batch_size=batch,
        seed=cfg.optim.seed,
        rank=d.rank,
        world_size=d.world_size,
        pin_memory=cfg.data.pin_memory and d.device.type == "cuda",
    )
    accum = cfg.optim.grad_accum_steps
    steps_per_epoch = dataset.batches_per_epoch // accum
    if steps_per_epoch == 0:
        raise DataError(
            f"one epoch has {dataset.batches_per_epoch} batches per rank, fewer than --grad-accum-steps "
            f"(TRAIN_GRAD_ACCUM_STEPS) {accum}; lower it or --batch-size"
        )
    total = cfg.optim.steps or cfg.optim.epochs * steps_per_epoch
    model = models.build(cfg.model.model, dataset.num_classes).to(d.device).to(memory_format=_memory_format(cfg))
    optimizer = torch.optim.SGD(
        model.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum, weight_decay=cfg.optim.weight_decay
    )
    forward, ddp, compilation = _wrap(cfg, d, model)
    return Parts(
        data=dataset,
        model=model,
        forward=forward,
        ddp=ddp,
        compilation=compilation,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.optim, total)),
        scaler=torch.amp.GradScaler(d.device.type, enabled=cfg.optim.amp == "fp16"),
        batch=batch,
        steps_per_epoch=steps_per_epoch,
        total=total,
    )


def _wrap(
    cfg: Config, d: distributed.Dist, model: nn.Module
) -> tuple[nn.Module, DistributedDataParallel | None, compiling.Compilation]:
    """The module the loop calls, the DDP wrapper if any, and the record of the compilation."""
    if not cfg.model.compile:
        wrapped, ddp = distributed.wrap(model, d, cfg.dist)
        return wrapped, ddp, compiling.Compilation()
    if cfg.dist.strategy == "dp":  # DataParallel copies its module onto each GPU per call: compile around it
        wrapped, ddp = distributed.wrap(model, d, cfg.dist)
        outer = compiling.CompileOrEager(wrapped)
        return outer, ddp, outer.compilation
    # Inside DDP: dynamo still splits the graph at DDP's buckets, and a fallback stays within one DDP forward.
    inner = compiling.CompileOrEager(model)
    wrapped, ddp = distributed.wrap(inner, d, cfg.dist)
    return wrapped, ddp, inner.compilation


def _memory_format(cfg: Config) -> torch.memory_format:
    return torch.channels_last if cfg.model.channels_last else torch.contiguous_format


def _train(cfg: Config, d: distributed.Dist, metrics: Metrics) -> Result:
    parts = _build(cfg, d)
    pos = _resume(cfg, d, parts, metrics)
    # With somewhere to save, a stop saves first (signals); every rank votes at each step boundary.
    save_on_stop = bool(cfg.checkpoint.checkpoint_dir) and cfg.checkpoint.stop_grace_seconds > 0
    if save_on_stop:
        signals.arm(cfg.checkpoint.stop_grace_seconds)
    metrics.info.info(_info(cfg, d))
    metrics.target_step.set(parts.total)  # with ddp_step: the percent done and the ETA in `kubectl get ddpj`
    accum = cfg.optim.grad_accum_steps
    if d.is_main:
        log.info(
            "training %s on %s data: world size %d, backend %s, device %s, batch %d per rank x %d "
            "accumulation, steps %d..%d",
            cfg.model.model, cfg.data.data, d.world_size, d.backend, d.device, parts.batch, accum, pos.step,
            parts.total,
        )  # fmt: skip

    timer = timing.timer(d.device, timed=cfg.observe.step_timing)
    timings: list[StepTiming] = []

    def record(done: list[StepTiming]) -> None:
        for t in done:
            metrics.record(t)
            timings.append(t)
            # Every rank logs its own step lines (`kubectl logs <job>-1` shows training too); rank 1 and up
            # carry a `rank R:` prefix.
            if t.step % cfg.observe.log_interval and t.step != parts.total:
                continue
            if not t.timed:
                log.info("step=%d/%d", t.step, parts.total)
                continue
            rate = t.samples * d.world_size / t.step_seconds if t.step_seconds > 0 else 0.0
            log.info(
                "step=%d/%d loss=%.4f img/s=%.1f step_time=%.1fms",
                t.step, parts.total, t.loss, rate, t.step_seconds * 1000,
            )  # fmt: skip

    first = pos.step + 1
    vote = StopVote(d)

    while pos.step < parts.total:
        batches = parts.data.epoch(pos.epoch, pos.batch_in_epoch)
        for _ in range(min(parts.steps_per_epoch - pos.batch_in_epoch // accum, parts.total - pos.step)):
            loss = _step(cfg, d, parts, batches, timer, slow=_slow(cfg, d.rank, pos.step + 1))
            pos.step += 1
            pos.batch_in_epoch += accum
            if pos.batch_in_epoch // accum == parts.steps_per_epoch:
                pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0
            timer.finish(pos.step, parts.batch * accum, loss)
            if pos.step == first and cfg.model.compile:
                log.info(
                    "step %d includes compilation: %.1fs in torch.compile (forward and backward graphs%s); the "
                    "summary leaves this step out",
                    first, parts.compilation.seconds, ", which failed" if parts.compilation.failed else "",
                )  # fmt: skip
            record(timer.poll())
            stop = save_on_stop and vote.after_step(pos.step, signals.requested())
            _maybe_checkpoint(cfg, d, parts, pos, metrics, now=stop)
            if stop:
                record(timer.flush())
                raise Stopped(pos.step, signals.signal_name())
            _maybe_crash(cfg, d, pos.step)
        del batches  # shuts down this epoch's workers before the next epoch starts its own

    vote.close()
    record(timer.flush())
    if d.is_main:
        for line in summary_lines(cfg, d.world_size, d.backend, str(d.device), timings):
            log.info("%s", line)
    return Result(steps=pos.step, model=parts.model, timings=timings, checkpoint=metrics.newest_checkpoint)


def _slow(cfg: Config, rank: int, step: int) -> bool:
    """Whether ``rank`` plays the straggler in ``step`` (--slow-rank, until --slow-until-step)."""
    debug = cfg.debug
    until = debug.slow_until_step
    return rank == debug.slow_rank and debug.slow_seconds > 0 and (until == 0 or step <= until)


def _step(
    cfg: Config, d: distributed.Dist, parts: Parts, batches: Iterator[Batch], timer: timing.Timer, *, slow: bool = False
) -> torch.Tensor:
    """One optimizer step over ``grad_accum_steps`` micro-batches; returns the loss, on the device."""
    accum = cfg.optim.grad_accum_steps
    amp_dtype = _AMP_DTYPES.get(cfg.optim.amp)
    timer.start()
    step_loss = torch.zeros((), device=d.device)
    for micro in range(accum):
        images, labels = next(batches)
        images = images.to(d.device, non_blocking=True, memory_format=_memory_format(cfg))
        labels = labels.to(d.device, non_blocking=True)
        timer.mark("data")
        if slow:
            time.sleep(cfg.debug.slow_seconds)  # a simulated straggler: slow compute
        with distributed.no_sync(parts.ddp, sync=micro == accum - 1):
            with torch.autocast(d.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = _CRITERION(parts.forward(images), labels) / accum
            timer.mark("forward")
            parts.scaler.scale(loss).backward()
            timer.mark("backward")
        step_loss += loss.detach().float()
    parts.scaler.step(parts.optimizer)
    parts.scaler.update()
    parts.optimizer.zero_grad(set_to_none=True)
    parts.scheduler.step()
    timer.mark("optimizer")
    return step_loss


def _info(cfg: Config, d: distributed.Dist) -> dict[str, str]:
    return {
        "world_size": str(d.world_size),
        "backend": d.backend,
        "model": cfg.model.model,
        "strategy": cfg.dist.strategy,
        "device": d.device.type,
        "batch_size": str(cfg.optim.batch_size),
        "amp": cfg.optim.amp,
        "data": cfg.data.data,
        "torch_version": torch.__version__,
    }


def _resume(cfg: Config, d: distributed.Dist, parts: Parts, metrics: Metrics) -> Position:
    """Load the newest complete checkpoint into ``parts``, onto this rank's device, if there is one."""
    directory = cfg.checkpoint.checkpoint_dir
    if not directory:
        return Position()
    if d.is_main:
        checkpoint.remove_stale_temps(directory)
    state = checkpoint.load_latest(directory, d.device)
    if state is None:
        return Position()
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    parts.scheduler.load_state_dict(state["scheduler"])
    parts.scaler.load_state_dict(state["scaler"])
    rngs: list[dict[str, Any]] = state["rng"]
    checkpoint.set_rng_state(rngs[d.rank] if d.rank < len(rngs) else rngs[0], d.device)
    metrics.checkpointed(state["step"], float(state.get("saved_at") or 0.0))
    if d.is_main:
        if state.get("world_size") != d.world_size:
            log.warning(
                "checkpoint was written by %s ranks, resuming with %d: the data order changes",
                state.get("world_size"), d.world_size,
            )  # fmt: skip
        log.info("resumed from step %d (epoch %d, batch %d)", state["step"], state["epoch"], state["batch_in_epoch"])
    return Position(step=state["step"], epoch=state["epoch"], batch_in_epoch=state["batch_in_epoch"])


def _maybe_checkpoint(
    cfg: Config, d: distributed.Dist, parts: Parts, pos: Position, metrics: Metrics, *, now: bool = False
) -> None:
    """Save at the interval, at the end, and ``now`` (a stop the ranks agreed on)."""
    c = cfg.checkpoint
    if not c.checkpoint_dir:
        return
    due = pos.step == parts.total or (c.checkpoint_interval and pos.step % c.checkpoint_interval == 0)
    if not (due or now):
        return
    started = time.perf_counter()
    saved_at = time.time()
    rngs = d.gather(checkpoint.rng_state(d.device))  # collective: every rank takes part
    if d.is_main:
        d.fence.confirm(f"write the checkpoint of step {pos.step}")
        state = {
            "format": checkpoint.FORMAT,
            "step": pos.step,
            "epoch": pos.epoch,
            "batch_in_epoch": pos.batch_in_epoch,
            "world_size": d.world_size,
            "model": parts.model.state_dict(),
            "optimizer": parts.optimizer.state_dict(),
            "scheduler": parts.scheduler.state_dict(),
            "scaler": parts.scaler.state_dict(),
            "rng": rngs,
            "saved_at": saved_at,
        }
        path = checkpoint.save(c.checkpoint_dir, state, c.checkpoint_keep)
        log.info("checkpoint %s", path)
    d.barrier()  # nobody runs ahead of a checkpoint that might fail
    metrics.checkpointed(pos.step, saved_at, time.perf_counter() - started)


def _maybe_crash(cfg: Config, d: distributed.Dist, step: int) -> None:
    if cfg.debug.crash_at_step == step and cfg.debug.crash_rank in (-1, d.rank):
        log.warning("debug: --crash-at-step %d: killing rank %d", step, d.rank)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
