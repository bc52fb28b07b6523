"""What-if: the operator with more threads for its reconciles. A bench-side shim, not an operator option.

    BENCH_OPERATOR_THREADS=32 python -m bench.operator_whatif operator --all-namespaces

The operator runs each reconcile with ``asyncio.to_thread``, so at most the default executor's
threads (``min(32, cpus + 4)``: 6 on two cores) reconcile at once, and each reconcile waits for
its API calls one after another. This registers one more startup handler that replaces the
default executor with a larger one, then runs the real CLI: it measures what that change would buy.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf


@kopf.on.startup()
async def _larger_executor(**_: Any) -> None:
    threads = int(os.environ.get("BENCH_OPERATOR_THREADS", "32"))
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(threads, thread_name_prefix="reconcile"))


if __name__ == "__main__":
    from ddpjob_operator.cli import main

    raise SystemExit(main())
