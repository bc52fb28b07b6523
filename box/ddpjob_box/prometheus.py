"""A real Prometheus (Debian's package) on loopback, scraping the pods the local node lists in file_sd."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ddpjob_box import toolchain
from ddpjob_box.ports import free_port
from ddpjob_box.processes import Component, wait_until

SCRAPE_SECONDS = 2


def config_text(targets_file: Path) -> str:
    return json.dumps(
        {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
            "scrape_configs": [
                {
                    "job_name": "ddpjob-pods",
                    "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "5s"}],
                }
            ],
        },
        indent=1,
    )


class Prometheus:
    def __init__(self, data_dir: Path, targets_file: Path):
        self.data_dir = data_dir
        self.targets_file = targets_file
        self.port = 0
        self.component: Component | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = toolchain.find_prometheus()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.targets_file.exists():
            self.targets_file.write_text("[]")
        config = self.data_dir / "prometheus.yml"
        config.write_text(config_text(self.targets_file))  # JSON is YAML
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
