"""`ddpjob operator`: flags map onto Kopf's run() (scope, liveness, metrics port)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddpjob_operator import cli
from tests.unit.test_import_graph import imported


@pytest.fixture
def kopf_run(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import kopf

    seen: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kw: seen.update(kw))
    monkeypatch.setattr(kopf, "configure", lambda **kw: None)
    return seen


@pytest.mark.parametrize(
    ("argv", "clusterwide", "namespaces"),
    [
        (["operator"], True, []),
        (["operator", "-A"], True, []),
        (["run", "-n", "team-a", "--namespace", "ml-*"], False, ["team-a", "ml-*"]),
    ],
)
def test_the_scope_is_a_list_of_namespaces_or_all(
    kopf_run: dict[str, Any], argv: list[str], clusterwide: bool, namespaces: list[str]
) -> None:
    assert cli.main(argv) == 0
    assert (kopf_run["clusterwide"], list(kopf_run["namespaces"])) == (clusterwide, namespaces)
    assert kopf_run["standalone"] is True


def test_the_number_of_reconcile_workers_is_a_flag_with_a_default(kopf_run: dict[str, Any]) -> None:
    cli.main(["operator"])
    assert kopf_run["memo"]["workers"] == 16
    cli.main(["operator", "--workers", "64"])
    assert kopf_run["memo"]["workers"] == 64


def test_metrics_and_liveness_can_be_moved_or_turned_off(kopf_run: dict[str, Any]) -> None:
    cli.main(["operator", "--metrics-port", "0", "--liveness", ""])
    assert kopf_run["liveness_endpoint"] is None and kopf_run["memo"]["metrics_port"] == 0
    cli.main(["operator", "--metrics-port", "9999", "--liveness", "http://0.0.0.0:1/healthz"])
    assert kopf_run["liveness_endpoint"] == "http://0.0.0.0:1/healthz" and kopf_run["memo"]["metrics_port"] == 9999


def test_namespaces_and_all_namespaces_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["operator", "-A", "-n", "x"])
    assert "not allowed with" in capsys.readouterr().err


def test_a_subcommand_is_one_entry_in_the_table() -> None:
    assert {"operator", "run"} <= set(cli.COMMANDS)


def test_progress_polling_is_bounded_by_flags(kopf_run: dict[str, Any]) -> None:
    cli.main(["operator", "--progress-interval", "5", "--progress-timeout", "1", "--progress-concurrency", "8"])
    memo = kopf_run["memo"]
    assert (memo["progress_interval"], memo["progress_timeout"], memo["progress_concurrency"]) == (5, 1, 8)


def test_report_is_a_subcommand() -> None:
    assert "report" in cli.COMMANDS


def test_the_operator_command_runs_with_neither_the_box_nor_the_trainer_installed() -> None:
    """As in the operator's image, which deletes ddpjob_box and has no ddp_trainer."""
    hide = "import sys; sys.modules['ddpjob_box'] = None; sys.modules['ddp_trainer'] = None"
    run = "from ddpjob_operator.cli import main; sys.exit(main(['operator', '--help']))"
    done = subprocess.run([sys.executable, "-c", f"{hide}; {run}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--namespace" in done.stdout


OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "ddpjob_operator"


@pytest.mark.parametrize("path", sorted(OPERATOR.rglob("*.py")), ids=lambda p: str(p.relative_to(OPERATOR)))
def test_no_operator_module_imports_the_trainer_or_the_box(path: Path) -> None:
    """The shared names come from ddpjob_contract; `ddpjob cluster` (ddpjob_cli) loads the box, not the operator."""
    anywhere = set(imported(path))
    assert not {m for m in anywhere if m.split(".")[0] in ("ddp_trainer", "ddpjob_box", "ddpjob_cli")}


def test_ddpjob_is_the_operators_commands_and_the_box_s_cluster() -> None:
    import ddpjob_cli

    assert set(ddpjob_cli.COMMANDS) == {"cluster", *cli.COMMANDS}
