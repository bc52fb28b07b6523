"""Polls the ranks' /metrics by direct HTTP to the pod IPs, off the reconcile path.

The reconcile says what to poll (``Plan.poll``) and how often; each job then gets one asyncio task
here that scrapes all its ranks concurrently, keeps the scrapes of the last window in memory, and
wakes the job's worker, which folds them into the status (pure code, one status write). A rank
that does not answer costs one bounded wait in this task and nothing in the reconcile: the
reconcile only reads the scrapes already taken. Requests are bounded three ways: a timeout each,
a cap on concurrent requests across all jobs, and a cap on the bytes read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from ddpjob_contract.metrics import POLLER_USER_AGENT
from ddpjob_operator import progress
from ddpjob_operator.api import Key
from ddpjob_operator.progress import Scrape, Target

Fetch = Callable[[str], Awaitable[str]]

log = logging.getLogger(__name__)

MAX_BYTES = 4 * 1024 * 1024
"""A trainer's /metrics is a few KiB; never read more than this from a pod."""


class ScrapeError(Exception):
    """A rank that did not answer usefully; the message says why (shown in status.progress.ranks)."""


@dataclass
class _Job:
    attempt: int
    targets: tuple[Target, ...]
    interval: float
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Poller:
    """One polling task per job; ``track`` and ``scrapes`` may be called from any thread."""

    def __init__(
        self,
        wake: Callable[[Key], None],
        *,
        max_interval: float = 15.0,
        timeout: float = 2.0,
        concurrency: int = 32,
        fetch: Fetch | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = wake
        self.max_interval = max_interval
        self.timeout = timeout
        self._limit = asyncio.Semaphore(concurrency)
        self._concurrency = concurrency
        self._fetch = fetch or self._http_get
        self._session: aiohttp.ClientSession | None = None
        self._jobs: dict[Key, _Job] = {}
        self._scrapes: dict[Key, tuple[Scrape, ...]] = {}

    # Called by reconciles (in worker threads)

    def scrapes(self, key: Key) -> tuple[Scrape, ...]:
        """The job's recent scrapes, oldest first (an immutable tuple, replaced whole on each poll)."""
        return self._scrapes.get(key, ())

    def track(self, key: Key, attempt: int, targets: tuple[Target, ...], interval: float) -> None:
        """Poll these targets from now on (none: stop polling the job).

        No targets for a job not polled is nothing to do, and asks nothing of the event loop (a wake-up each): every
        reconcile says what to poll, and a job's first ones, before any rank runs, say none. Read from this thread,
        the dicts are current for the job: its reconciles run one at a time, and the loop takes the last one's
        ``track`` (queued first) before it hears that the reconcile ended and can start the next.
        """
        if not targets and key not in self._jobs and key not in self._scrapes:
            return
        self._loop.call_soon_threadsafe(self.track_now, key, attempt, targets, interval)

    # In the event loop

    def track_now(self, key: Key, attempt: int, targets: tuple[Target, ...], interval: float) -> None:
        job = self._jobs.get(key)
        if not targets:
            if job is not None:
                del self._jobs[key]
                if job.task is not None:
                    job.task.cancel()
            self._scrapes.pop(key, None)
            return
        if job is None:
            job = self._jobs[key] = _Job(attempt=attempt, targets=targets, interval=interval)
            job.task = self._loop.create_task(self._run(key, job), name=f"ddpjob progress {key}")
            return
        if attempt != job.attempt:
            self._scrapes[key] = ()
        if (attempt, targets) != (job.attempt, job.targets):
            job.attempt, job.targets = attempt, targets
            job.changed.set()  # new pods or a new attempt: poll at once
        job.interval = interval

    def __len__(self) -> int:
        return len(self._jobs)

    async def stop(self) -> None:
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._jobs.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def poll_once(self, attempt: int, targets: tuple[Target, ...]) -> Scrape:
        """Scrape every target concurrently; takes at most about one timeout per ``concurrency`` targets."""
        at = datetime.now(UTC)
        results = await asyncio.gather(*(self._scrape(t) for t in targets))
        ranks = {t.rank: r for t, r in zip(targets, results, strict=True) if isinstance(r, progress.RankSample)}
        errors = {t.rank: r for t, r in zip(targets, results, strict=True) if isinstance(r, str)}
        return Scrape(at=at, attempt=attempt, targets=targets, ranks=ranks, errors=errors)

    async def _run(self, key: Key, job: _Job) -> None:
        try:
            while True:
                job.changed.clear()
                attempt, targets = job.attempt, job.targets
                scrape = await self.poll_once(attempt, targets)
                if self._jobs.get(key) is not job:
                    return
                if attempt == job.attempt:
                    history = (*self._scrapes.get(key, ()), scrape)
                    self._scrapes[key] = tuple(
                        s for s in history if (scrape.at - s.at).total_seconds() <= progress.WINDOW_SECONDS
                    )
                    self._wake(key)
                if not job.changed.is_set():
                    try:
                        await asyncio.wait_for(job.changed.wait(), timeout=min(job.interval, self.max_interval))
                    except TimeoutError:
                        pass
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not take the operator down; the job just stops being polled
            log.exception("polling %s/%s failed", *key)
            if self._jobs.get(key) is job:
                del self._jobs[key]

    async def _scrape(self, target: Target) -> progress.RankSample | str:
        try:
            async with self._limit:
                text = await asyncio.wait_for(self._fetch(target.url), timeout=self.timeout)
        except TimeoutError:
            return f"no answer within {self.timeout:g}s"
        except aiohttp.ClientConnectorError as err:
            if isinstance(err.os_error, ConnectionRefusedError):
                return progress.REFUSED
            return str(err) or type(err).__name__
        except (ScrapeError, aiohttp.ClientError, OSError, ValueError) as err:
            return str(err) or type(err).__name__
        return progress.parse_metrics(text)

    async def _http_get(self, url: str) -> str:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._concurrency, force_close=True)
            # named, so a rank's linger after its last step does not wait for the operator's next poll
            self._session = aiohttp.ClientSession(connector=connector, headers={"User-Agent": POLLER_USER_AGENT})
        async with self._session.get(url, allow_redirects=False) as response:
            if response.status != 200:
                raise ScrapeError(f"HTTP {response.status} from {url}")
            body = await response.content.read(MAX_BYTES)
        return body.decode(errors="replace")
