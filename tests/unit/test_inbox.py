"""The inbox: calls posted from other threads run on the event loop in order, and a batch posted while the loop is
busy wakes it once."""

from __future__ import annotations

import asyncio
import threading

from ddpjob_operator.inbox import Inbox

from .factories import count_wakes


def test_calls_posted_while_the_loop_is_busy_run_in_order_after_one_wake_up() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        wakes = count_wakes(loop)
        inbox = Inbox(loop)
        ran: list[int] = []
        posting = threading.Thread(target=lambda: [inbox.post(lambda i=i: ran.append(i)) for i in range(100)])
        posting.start()
        posting.join()  # the loop is busy here (this coroutine holds it): every call joins one batch
        assert ran == [] and len(wakes) == 1
        await asyncio.sleep(0)
        assert ran == list(range(100)), "in the order posted"
        inbox.post(lambda: ran.append(100))
        await asyncio.sleep(0)
        assert ran[-1] == 100 and len(wakes) == 2, "the next batch wakes the loop again"

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def test_a_call_that_raises_leaves_the_calls_after_it_to_run() -> None:
    async def scenario() -> None:
        inbox = Inbox(asyncio.get_running_loop())
        ran: list[str] = []

        def broken() -> None:
            raise RuntimeError("a bug")

        threading.Thread(target=lambda: [inbox.post(broken), inbox.post(lambda: ran.append("after"))]).start()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if ran:
                break
        assert ran == ["after"]
        inbox.post(lambda: ran.append("later"))
        await asyncio.sleep(0.01)
        assert ran == ["after", "later"], "and the inbox still wakes the loop"

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
