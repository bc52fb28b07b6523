"""A small raw-JSON client for the box's apiserver, a pod watch, and its request-latency histogram.

Plain ``http.client`` with one keep-alive connection per thread: the load generator must cost
the machine as little as possible, since it shares two cores with the apiserver and the operator.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

from prometheus_client.parser import text_string_to_metric_families

from bench.common import wait_until

DURATION = "apiserver_request_duration_seconds"
MUTATING = ("POST", "PUT", "PATCH", "DELETE")
USER_AGENT = "ddpjob-bench"
"""What the benchmarks' own requests say they are: the audit log tells them from the operator's."""


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, Mapping) else str(body)[:300]
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status


class Api:
    """JSON in and out over HTTPS with a bearer token; safe to share between threads."""

    def __init__(self, server: str, token: str, ca_file: str) -> None:
        url = urlsplit(server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.token = token
        self.ctx = ssl.create_default_context(cafile=ca_file)
        self._local = threading.local()

    def _connection(self, timeout: float | None = 30) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Accept": "application/json", "Content-Type": content_type,
                "User-Agent": USER_AGENT}  # fmt: skip

    def raw(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> bytes:
        payload = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):  # a keep-alive connection the server closed (idle, or mid-TLS) is reopened once
            conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self._connection()
            try:
                conn.request(method, path, body=payload, headers=self._headers(content_type))
                response = conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
                continue
            if not 200 <= response.status < 300:
                raise ApiError(response.status, method, path, _json_or_text(data))
            return data
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        data = self.raw(method, path, body, **kw)
        return json.loads(data) if data else None

    def get(self, path: str, **query: str) -> Any:
        return self.request("GET", f"{path}?{urlencode(query)}" if query else path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def create_if_absent(self, path: str, body: Any) -> None:
        try:
            self.post(path, body)
        except ApiError as err:
            if err.status != 409:
                raise

    def wait_for(self, check: Callable[[], bool], what: str, timeout: float = 60) -> None:
        """Until ``check()`` is true; an API error counts as not yet."""

        def probe() -> bool:
            try:
                return check()
            except ApiError:
                return False

        deadline = time.monotonic() + timeout
        wait_until(what, probe, lambda: deadline, interval=0.2)

    def watch(self, path: str, **query: str) -> WatchStream:
        """Watch events (``{"type": ..., "object": ...}``) from ``path``; ``close()`` ends it from any thread."""
        conn = self._connection(timeout=None)
        conn.request("GET", f"{path}?{urlencode({**query, 'watch': '1'})}", headers=self._headers())
        response = conn.getresponse()
        if response.status != 200:
            raise ApiError(response.status, "WATCH", path, _json_or_text(response.read()))
        return WatchStream(conn, response)


class WatchStream:
    def __init__(self, conn: http.client.HTTPSConnection, response: http.client.HTTPResponse) -> None:
        self.conn, self.response = conn, response
        self.closed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        buffer = b""
        while True:
            try:
                chunk = self.response.read1(65536)
            except (OSError, ValueError, AttributeError, http.client.HTTPException):
                if self.closed:
                    return  # closed under us: that is how a watch ends
                raise
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    yield json.loads(line)

    def close(self) -> None:
        self.closed = True
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conn.close()


def _json_or_text(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


# ---------------------------------------------------------------- the latency histogram


@dataclass
class Histogram:
    """Cumulative bucket counts by upper bound, as Prometheus exposes them, plus count and sum."""

    buckets: dict[float, float] = field(default_factory=dict)
    count: float = 0.0
    total: float = 0.0

    def add(self, other: Histogram, sign: float = 1.0) -> None:
        for bound, n in other.buckets.items():
            self.buckets[bound] = self.buckets.get(bound, 0.0) + sign * n
        self.count += sign * other.count
        self.total += sign * other.total

    def minus(self, other: Histogram) -> Histogram:
        out = Histogram()
        out.add(self)
        out.add(other, -1.0)
        return out

    def quantile(self, q: float) -> float:
        """Like PromQL's histogram_quantile: linear within the bucket the rank falls in."""
        if self.count <= 0:
            return float("nan")
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound in sorted(self.buckets):
            cumulative = self.buckets[bound]
            if cumulative >= rank:
                if bound == float("inf"):
                    return lower  # beyond the last finite bucket: its bound is all we know
                inside = cumulative - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
            lower, below = bound, cumulative
        return lower

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count > 0 else float("nan")


def request_durations(text: str) -> dict[tuple[str, str], Histogram]:
    """``apiserver_request_duration_seconds`` summed over every other label, by (verb, resource[/subresource])."""

    def key(labels: Mapping[str, str]) -> tuple[str, str]:
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        return labels.get("verb", ""), resource

    return histograms(text, DURATION, key)


def histograms(
    text: str, name: str, key: Callable[[Mapping[str, str]], tuple[str, str]] = lambda _: ("", "")
) -> dict[tuple[str, str], Histogram]:
    """The histogram ``name`` from Prometheus text, summed into one Histogram per ``key(labels)``."""
    out: dict[tuple[str, str], Histogram] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            labels = sample.labels
            h = out.setdefault(key(labels), Histogram())
            if sample.name.endswith("_bucket"):
                bound = float(labels["le"])
                h.buckets[bound] = h.buckets.get(bound, 0.0) + sample.value
            elif sample.name.endswith("_count"):
                h.count += sample.value
            elif sample.name.endswith("_sum"):
                h.total += sample.value
    return out


def by_verb(histograms: Mapping[tuple[str, str], Histogram], verbs: tuple[str, ...] = MUTATING) -> dict[str, Histogram]:
    out: dict[str, Histogram] = {}
    for (verb, _), h in histograms.items():
        if verb in verbs:
            out.setdefault(verb, Histogram()).add(h)
    return out


def difference(
    after: Mapping[tuple[str, str], Histogram], before: Mapping[tuple[str, str], Histogram]
) -> dict[tuple[str, str], Histogram]:
    """What happened between two scrapes (series that appeared in between count from zero)."""
    return {key: h.minus(before.get(key, Histogram())) for key, h in after.items()}
