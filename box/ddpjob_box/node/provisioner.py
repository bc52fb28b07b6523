"""A dynamic provisioner for the box's default StorageClass: each claim gets a hostPath directory.

It follows the external-provisioner contract: a PersistentVolume with a claimRef
is created for each pending claim of our class, and kube-controller-manager's
PV controller does the binding. Released volumes and their directories are removed.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

STORAGE_CLASS = "box-local"
PROVISIONER = "ddpjob.dev/box-local"


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def persistent_volume(claim: Any, path: Path) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{claim.metadata.uid}",
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": claim.spec.resources.requests.get("storage", "1Gi")},
            "accessModes": claim.spec.access_modes or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
            "claimRef": {
                "namespace": claim.metadata.namespace,
                "name": claim.metadata.name,
                "uid": claim.metadata.uid,
            },
        },
    }


def provision(core: client.CoreV1Api, claims_dir: Path) -> None:
    for claim in core.list_persistent_volume_claim_for_all_namespaces().items:
        if claim.spec.storage_class_name != STORAGE_CLASS or claim.spec.volume_name or claim.status.phase != "Pending":
            continue
        path = claims_dir / f"{claim.metadata.namespace}-{claim.metadata.name}-{claim.metadata.uid[:8]}"
        path.mkdir(parents=True, exist_ok=True)
        try:
            core.create_persistent_volume(persistent_volume(claim, path))
        except ApiException as err:
            if err.status != 409:
                raise
    for volume in core.list_persistent_volume().items:
        if volume.spec.storage_class_name == STORAGE_CLASS and volume.status.phase == "Released":
            shutil.rmtree(volume.spec.host_path.path, ignore_errors=True)
            try:
                core.delete_persistent_volume(volume.metadata.name)
            except ApiException as err:
                if err.status != 404:
                    raise
