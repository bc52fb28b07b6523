"""Prometheus file_sd targets for the running pods: every container port named ``metrics``.

The labels come from the pod's labels, so Prometheus adds the job name and the
rank to every series; the trainer itself never labels by rank.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# Pod label -> Prometheus label.
LABELS = {
    "ddpjob.dev/job-name": "ddpjob",
    "ddpjob.dev/rank": "rank",
    "ddpjob.dev/attempt": "attempt",
}


def targets(pods: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    groups = []
    for pod in pods:
        ip = pod.get("status", {}).get("podIP")
        meta = pod["metadata"]
        if not ip:
            continue
        for container in pod["spec"]["containers"]:
            for port in container.get("ports", []):
                if port.get("name") != "metrics":
                    continue
                labels = {"namespace": meta["namespace"], "pod": meta["name"], "container": container["name"]}
                for pod_label, prom_label in LABELS.items():
                    if pod_label in meta.get("labels", {}):
                        labels[prom_label] = meta["labels"][pod_label]
                groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": labels})
    return sorted(groups, key=lambda g: g["targets"][0])


def write_targets(path: Path, pods: Iterable[Mapping[str, Any]]) -> None:
    text = json.dumps(targets(pods), indent=1)
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # Prometheus re-reads file_sd files when they change
