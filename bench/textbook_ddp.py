"""The textbook torchrun DDP script: the recipe of the PyTorch DDP tutorials, written plainly.

    torchrun --standalone --nproc-per-node 2 -m bench.textbook_ddp --model resnet18 --image-size 64

Process group from the environment torchrun sets, one device per process (``cuda:LOCAL_RANK``, or
the CPU with gloo), the model wrapped in DDP, a DistributedSampler, and the usual loop. Rank 0
emits one ``BENCH_RESULT`` line: global img/s over the measured window and, on CPU, each measured
step's forward+backward milliseconds (backward includes DDP's overlapped all-reduce).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from bench import loops
from bench.common import emit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    loops.add_arguments(parser)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    fmt = loops.memory_format(args)
    model = loops.build_model(args.model).to(device).to(memory_format=fmt)
    model.train()
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    steps = args.warmup + args.measure
    dataset = loops.RandomImages(steps * args.batch_size * world_size, args.image_size)
    sampler: DistributedSampler[int] = DistributedSampler(dataset)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.num_workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
    )
    amp = loops.AMP.get(args.amp)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    syncs = loops.SyncCounter(device) if args.sync_check and rank == 0 else None
    window = loops.window(args, device, syncs)
    on_cpu = device.type == "cpu"
    fwd_bwd_ms: list[float] = []

    sampler.set_epoch(0)
    for step, (images, labels) in enumerate(loader, start=1):
        images = images.to(device, non_blocking=True, memory_format=fmt)
        labels = labels.to(device, non_blocking=True)
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if on_cpu and step > args.warmup:
            fwd_bwd_ms.append(1000 * (time.perf_counter() - started))
        scaler.step(optimizer)
        scaler.update()
        window.step_done(step)
    if rank == 0:
        emit(loops.result(args, window, world_size, fwd_bwd_ms, syncs))
    dist.barrier()  # no rank tears its connections down while a peer still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
