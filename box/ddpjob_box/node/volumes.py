"""Pod volumes as directories on the node.

emptyDir is per pod; a PersistentVolumeClaim resolves through its bound
PersistentVolume to a hostPath directory, shared by every pod that mounts the
claim; configMap, secret, downwardAPI and projected volumes (the service-account
token among them) are written as files.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ddpjob_box.node.podspec import ConfigLookup, field_value

TOKEN_SECONDS = 3600


class TokenMinter(Protocol):
    def __call__(
        self, namespace: str, service_account: str, audiences: list[str], seconds: int, pod: Mapping[str, Any]
    ) -> str: ...


class VolumeNotReady(Exception):
    """A volume's source is not there yet (an unbound claim, say); the pod waits."""


def _write_items(target: Path, data: Mapping[str, str], items: list[dict[str, Any]] | None) -> None:
    target.mkdir(parents=True, exist_ok=True)
    selected = [(i["key"], i.get("path", i["key"])) for i in items] if items else [(k, k) for k in data]
    for key, path in selected:
        if key in data:
            dest = target / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(data[key])


def prepare(
    pod: Mapping[str, Any],
    pod_dir: Path,
    *,
    lookup: ConfigLookup,
    mint_token: TokenMinter,
    claim_path: Any,
) -> dict[str, Path]:
    """Make every volume of the pod; return volume name -> host directory (or file)."""
    ns = pod["metadata"]["namespace"]
    paths: dict[str, Path] = {}
    for volume in pod.get("spec", {}).get("volumes", []):
        name = volume["name"]
        target = pod_dir / "volumes" / name
        if "emptyDir" in volume:
            target.mkdir(parents=True, exist_ok=True)
        elif "persistentVolumeClaim" in volume:
            target = claim_path(ns, volume["persistentVolumeClaim"]["claimName"])
        elif "hostPath" in volume:
            target = Path(volume["hostPath"]["path"])
        elif "configMap" in volume or "secret" in volume:
            kind = "configMap" if "configMap" in volume else "secret"
            ref = volume[kind]
            source_name = ref.get("name") or ref.get("secretName", "")
            _write_items(target, lookup(kind, source_name) or {}, ref.get("items"))
        elif "downwardAPI" in volume:
            _write_downward(target, pod, volume["downwardAPI"].get("items", []))
        elif "projected" in volume:
            target.mkdir(parents=True, exist_ok=True)
            for source in volume["projected"].get("sources", []):
                if "serviceAccountToken" in source:
                    spec = source["serviceAccountToken"]
                    token = mint_token(
                        ns,
                        pod["spec"].get("serviceAccountName", "default"),
                        [spec["audience"]] if spec.get("audience") else [],
                        int(spec.get("expirationSeconds", TOKEN_SECONDS)),
                        pod,
                    )
                    (target / spec["path"]).write_text(token)
                for kind in ("configMap", "secret"):
                    if kind in source:
                        ref = source[kind]
                        _write_items(target, lookup(kind, ref["name"]) or {}, ref.get("items"))
                if "downwardAPI" in source:
                    _write_downward(target, pod, source["downwardAPI"].get("items", []))
        else:
            target.mkdir(parents=True, exist_ok=True)  # unknown kinds get an empty directory
        paths[name] = target
    return paths


def _write_downward(target: Path, pod: Mapping[str, Any], items: list[dict[str, Any]]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for item in items:
        if "fieldRef" in item:
            (target / item["path"]).write_text(field_value(pod, item["fieldRef"]["fieldPath"]))


def decode_secret(data: Mapping[str, str] | None) -> dict[str, str]:
    return {k: base64.b64decode(v).decode(errors="replace") for k, v in (data or {}).items()}


class MountPoints:
    """The directories the node made on the host for mount points, shared by every pod that mounts there.

    They are removed only once no running pod mounts at or below them, so one pod ending never pulls
    a mount point from under another that is still starting. The list survives agent restarts.
    """

    def __init__(self, path: Path):
        self.path = path
        self.made: list[str] = json.loads(path.read_text()) if path.exists() else []

    def make(self, target: Path) -> None:
        missing = []
        current = target
        while not current.exists():
            missing.append(current)
            current = current.parent
        for directory in reversed(missing):
            directory.mkdir(exist_ok=True)
            if str(directory) not in self.made:
                self.made.append(str(directory))
        self._save()

    def sweep(self, in_use: list[str]) -> None:
        kept = []
        for directory in sorted(self.made, key=len, reverse=True):
            used = any(t == directory or t.startswith(directory.rstrip("/") + "/") for t in in_use)
            if not used:
                try:
                    os.rmdir(directory)
                except FileNotFoundError:
                    pass
                except OSError:
                    used = True  # not empty: something else put files there; leave it
            if used:
                kept.append(directory)
        self.made = kept
        self._save()

    def _save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.made))
        os.replace(tmp, self.path)
