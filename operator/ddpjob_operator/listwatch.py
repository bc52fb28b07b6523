"""One list-and-watch thread per watched scope, kept alive through the apiserver's restarts: the loop the pod cache
(``podcache``) and the DDPJob watch (``jobwatch``) share.

A subclass says what a LIST does (``_list``: returns the version to watch from) and what a watch event does
(``_event``). A watch the apiserver ends is resumed from the last version seen; one that expired (410 Gone) is
replaced by a fresh LIST at once, and one that failed by a LIST after a backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ddpjob_operator import namespaces
from ddpjob_operator.kube import Expired

log = logging.getLogger("ddpjob_operator")

WATCH_SECONDS = 300
"""The apiserver ends each watch after this long; it is resumed from the last version seen."""
RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)


class NotYet(Exception):
    """``_list``'s answer while the apiserver does not serve the objects (an API not installed): listed again after
    ``seconds``, with nothing logged."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"not served; asking again in {seconds:g}s")
        self.seconds = seconds


class ListWatch:
    """``served``: the operator's namespaces (empty: all; patterns, see ``namespaces``, are matched here against a
    cluster-wide watch). ``what`` names the objects in the log ("pod", "DDPJob")."""

    def __init__(self, served: Sequence[str], what: str) -> None:
        patterns = namespaces.any_pattern(served)
        self._patterns = list(served) if patterns else []
        self._scopes = [""] if not served or patterns else list(dict.fromkeys(served))
        self._what = what
        self._stopped = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(ns,), name=f"{what.lower()}s-{ns or 'all'}", daemon=True)
            for ns in self._scopes
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """The threads end at their watch's next event or timeout; as daemons they never hold up exit."""
        self._stopped.set()

    def _served(self, namespace: str) -> bool:
        return namespaces.served(namespace, self._patterns)

    def _list(self, namespace: str) -> str:
        """LIST the scope and take in what it holds; the version to watch from."""
        raise NotImplementedError

    def _watch_events(self, namespace: str, version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """The scope's watch from ``version``, for up to ``WATCH_SECONDS``."""
        raise NotImplementedError

    def _event(self, namespace: str, kind: str, obj: dict[str, Any]) -> None:
        """One watch event (never a BOOKMARK) of an object in a served namespace."""
        raise NotImplementedError

    def _run(self, namespace: str) -> None:
        failures = 0
        said = ""
        scope = namespace or "all namespaces"
        while not self._stopped.is_set():
            try:
                version = self._list(namespace)
                failures, said = 0, ""
                while not self._stopped.is_set():
                    version = self._watch(namespace, version)
            except Expired:
                log.info("%s watch of %s expired; listing again", self._what, scope)
            except NotYet as err:
                self._stopped.wait(err.seconds)
            except Exception as err:  # the apiserver restarting, a network blip, a CRD not served yet: with backoff
                if self._stopped.is_set():
                    return
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                # the same failure again (RBAC that does not grant the list) is said once, until it changes
                level = logging.DEBUG if str(err) == said else logging.WARNING
                said = str(err)
                log.log(level, "%s watch of %s failed (%s); listing again in %.1fs", self._what, scope, err, delay)
                self._stopped.wait(delay)

    def _watch(self, namespace: str, version: str) -> str:
        """Follow one watch until the apiserver ends it; returns the version to resume from."""
        started = time.monotonic()
        for kind, obj in self._watch_events(namespace, version):
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind == "BOOKMARK" or not self._served(str((obj.get("metadata") or {}).get("namespace", ""))):
                continue
            self._event(namespace, kind, obj)
            if self._stopped.is_set():
                break
        if time.monotonic() - started < 1.0:
            self._stopped.wait(1.0)  # a watch that ends at once, over and over, must not spin
        return version
