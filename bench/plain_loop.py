"""The plain single-process loop of the classic tutorials: the baseline the trainer is held to.

    python -m bench.plain_loop --model resnet18 --image-size 64 --batch-size 16

One device (``cuda:0`` when there is one), no process group, no DDP. Emits one ``BENCH_RESULT`` line:
img/s over the measured window and, on CPU, each measured step's forward+backward milliseconds.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

from bench import loops
from bench.common import emit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    loops.add_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    torch.backends.cudnn.benchmark = True
    fmt = loops.memory_format(args)
    model = loops.build_model(args.model).to(device).to(memory_format=fmt)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    steps = args.warmup + args.measure
    dataset = loops.RandomImages(steps * args.batch_size, args.image_size)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
    )
    amp = loops.AMP.get(args.amp)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")  # the AMP recipe's; off otherwise
    syncs = loops.SyncCounter(device) if args.sync_check else None
    window = loops.window(args, device, syncs)
    on_cpu = device.type == "cpu"  # only there does the host clock see when the work ends
    fwd_bwd_ms: list[float] = []

    model.train()
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
    emit(loops.result(args, window, 1, fwd_bwd_ms, syncs))


if __name__ == "__main__":
    main()
