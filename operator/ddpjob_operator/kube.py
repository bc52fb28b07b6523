"""The only module that talks to the API server.

Plain JSON in and out (no client models: templates pass through untouched, whatever fields they
use), encoded and decoded by orjson: with the standard library's json, decoding the answers and the
watches' events was 10-18% of the operator's CPU (``bench.peer_operator --profile``). Creates are
create-if-absent (409 counts as done), deletes are idempotent (404 counts as done) and guarded by the
pod's uid, and the status is replaced with the resourceVersion read, so a stale write fails instead
of overwriting a newer one.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn, Protocol
from urllib.parse import quote

import orjson
import urllib3

from ddpjob_contract import kueue
from ddpjob_contract.pods import LABEL_ATTEMPT, LABEL_JOB_NAME, LABEL_MANAGED_BY, MANAGED_BY, POD_GROUP_API
from ddpjob_operator import api, metrics

log = logging.getLogger("ddpjob_operator")


class KubeError(Exception):
    """``reason``: the Status object's machine-readable reason (``AlreadyExists``...), where it said one."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.reason = status, message, reason


class Conflict(KubeError):
    """The object changed since we read it (or already exists)."""


class Expired(KubeError):
    """A watch's resourceVersion is too old (410 Gone): list again."""


class Unreachable(KubeError):
    """No answer: the apiserver is down or restarting (connection refused or reset, after urllib3's retries),
    or, where said, an answer that it is not ready yet (5xx, 429)."""


class NotServed(KubeError):
    """404 for a whole API: the apiserver does not serve that group or version (its CRD is not installed)."""


USER_AGENT = "ddpjob-operator"
"""The operator's requests name it so (with its replica's identity under leader election: ``user_agent``)."""


def user_agent(identity: str) -> str:
    return f"{USER_AGENT}/{identity}" if identity else USER_AGENT


class Fenced(KubeError):
    """A write refused before it was sent: this replica does not hold the leader Lease (``leadership``)."""

    def __init__(self, identity: str) -> None:
        super().__init__(0, f"{identity} is not the leader: the write was not sent")


class Fence(Protocol):
    """What every write asks first, as it is issued (``leadership.Elector``)."""

    def check(self) -> None:
        """Raise ``Fenced`` unless this replica may write now."""
        ...


class Unfenced:
    """No election: every write may go."""

    def check(self) -> None:
        pass


UNFENCED = Unfenced()


class NamespaceTerminating(KubeError):
    """A create refused (403) because the namespace is being deleted: nothing in it is to be made."""


def in_cluster() -> bool:
    """Whether to use the pod's service account: in a pod, unless KUBECONFIG says otherwise.

    The one choice of credentials, for our client and Kopf's (``handlers.login``).
    """
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.environ.get("KUBECONFIG")


def _client_from_environment(connections: int) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    if in_cluster():
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    # One keep-alive connection per thread that calls us; urllib3 discards (and reopens) any beyond it.
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


AUTH_SECONDS = 10.0
"""How long the credentials read from the client's configuration are reused. Its refresh hook (a kubeconfig read
again, a service account's rotated token) ran on every request; tokens live for minutes to hours."""


_IN_PLACE_PROBE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "ddpjob-in-place-probe"},
    "spec": {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "probe", "image": "registry.invalid/probe", "restartPolicy": "Never",
            "restartPolicyRules": [
                {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [200]}},
            ],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}, "limits": {"cpu": "1m", "memory": "1Mi"}},
        }],
    },
}  # fmt: skip
"""A dry-run pod (never created) that only a cluster without in-place restarts changes: ``restarts_in_place``."""


class Kube:
    """``connections``: how many threads may call at once without reopening connections.

    Requests go straight to the client's connection pool for the apiserver (its TLS, retries and size as the
    client configured them): the generated client's layers (param_serialize reading ``configuration.host``,
    which scans the environment for proxies, a walk of every body to sanitize it, a pool looked up by key)
    cost more CPU than the request itself, and our bodies are plain JSON already.
    """

    def __init__(self, api_client: Any | None = None, *, timeout: float = 30.0, connections: int = 4,
                 fence: Fence = UNFENCED, user_agent: str = "") -> None:  # fmt: skip
        """``user_agent``: what the apiserver's audit log names this client by (``USER_AGENT``, and the replica)."""
        self._api = api_client if api_client is not None else _client_from_environment(connections)
        self._agent = {"User-Agent": user_agent} if user_agent else {}
        self._fence = fence
        self._timeout = timeout
        self._in_place: bool | None = None
        self._pool = self._api.rest_client.pool_manager.connection_from_url(str(self._api.configuration.host))
        self._auth: dict[str, str] = {}
        self._auth_until = 0.0

    def close(self) -> None:
        self._api.close()

    def _credentials(self) -> dict[str, str]:
        now = time.monotonic()
        if now >= self._auth_until:
            auth: dict[str, str] = {}
            self._api.update_params_for_auth(auth, [], ["BearerToken"], "", "", None)
            self._auth, self._auth_until = auth, now + AUTH_SECONDS
        return self._auth

    def _call(self, method: str, path: str, body: Any, query: list[tuple[str, str]] | None, content_type: str,
              timeout: float | tuple[float, float]) -> Any:  # fmt: skip
        headers = {**self._api.default_headers, **self._agent, **self._credentials(), "Accept": "application/json",
                   "Content-Type": content_type}  # fmt: skip
        url = path
        if query:
            url += "?" + "&".join(f"{k}={quote(str(v))}" for k, v in query)  # as the generated client encodes them
        limit = (urllib3.Timeout(total=timeout) if isinstance(timeout, int | float)
                 else urllib3.Timeout(connect=timeout[0], read=timeout[1]))  # fmt: skip
        data = None if body is None else orjson.dumps(body)
        if method != "GET":
            self._fence.check()  # a write passes the fence as late as it can: as it is sent
        try:
            return self._pool.urlopen(method, url, body=data, headers=headers, timeout=limit, preload_content=False)
        except urllib3.exceptions.HTTPError as err:
            reason = getattr(err, "reason", None) or err
            raise Unreachable(0, f"{method} {path}: the apiserver did not answer ({reason})") from None

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        read: bool = True,
    ) -> Any:
        """The answer, decoded (None when empty, or when not ``read``: decoding is most of a request's CPU)."""
        response = self._call(method, path, body, query, content_type, self._timeout)
        metrics.api_request(method, _resource(path), response.status).inc()
        raw = response.data
        if 200 <= response.status < 300:
            return orjson.loads(raw) if raw and read else None
        # An API group the apiserver does not serve answers 404 in plain text ("404 page not found").
        _raise(response.status, orjson.loads(raw) if raw.startswith(b"{") else None, raw)

    # DDPJobs

    def _job_path(self, namespace: str, name: str = "") -> str:
        base = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{quote(namespace)}/{api.PLURAL}"
        return f"{base}/{quote(name)}" if name else base

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job, or None where the apiserver says it does not exist; ``NotServed`` while it does not serve DDPJobs
        (a restarted apiserver before it has read the CRDs answers "404 page not found" for every job): that is no
        answer about the job, and taken as its deletion it left the job unreconciled for good."""
        return self.get(self._job_path(namespace, name), unserved=True)

    def replace_job_status(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the status subresource; the body's resourceVersion makes a stale write a Conflict."""
        meta = job["metadata"]
        return dict(self._request("PUT", self._job_path(meta["namespace"], meta["name"]) + "/status", body=job))

    def get_namespace(self, name: str) -> dict[str, Any] | None:
        return self.get(f"/api/v1/namespaces/{quote(name)}")

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                "preconditions": {"uid": uid}}  # fmt: skip
        self._delete(self._job_path(namespace, name), body)

    # Pods and Services

    def list_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        selector = f"{LABEL_JOB_NAME}={job_name},{_MANAGED}"
        data = self._request("GET", _pods_path(namespace), query=[("labelSelector", selector)])
        return list(data.get("items") or [])

    def list_managed_pods(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        """Every pod with the operator's label in ``namespace`` ("": all), and the list's resourceVersion."""
        data = self._request("GET", _pods_path(namespace), query=[("labelSelector", _MANAGED)])
        return list(data.get("items") or []), str(data["metadata"]["resourceVersion"])

    def watch_managed_pods(self, namespace: str, version: str, seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, pod) for each change after ``version`` until the apiserver ends the watch (``seconds``).

        Raises ``Expired`` when ``version`` is too old to watch from.
        """
        return self._watch(_pods_path(namespace), [("labelSelector", _MANAGED)], version, seconds)

    def list_jobs(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        """Every DDPJob in ``namespace`` ("": all), and the list's resourceVersion."""
        data = self._request("GET", self._jobs_path(namespace))
        return list(data.get("items") or []), str(data["metadata"]["resourceVersion"])

    def watch_jobs(self, namespace: str, version: str, seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, job) for each change after ``version``, as ``watch_managed_pods``."""
        return self._watch(self._jobs_path(namespace), [], version, seconds)

    def _jobs_path(self, namespace: str) -> str:
        return self._job_path(namespace) if namespace else f"/apis/{api.GROUP}/{api.VERSION}/{api.PLURAL}"

    def _watch(self, path: str, query: list[tuple[str, str]], version: str,
               seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:  # fmt: skip
        query = [*query, ("watch", "true"), ("resourceVersion", version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(seconds))]  # fmt: skip
        response = self._call("GET", path, None, query, "application/json", (10.0, seconds + 30.0))
        if not 200 <= response.status < 300:
            raw = response.data
            _raise(response.status, orjson.loads(raw) if raw.startswith(b"{") else None, raw)
        stream = response
        try:
            buffer = b""
            for chunk in stream.stream(65536, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        _raise(int(obj.get("code") or 500), obj, line)
                    yield str(event.get("type")), obj
        finally:
            stream.release_conn()

    def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        """Every node, and the list's resourceVersion."""
        data = self._request("GET", "/api/v1/nodes")
        return list(data.get("items") or []), str(data["metadata"]["resourceVersion"])

    def watch_nodes(self, version: str, seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, node) for each change after ``version``, as ``watch_managed_pods``."""
        return self._watch("/api/v1/nodes", [], version, seconds)

    def create(self, obj: Mapping[str, Any]) -> bool:
        """Create if absent: True when created, False when one of that name already existed.

        The answer (the object as created, managedFields and all) is not decoded: nobody reads it. A pod's is, for
        the pod cache: ``create_pod``.
        """
        return self._create(obj, read=False) is not None

    def create_pod(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create if absent: the pod as created, or None when one of that name already existed."""
        created = self._create(pod, read=True)
        return None if created is None else dict(created)

    def _create(self, obj: Mapping[str, Any], *, read: bool) -> Any:
        """The answer (``{}`` when not ``read``), or None on a 409."""
        plural = {"Pod": "pods", "Service": "services", "Event": "events", "PodGroup": "podgroups",
                  "Workload": "workloads"}[obj["kind"]]  # fmt: skip
        group = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
        try:
            created = self._request("POST", f"{group}/namespaces/{quote(obj['metadata']['namespace'])}/{plural}",
                                    body=obj, read=read)  # fmt: skip
        except Conflict as err:
            if err.reason not in ("AlreadyExists", ""):
                raise  # a 409 that does not say the object exists (a quota's or a webhook's): not done
            return None
        return {} if created is None else created  # a 2xx: created (its answer unread, or empty)

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of a pod; the pod as patched."""
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        return dict(self._request("PATCH", path, body=patch, content_type="application/merge-patch+json"))

    def restarts_in_place(self, namespace: str) -> bool:
        """Whether the cluster keeps a container's restart rule with the RestartAllContainers action (the
        ContainerRestartRules and RestartAllContainersOnContainerExits gates, beta and on from Kubernetes 1.36):
        a server-side dry run, in ``namespace``, of a pod that has one. The rule is dropped where the first gate is
        off, and refused (422) where only the second is. The pod meets Pod Security ``restricted`` and asks for
        little, so admission has no reason to refuse it; a namespace whose admission refuses it anyway (403: a
        quota, a policy) gets no in-place restarts, which the log says once. Asked once per process once it has
        answered; no answer (the apiserver restarting) is asked again."""
        if self._in_place is not None:
            return self._in_place
        path = f"/api/v1/namespaces/{quote(namespace)}/pods"
        try:
            made = self._request("POST", path, body=_IN_PLACE_PROBE, query=[("dryRun", "All")])
        except NamespaceTerminating:
            raise
        except KubeError as err:
            if err.status not in (403, 422):
                raise
            log.info("in-place restarts: off (a dry-run pod with a RestartAllContainers rule was refused in %s: %s)",
                     namespace, err.message)  # fmt: skip
            self._in_place = False
            return False
        rules = (((made or {}).get("spec") or {}).get("containers") or [{}])[0].get("restartPolicyRules") or []
        self._in_place = any(r.get("action") == "RestartAllContainers" for r in rules)
        log.info("in-place restarts: %s", "on (the cluster keeps RestartAllContainers rules)" if self._in_place
                 else "off (the cluster drops RestartAllContainers rules)")  # fmt: skip
        return self._in_place

    # Kueue's Workloads

    def _workload_path(self, namespace: str, name: str = "") -> str:
        """A Workload's path; without ``name`` the Workloads of ``namespace`` ("": all namespaces)."""
        scope = f"/namespaces/{quote(namespace)}" if namespace else ""
        workloads = f"/apis/{kueue.API_VERSION}{scope}/workloads"
        return f"{workloads}/{quote(name)}" if name else workloads

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Workload, or None; ``NotServed`` when Kueue is not installed."""
        return self.get(self._workload_path(namespace, name), unserved=True)

    def get(self, path: str, *, unserved: bool = False) -> dict[str, Any] | None:
        """The object at ``path``, or None where there is none; with ``unserved``, ``NotServed`` where its whole
        API is not served (else that is None too)."""
        try:
            return dict(self._request("GET", path))
        except KubeError as err:
            if err.status != 404 or (unserved and isinstance(err, NotServed)):
                raise
            return None

    def get_kueue_object(self, plural: str, name: str) -> dict[str, Any] | None:
        """A cluster-scoped Kueue object (resourceflavors, workloadpriorityclasses), or None."""
        return self.get(f"/apis/{kueue.API_VERSION}/{plural}/{quote(name)}")

    def apply_workload_status(self, manager: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the Workload's status as ``manager``, forced (as Kueue's own writers do); the
        Workload as written."""
        meta = body["metadata"]
        query = [("fieldManager", manager), ("force", "true")]
        path = self._workload_path(meta["namespace"], meta["name"]) + "/status"
        written = self._request("PATCH", path, body=body, query=query, content_type="application/apply-patch+yaml")
        return dict(written or {})

    def list_workloads(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        """Our Workloads (the operator's label) in ``namespace`` ("": all), and the list's resourceVersion."""
        data = self._request("GET", self._workload_path(namespace), query=[("labelSelector", _MANAGED)])
        return list(data.get("items") or []), str(data["metadata"]["resourceVersion"])

    def watch_workloads(self, namespace: str, version: str, seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, Workload) for each change after ``version``, as ``watch_managed_pods``."""
        return self._watch(self._workload_path(namespace), [("labelSelector", _MANAGED)], version, seconds)

    def release_workload(self, namespace: str, name: str, tries: int = 5) -> None:
        """Drop Kueue's resource-in-use finalizer (gone already: done). The patch names the resourceVersion read, so
        it never drops another's finalizer; a Workload changed meanwhile (the garbage collector marking it deleted,
        Kueue writing its status: 409, seen in the chaos soak) is read again."""
        path = self._workload_path(namespace, name)
        for _ in range(tries):
            found = self.get(path)
            finalizers = list(((found or {}).get("metadata") or {}).get("finalizers") or [])
            if found is None or kueue.FINALIZER not in finalizers:
                return
            meta = {"finalizers": [f for f in finalizers if f != kueue.FINALIZER],
                    "resourceVersion": found["metadata"]["resourceVersion"]}  # fmt: skip
            try:
                self._request("PATCH", path, body={"metadata": meta}, content_type="application/merge-patch+json")
                return
            except Conflict:
                continue
            except KubeError as err:
                if err.status != 404:
                    raise
                return
        raise Conflict(409, f"workload {namespace}/{name} kept changing while its finalizer was dropped")

    # The leader Lease (``leadership``; its Kube is unfenced)

    def _lease_path(self, namespace: str, name: str = "") -> str:
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
        return f"{leases}/{quote(name)}" if name else leases

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(self._lease_path(namespace, name))

    def create_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        """Create it; ``Conflict`` when another replica created it first."""
        return dict(self._request("POST", self._lease_path(lease["metadata"]["namespace"]), body=lease))

    def replace_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        """Write it with the resourceVersion it names; ``Conflict`` when it changed since."""
        meta = lease["metadata"]
        return dict(self._request("PUT", self._lease_path(meta["namespace"], meta["name"]), body=lease))

    # PodGroups (gang scheduling)

    def serves(self, api_version: str, plural: str) -> bool:
        """Whether discovery lists ``plural`` in ``api_version`` (``group/version``), in the group list first, as
        Kopf looks it up. Unreachable while the apiserver answers but cannot say yet (5xx, 429: a restarted
        apiserver answers 503 for custom resources until it has read their CRDs)."""
        group, version = api_version.split("/")
        try:
            groups = self._request("GET", "/apis")
            listed = any(
                g.get("name") == group and any(v.get("version") == version for v in g.get("versions") or [])
                for g in (groups or {}).get("groups") or []
            )
            found = self._request("GET", f"/apis/{api_version}") if listed else {}
        except KubeError as err:
            if err.status == 404:
                return False
            if err.status == 429 or err.status >= 500:
                raise Unreachable(err.status, f"discovery of {api_version}: {err.message}") from None
            raise
        return any(r.get("name") == plural for r in (found or {}).get("resources") or [])

    def serves_pod_groups(self) -> bool:
        """Whether the apiserver serves PodGroups at POD_GROUP_API (Kubernetes 1.37+, GenericWorkload on)."""
        return self.serves(POD_GROUP_API, "podgroups")

    def delete_pod_groups(self, namespace: str, job_name: str, keep_attempt: int) -> None:
        """Delete the job's PodGroups of every attempt but ``keep_attempt`` (one request)."""
        selector = f"{LABEL_JOB_NAME}={job_name},{_MANAGED},{LABEL_ATTEMPT}!={keep_attempt}"
        path = f"/apis/{POD_GROUP_API}/namespaces/{quote(namespace)}/podgroups"
        self._request("DELETE", path, query=[("labelSelector", selector)])

    def delete_pod(self, namespace: str, name: str, uid: str = "", *, force: bool = False) -> None:
        """Delete if present; with ``uid``, only that incarnation of the name (never a newer pod). ``force``: with no
        grace period, the object gone at once (only for a pod on a lost node: ``policies.node_loss``)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if force:
            body["gracePeriodSeconds"] = 0
        self._delete(f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}", body)

    def _delete(self, path: str, body: dict[str, Any]) -> None:
        try:
            self._request("DELETE", path, body=body)
        except KubeError as err:
            if err.status not in (404, 409):  # gone already, or a newer incarnation (uid precondition)
                raise


_MANAGED = f"{LABEL_MANAGED_BY}={MANAGED_BY}"


def _pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/pods" if namespace else "/api/v1/pods"


def _resource(path: str) -> str:
    """The resource a path names: ``pods``, ``ddpjobs/status``, ``namespaces``..."""
    parts = path.strip("/").split("/")
    parts = parts[2:] if parts[0] == "api" else parts[3:]
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    return "/".join(parts[:1] + parts[2:3])


def _causes(data: Any) -> set[str]:
    details = data.get("details") if isinstance(data, Mapping) else None
    return {str(c.get("reason")) for c in (details or {}).get("causes") or [] if isinstance(c, Mapping)}


def _raise(status: int, data: Any, raw: bytes) -> NoReturn:
    message = data.get("message", "") if isinstance(data, Mapping) else raw.decode(errors="replace").strip()[:500]
    reason = str(data.get("reason") or "") if isinstance(data, Mapping) else ""
    if status == 404 and data is None:
        raise NotServed(status, message)
    if status == 403 and "NamespaceTerminating" in _causes(data):
        raise NamespaceTerminating(status, message, reason)
    if status == 409:
        raise Conflict(status, message, reason)
    if status == 410:
        raise Expired(status, message, reason)
    raise KubeError(status, message, reason)
