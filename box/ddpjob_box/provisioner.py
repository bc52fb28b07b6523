"""A dynamic provisioner for the box's default StorageClass: each claim gets a hostPath directory.

It follows the external-provisioner contract, as kind's local-path-provisioner does: a
PersistentVolume with a claimRef is created for each pending claim of our class, and
kube-controller-manager's PV controller does the binding. Released volumes and their directories
are removed. A directory is writable by every UID, as local-path's are: the pods run as 10001, and
kubelet applies no fsGroup to hostPath volumes.

Run by the box as its own process: ``python -m ddpjob_box.provisioner KUBECONFIG CLAIMS_DIR``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

STORAGE_CLASS = "box-local"
SHARED_STORAGE_CLASS = "box-shared"
"""ReadWriteMany, for a job's ranks on several nodes to share one claim, as NFS or a CSI filesystem does on a real
cluster: every node of the box is on this host, so every node mounts the same directory."""
CLASSES = (STORAGE_CLASS, SHARED_STORAGE_CLASS)
PROVISIONER = "ddpjob.dev/box-local"


def storage_class(name: str = STORAGE_CLASS) -> dict[str, Any]:
    """``box-local`` is the default class; ``box-shared`` is for ReadWriteMany claims over several nodes."""
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if name == STORAGE_CLASS else {}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name, "annotations": annotations},
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
            "storageClassName": claim.spec.storage_class_name,
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
        if claim.spec.storage_class_name not in CLASSES or claim.spec.volume_name or claim.status.phase != "Pending":
            continue
        path = claims_dir / f"{claim.metadata.namespace}-{claim.metadata.name}-{claim.metadata.uid[:8]}"
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)
        try:
            core.create_persistent_volume(persistent_volume(claim, path))
        except ApiException as err:
            if err.status != 409:
                raise
    for volume in core.list_persistent_volume().items:
        if volume.spec.storage_class_name in CLASSES and volume.status.phase == "Released":
            shutil.rmtree(volume.spec.host_path.path, ignore_errors=True)
            try:
                core.delete_persistent_volume(volume.metadata.name)
            except ApiException as err:
                if err.status != 404:
                    raise


def provision_once(core: client.CoreV1Api, claims_dir: Path) -> str:
    """One pass; what went wrong, in one line ("" if nothing). An apiserver that is restarting (refused
    connections, after urllib3's retries) or a refusal only delays the claims to the next pass: the
    provisioner must outlive them, or every later claim stays Pending (a chaos run's apiserver restart
    killed it)."""
    try:
        provision(core, claims_dir)
    except (ApiException, OSError, urllib3.exceptions.HTTPError) as err:
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return ""


def main(argv: list[str] | None = None) -> None:
    import argparse
    import time

    from kubernetes import config

    parser = argparse.ArgumentParser(prog="python -m ddpjob_box.provisioner")
    parser.add_argument("kubeconfig", type=Path)
    parser.add_argument("claims_dir", type=Path)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    with config.new_client_from_config(config_file=str(args.kubeconfig)) as api:
        core = client.CoreV1Api(api)
        while True:
            said = provision_once(core, args.claims_dir)
            if said:
                print(f"provisioner: {said}", flush=True)
            time.sleep(args.interval)


if __name__ == "__main__":
    main()
