"""A real Prometheus on loopback, finding the training pods through the apiserver.

It is built from its Go module (``tools/box``, with only the kubernetes service discovery):
Debian's package leaves ``kubernetes_sd_configs`` out.

Discovery is ``kubernetes_sd_configs`` (role pod) with the relabelling of the chart's PodMonitor: the
training pods (``app.kubernetes.io/managed-by: ddpjob`` with a ``ddpjob.dev/job-name``), the container
port named ``metrics``, and the labels ``ddpjob``, ``rank`` and ``attempt`` from the pod's labels, plus
the ``namespace``, ``pod`` and ``container`` labels the Prometheus Operator adds. The operator's own
metrics come through its metrics Service's endpoints, as the chart's ServiceMonitor has them.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ddpjob_box import toolchain
from ddpjob_box.ports import free_port
from ddpjob_box.processes import Component, wait_until
from ddpjob_contract import pods

SCRAPE_SECONDS = 2


def _meta(label: str, role: str = "pod") -> str:
    """Prometheus' name for a pod's (or a service's) label in kubernetes discovery."""
    return f"__meta_kubernetes_{role}_label_" + "".join(c if c.isalnum() else "_" for c in label)


def _copy(source: str, target: str) -> dict[str, Any]:
    return {"source_labels": [source], "target_label": target}


def _keep(source: str, regex: str) -> dict[str, Any]:
    return {"source_labels": [source], "regex": regex, "action": "keep"}


def relabel_configs() -> list[dict[str, Any]]:
    """The chart's PodMonitor, as plain Prometheus relabelling."""
    return [
        _keep(_meta(pods.LABEL_MANAGED_BY), pods.MANAGED_BY),
        _keep(_meta(pods.LABEL_JOB_NAME), ".+"),
        _keep("__meta_kubernetes_pod_container_port_name", "metrics"),
        _copy("__meta_kubernetes_namespace", "namespace"),
        _copy("__meta_kubernetes_pod_name", "pod"),
        _copy("__meta_kubernetes_pod_container_name", "container"),
        _copy(_meta(pods.LABEL_JOB_NAME), "ddpjob"),
        _copy(_meta(pods.LABEL_RANK), "rank"),
        _copy(_meta(pods.LABEL_ATTEMPT), "attempt"),
    ]


def operator_relabel_configs() -> list[dict[str, Any]]:
    """The chart's ServiceMonitor: the endpoints of the operator's metrics Service, port ``metrics``."""
    return [
        _keep(_meta("app.kubernetes.io/name", "service"), "ddpjob"),
        _keep(_meta("app.kubernetes.io/component", "service"), "metrics"),
        _keep("__meta_kubernetes_endpoint_port_name", "metrics"),
        _copy("__meta_kubernetes_namespace", "namespace"),
        _copy("__meta_kubernetes_pod_name", "pod"),
        _copy("__meta_kubernetes_service_name", "service"),
    ]


def config_text(kubeconfig: Path) -> str:
    return json.dumps(
        {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
            "scrape_configs": [
                {
                    "job_name": "ddpjob-pods",
                    "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig)}],
                    "relabel_configs": relabel_configs(),
                },
                {
                    "job_name": "ddpjob-operator",
                    "kubernetes_sd_configs": [{"role": "endpoints", "kubeconfig_file": str(kubeconfig)}],
                    "relabel_configs": operator_relabel_configs(),
                },
            ],
        },
        indent=1,
    )


class Prometheus:
    def __init__(self, data_dir: Path, kubeconfig: Path):
        self.data_dir = data_dir
        self.kubeconfig = kubeconfig
        self.port = 0
        self.component: Component | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = toolchain.ensure(toolchain.prometheus_build())["prometheus"]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "prometheus.yml"
        config.write_text(config_text(self.kubeconfig))  # JSON is YAML
        self.port = free_port()
        self.component = Component(
            "prometheus",
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            self.data_dir / "prometheus.log",
        )
        self.component.start()
        wait_until("prometheus /-/ready", lambda: _ok(f"{self.url}/-/ready"), 60, watch=[self.component])

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        return list(body["data"]["result"])

    def stop(self) -> None:
        if self.component:
            self.component.stop()


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
