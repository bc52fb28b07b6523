"""The real helm, kubectl and promtool binaries, and the chart rendered into parsed documents."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddpjob_box import toolchain
from tests.e2e.kube import wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "ddpjob"
DASHBOARD = CHART / "dashboards" / "ddpjob.json"
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
# `helm template` knows no cluster: these tell it the Prometheus Operator CRDs exist.
WITH_MONITORING_CRDS = [
    arg for kind in MONITORING_KINDS for arg in ("--api-versions", f"monitoring.coreos.com/v1/{kind}")
]
EVERY_TOGGLE = [
    "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "podMonitor.enabled=true",
    "--set", "prometheusRule.enabled=true",
    "--set", "dashboard.enabled=true",
]  # fmt: skip


def helm_binary() -> str:
    return str(toolchain.ensure(toolchain.helm_build(), quiet=True)["helm"])


def kubectl_binary() -> str:
    return str(toolchain.ensure(toolchain.kubernetes_build(), quiet=True)["kubectl"])


def run(argv: list[str], *, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr.strip()}", pytrace=False)
    return proc


def helm(*args: str, kubeconfig: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    config = [f"--kubeconfig={kubeconfig}"] if kubeconfig else []
    return run([helm_binary(), *args, *config], check=check)


def kubectl(kubeconfig: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run([kubectl_binary(), f"--kubeconfig={kubeconfig}", *args], check=check)


def wait_established(kubeconfig: Path, crd: str, timeout: float = 60) -> None:
    """Wait until ``crd`` is Established. ``kubectl wait --for=condition=Established`` fails at once instead of
    waiting when the CRD is so new that it has no status.conditions yet (kubernetes/kubernetes#66439:
    ".status.conditions accessor error: <nil> is of the type <nil>"), which a first apply meets now and then."""

    def established() -> bool:
        status = json.loads(kubectl(kubeconfig, "get", f"crd/{crd}", "-o", "json").stdout).get("status") or {}
        return any(c["type"] == "Established" and c["status"] == "True" for c in status.get("conditions") or [])

    wait_for(f"crd/{crd} to be Established", established, timeout, interval=0.2)


def promtool() -> str:
    """promtool of the same build as the box's Prometheus (tools/box)."""
    return str(toolchain.ensure(toolchain.promtool_build())["promtool"])


def template(*args: str, release: str = "ddpjob", namespace: str = "ddpjob-system") -> list[dict[str, Any]]:
    """`helm template` of the chart, parsed; extra ``args`` are --set flags and the like."""
    out = helm("template", release, str(CHART), "--namespace", namespace, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(docs: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def label_selector(selector: Mapping[str, Any]) -> str:
    """A LabelSelector object as the string `kubectl -l` and the API's labelSelector take."""
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        op = expr["operator"]
        if op == "Exists":
            parts.append(expr["key"])
        elif op == "DoesNotExist":
            parts.append(f"!{expr['key']}")
        else:
            parts.append(f"{expr['key']} {op.lower()} ({','.join(expr['values'])})")
    return ",".join(parts)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
PROJECT_PREFIXES = ("ddp_", "ddpjob_", "process_")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: every identifier with a project or process prefix."""
    return {name for name in _NAME.findall(_STRING.sub('""', expr)) if name.startswith(PROJECT_PREFIXES)}
