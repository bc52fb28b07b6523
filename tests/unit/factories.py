"""Builders of test data: DDPJob bodies, parsed jobs and pod views; and a count of an event loop's wake-ups."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from ddpjob_operator.api import Job, parse_job
from ddpjob_operator.status import PodView


def body(name: str = "train", replicas: int = 2, **spec: Any) -> dict[str, Any]:
    template = spec.pop("template", None) or {
        "spec": {"containers": [{"name": "trainer", "image": "registry.example/trainer:1", "args": ["--epochs", "1"]}]}
    }
    return {
        "apiVersion": "ddpjob.dev/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": name, "namespace": "ns", "uid": "0123456789abcdef", "generation": 1},
        "spec": {"replicas": replicas, "template": copy.deepcopy(template), **spec},
    }


def job(name: str = "train", replicas: int = 2, **spec: Any) -> Job:
    return parse_job(body(name, replicas, **spec))


def pod(j: Job, rank: int, attempt: int = 0, **facts: Any) -> PodView:
    facts.setdefault("phase", "Pending")
    return PodView(
        name=f"{j.name}-{rank}",
        uid=f"uid-{rank}-{attempt}",
        rank=rank,
        attempt=attempt,
        spec_hash=facts.pop("spec_hash", j.spec.spec_hash),
        **facts,
    )


def pods(j: Job, attempt: int = 0, **facts: Any) -> list[PodView]:
    return [pod(j, r, attempt, **facts) for r in range(j.spec.replicas)]


def count_wakes(loop: asyncio.AbstractEventLoop) -> list[object]:
    """From now on, every ``loop.call_soon_threadsafe`` (a wake-up of the loop from another thread) is appended to
    the list returned, and still made."""
    wakes: list[object] = []
    wake = loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> Any:
        wakes.append(args)
        return wake(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    return wakes
