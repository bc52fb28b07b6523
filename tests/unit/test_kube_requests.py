"""``kube.Kube`` sends each request straight to the client's pool for the apiserver: the path and the query encoded as
the generated client encodes them, the body as JSON, the client's default headers and credentials (read again at
most every AUTH_SECONDS), and no answer becomes ``Unreachable``."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
import urllib3

from ddpjob_contract.pods import LABEL_JOB_NAME, LABEL_MANAGED_BY, MANAGED_BY
from ddpjob_operator import kube, metrics
from ddpjob_operator.kube import Kube, Unreachable, user_agent


class Answer:
    def __init__(self, status: int, data: bytes) -> None:
        self.status, self.data = status, data


class Pool:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.fail = False

    def urlopen(self, method: str, url: str, **kw: Any) -> Answer:
        if self.fail:
            raise urllib3.exceptions.MaxRetryError(None, url, "connection refused")  # type: ignore[arg-type]
        self.sent.append({"method": method, "url": url, **kw})
        return Answer(200, b'{"kind": "Pod"}')


class Client:
    """What Kube reads of the generated client: its configuration, headers, credentials and pool manager."""

    def __init__(self, pool: Pool) -> None:
        self.configuration = type("Configuration", (), {"host": "https://127.0.0.1:6443"})()
        self.default_headers = {"User-Agent": "test"}
        self.pool = pool
        self.asked = 0
        self.hosts: list[str] = []
        self.rest_client = type("Rest", (), {"pool_manager": self})()

    def connection_from_url(self, url: str) -> Pool:
        self.hosts.append(url)
        return self.pool

    def update_params_for_auth(self, headers: dict[str, str], *_: Any) -> None:
        self.asked += 1
        headers["Authorization"] = f"Bearer token-{self.asked}"

    def close(self) -> None:
        pass


def test_a_request_goes_to_the_apiservers_pool_with_its_query_encoded_and_its_body_as_json() -> None:
    pool = Pool()
    client = Client(pool)
    api = Kube(client)
    assert api.list_pods("ns", "train") == []
    (sent,) = pool.sent
    assert client.hosts == ["https://127.0.0.1:6443"]
    assert sent["method"] == "GET"
    selector = quote(f"{LABEL_JOB_NAME}=train,{LABEL_MANAGED_BY}={MANAGED_BY}")  # as the generated client quotes
    assert sent["url"] == f"/api/v1/namespaces/ns/pods?labelSelector={selector}"
    assert "%3D" in selector and "%2C" in selector
    assert sent["headers"]["User-Agent"] == "test" and sent["headers"]["Authorization"] == "Bearer token-1"
    assert sent["preload_content"] is False
    api.create({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "train-0", "namespace": "ns"}})
    assert json.loads(pool.sent[1]["body"])["metadata"]["name"] == "train-0"


def test_the_credentials_are_read_again_only_after_auth_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(kube.time, "monotonic", lambda: now[0])
    pool = Pool()
    client = Client(pool)
    api = Kube(client)
    for _ in range(3):
        api.get("/api/v1/namespaces/ns")
    now[0] += kube.AUTH_SECONDS
    api.get("/api/v1/namespaces/ns")
    assert client.asked == 2
    assert [s["headers"]["Authorization"] for s in pool.sent] == ["Bearer token-1"] * 3 + ["Bearer token-2"]


def test_no_answer_from_the_apiserver_is_unreachable() -> None:
    pool = Pool()
    pool.fail = True
    with pytest.raises(Unreachable, match="the apiserver did not answer"):
        Kube(Client(pool)).get("/api/v1/namespaces/ns")


class Existing(Pool):
    """Answers a create with 409 once ``taken``."""

    taken = False

    def urlopen(self, method: str, url: str, **kw: Any) -> Answer:
        answer = super().urlopen(method, url, **kw)
        if self.taken:
            return Answer(409, b'{"kind": "Status", "message": "already exists"}')
        return answer


def test_a_create_says_only_whether_it_created_and_a_pods_create_answers_the_pod() -> None:
    pool = Existing()
    api = Kube(Client(pool))
    pod = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "train-0", "namespace": "ns"}}
    service = {"kind": "Service", "apiVersion": "v1", "metadata": {"name": "train", "namespace": "ns"}}
    assert api.create(service) is True
    assert api.create_pod(pod) == {"kind": "Pod"}, "the pod cache takes the pod as created"
    pool.taken = True
    assert api.create(service) is False and api.create_pod(pod) is None, "409: it existed already"
    assert [s["url"] for s in pool.sent] == ["/api/v1/namespaces/ns/services", "/api/v1/namespaces/ns/pods"] * 2


def test_each_request_is_counted_by_verb_resource_and_code() -> None:
    pool = Existing()
    api = Kube(Client(pool))
    counted = metrics.api_request("POST", "services", 409)
    before = counted._value.get()
    pool.taken = True
    api.create({"kind": "Service", "apiVersion": "v1", "metadata": {"name": "train", "namespace": "ns"}})
    assert counted._value.get() == before + 1
    assert metrics.api_request("POST", "services", 409) is counted, "the labelled child is looked up once"


def test_a_replica_names_itself_in_every_request_so_the_audit_log_tells_the_replicas_apart() -> None:
    pool = Pool()
    Kube(Client(pool), user_agent=user_agent("ddpjob-7f9c-abcde")).list_pods("ns", "train")
    Kube(Client(pool)).list_pods("ns", "train")
    assert [sent["headers"]["User-Agent"] for sent in pool.sent] == ["ddpjob-operator/ddpjob-7f9c-abcde", "test"]
