"""The only module that talks to the API server.

Plain JSON in and out (no client models: templates pass through untouched, whatever fields they
use). Creates are create-if-absent (409 counts as done), deletes are idempotent (404 counts as
done) and guarded by the pod's uid, and the status is replaced with the resourceVersion read, so
a stale write fails instead of overwriting a newer one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ddpjob_operator import api


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Conflict(KubeError):
    """The object changed since we read it (or already exists)."""


def _client_from_environment(connections: int) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    # One keep-alive connection per thread that calls us; urllib3 discards (and reopens) any beyond it.
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


class Kube:
    """``connections``: how many threads may call at once without reopening connections."""

    def __init__(self, api_client: Any | None = None, *, timeout: float = 30.0, connections: int = 4) -> None:
        self._api = api_client if api_client is not None else _client_from_environment(connections)
        self._timeout = timeout

    def close(self) -> None:
        self._api.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        m, url, h, b, _ = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(m, url, header_params=h, body=b, _request_timeout=self._timeout)
        raw = response.read()
        data = json.loads(raw) if raw else None
        if 200 <= response.status < 300:
            return data
        message = data.get("message", "") if isinstance(data, Mapping) else str(raw)[:500]
        if response.status == 409:
            raise Conflict(response.status, message)
        raise KubeError(response.status, message)

    # DDPJobs

    def _job_path(self, namespace: str, name: str = "") -> str:
        base = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{quote(namespace)}/{api.PLURAL}"
        return f"{base}/{quote(name)}" if name else base

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self._request("GET", self._job_path(namespace, name)))
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    def replace_job_status(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the status subresource; the body's resourceVersion makes a stale write a Conflict."""
        meta = job["metadata"]
        return dict(self._request("PUT", self._job_path(meta["namespace"], meta["name"]) + "/status", body=job))

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                "preconditions": {"uid": uid}}  # fmt: skip
        self._delete(self._job_path(namespace, name), body)

    # Pods and Services

    def list_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        selector = f"{api.LABEL_JOB_NAME}={job_name},{api.LABEL_MANAGED_BY}={api.MANAGED_BY}"
        data = self._request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods", query=[("labelSelector", selector)])
        return list(data.get("items") or [])

    def create(self, obj: Mapping[str, Any]) -> bool:
        """Create if absent: True when created, False when it already existed."""
        plural = {"Pod": "pods", "Service": "services", "Event": "events"}[obj["kind"]]
        try:
            self._request("POST", f"/api/v1/namespaces/{quote(obj['metadata']['namespace'])}/{plural}", body=obj)
        except Conflict:
            return False
        return True

    def delete_pod(self, namespace: str, name: str, uid: str = "") -> None:
        """Delete if present; with ``uid``, only that incarnation of the name (never a newer pod)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        self._delete(f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}", body)

    def _delete(self, path: str, body: dict[str, Any]) -> None:
        try:
            self._request("DELETE", path, body=body)
        except KubeError as err:
            if err.status not in (404, 409):  # gone already, or a newer incarnation (uid precondition)
                raise
