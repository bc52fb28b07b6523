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
