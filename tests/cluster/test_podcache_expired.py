"""The pod cache's watch expired for real (410 Gone): it lists again and misses nothing of the gap.

The session's box serves pod watches from its watch cache, which etcd's compaction does not touch.
This module starts a control plane of its own with the pods' watch cache off
(``--watch-cache-sizes=pods#0``, the one size the flag honours): a pod watch then reads etcd, and
after a compaction past the cache's resourceVersion the apiserver answers it 410.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ddpjob_box.controlplane import ControlPlane
from ddpjob_operator import podcache
from ddpjob_operator.kube import Kube
from ddpjob_operator.podcache import PodCache

from .helpers import Raw, own_plane
from .test_podcache import Changes, eventually, names, pod

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with own_plane(extra_args={"kube-apiserver": ["--watch-cache-sizes=pods#0"]}) as the_plane:
        yield the_plane


@pytest.fixture(scope="module")
def client(plane: ControlPlane) -> Iterator[Any]:
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(plane.kubeconfig))
    yield api
    api.close()


def etcd(plane: ControlPlane, call: str, body: dict[str, Any]) -> dict[str, Any]:
    """etcd's v3 API through its JSON gateway."""
    request = urllib.request.Request(f"{plane.etcd_url}/v3/{call}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return dict(json.loads(response.read()))


def compact(plane: ControlPlane) -> int:
    """Compact etcd's history up to now; returns the revision."""
    revision = int(etcd(plane, "kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    etcd(plane, "kv/compaction", {"revision": revision, "physical": True})
    return revision


class GatedKube(Kube):
    """The real client, but a watch opens only while ``gate`` is set: the test holds the cache
    between two watches while it changes pods and compacts etcd. Counts the LISTs."""

    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()
        self.lists = 0

    def list_managed_pods(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return super().list_managed_pods(namespace)

    def watch_managed_pods(self, namespace: str, version: str, seconds: int) -> Any:
        if not self.gate.is_set():
            self.waiting.set()
            self.gate.wait()
        return super().watch_managed_pods(namespace, version, seconds)


def test_a_watch_expired_by_an_etcd_compaction_is_replaced_by_a_list_that_shows_the_gap(
    plane: ControlPlane, client: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ddpjob_operator")
    monkeypatch.setattr(podcache, "WATCH_SECONDS", 2)  # each watch ends soon: the next one is where 410 comes
    raw = Raw(client)
    ns = f"t-{uuid.uuid4().hex[:8]}"
    raw.post("/api/v1/namespaces", {"metadata": {"name": ns}})
    path = f"/api/v1/namespaces/{ns}/pods"
    kube = GatedKube(client)
    changes = Changes()
    cache = PodCache(kube, [ns], changes)
    try:
        raw.post(path, pod("a-0", "a"))
        cache.start()
        eventually(lambda: names(cache, ns, "a") == {"a-0"}, "the first list")
        kube.gate.clear()
        eventually(kube.waiting.is_set, "the cache to finish its watch and wait to open the next")
        raw.delete(f"{path}/a-0", {"gracePeriodSeconds": 0})
        raw.post(path, pod("a-1", "a"))
        compact(plane)
        lists, changes.keys = kube.lists, []
        kube.gate.set()
        eventually(lambda: names(cache, ns, "a") == {"a-1"}, "the gap's delete and create, from a new list")
        assert kube.lists > lists
        assert (ns, "a") in changes.keys, "the job's worker is woken"
        assert any("expired; listing again" in r.getMessage() for r in caplog.records), "it was a 410, not a failure"
        assert not any(r.levelno >= logging.WARNING for r in caplog.records)
    finally:
        kube.gate.set()
        cache.stop()
        raw.delete(f"/api/v1/namespaces/{ns}")
