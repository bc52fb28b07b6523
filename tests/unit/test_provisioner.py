"""The box's PVC provisioner outlives an apiserver that is restarting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import urllib3

from ddpjob_box.provisioner import provision_once


class DownApiserver:
    def list_persistent_volume_claim_for_all_namespaces(self) -> Any:
        refused = urllib3.exceptions.NewConnectionError(None, "Failed to establish a new connection: refused")  # type: ignore[arg-type]
        raise urllib3.exceptions.MaxRetryError(None, "/api/v1/persistentvolumeclaims", refused)  # type: ignore[arg-type]


def test_a_pass_that_finds_the_apiserver_down_says_so_in_one_line_instead_of_dying(tmp_path: Path) -> None:
    said = provision_once(DownApiserver(), tmp_path)  # type: ignore[arg-type]
    assert "Max retries exceeded" in said and "\n" not in said


class Claims:
    """Two pending claims: one of the shared class, one of a class the box does not provision."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    @staticmethod
    def _claim(name: str, storage_class: str) -> Any:
        from types import SimpleNamespace as NS

        return NS(metadata=NS(name=name, namespace="ns", uid=f"uid-{name}-0000"),
                  spec=NS(storage_class_name=storage_class, volume_name=None, access_modes=["ReadWriteMany"],
                          resources=NS(requests={"storage": "1Gi"})),
                  status=NS(phase="Pending"))  # fmt: skip

    def list_persistent_volume_claim_for_all_namespaces(self) -> Any:
        from types import SimpleNamespace as NS

        return NS(items=[self._claim("shared", "box-shared"), self._claim("other", "nfs-elsewhere")])

    def create_persistent_volume(self, body: dict[str, Any]) -> None:
        self.created.append(body)

    def list_persistent_volume(self) -> Any:
        from types import SimpleNamespace as NS

        return NS(items=[])


def test_a_shared_claim_gets_a_read_write_many_volume_of_its_own_class_every_node_mounts(tmp_path: Path) -> None:
    core = Claims()
    assert provision_once(core, tmp_path) == ""  # type: ignore[arg-type]
    (volume,) = core.created
    assert volume["spec"]["storageClassName"] == "box-shared"
    assert volume["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "nodeAffinity" not in volume["spec"], "every node of the box is on this host: no node is singled out"
