"""What each make target's setup runs, and in which order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpjob_box.prepare import DEMO_EXTRAS, NODES_SIDE_BY_SIDE, split_command, steps_for
from tests import workers


def names(purpose: str) -> list[str]:
    return [step.name for step in steps_for(purpose, python="python3")]


def test_the_demo_builds_no_kueue_and_the_tests_also_lint() -> None:
    demo_go = next(s for s in steps_for("demo", python="python3") if s.name == "Go builds")
    test_go = next(s for s in steps_for("test", python="python3") if s.name == "Go builds")
    assert list(demo_go.argv[-2:]) == ["--for", "demo"]
    assert list(test_go.argv[-2:]) == ["--for", "test"]
    assert names("demo") == ["venv", "Debian packages", "Go builds", "images", "node stores"]
    assert names("setup") == ["venv", "Debian packages", "Go builds", "images", "node stores"]
    assert names("test") == ["venv", "Debian packages", "Go builds", "images", "node stores", "lint"]
    assert names("tools") == ["Go builds"]


def test_the_images_wait_for_the_debian_packages_the_lint_for_the_venv_and_apt_is_never_stopped() -> None:
    steps = {step.name: step for step in steps_for("test", python="python3")}
    assert steps["images"].after == ("Debian packages",)
    assert steps["lint"].after == ("venv",)
    assert steps["node stores"].after == ("images",)
    assert steps["Go builds"].after == ()
    assert not steps["Debian packages"].stoppable


def test_an_unknown_purpose_is_refused() -> None:
    with pytest.raises(ValueError, match="choose one of"):
        steps_for("bench", python="python3")


def test_the_command_after_the_setup_follows_a_double_dash() -> None:
    assert split_command(["demo", "--", ".venv/bin/python", "-m", "pytest", "-k", "x"]) == (
        ["demo"],
        [".venv/bin/python", "-m", "pytest", "-k", "x"],
    )
    assert split_command(["setup"]) == (["setup"], [])


def test_the_setup_fills_a_node_store_for_each_node_its_command_runs_at_once() -> None:
    def stores(purpose: str) -> str:
        step = next(s for s in steps_for(purpose, python="python3") if s.name == "node stores")
        return str(step.argv[step.argv.index("--stores") + 1])

    assert (stores("demo"), stores("test"), stores("setup")) == ("1", "9", "9")
    assert NODES_SIDE_BY_SIDE["test"] == sum(workers.NODES.values()), "make test's box groups' nodes, all at once"


def test_every_python_step_imports_with_the_standard_library_alone() -> None:
    """The setup runs its steps on the system's python3 with PYTHONPATH=box, before (or beside) the venv: a step
    that imports the project's other packages fails on a fresh machine (the store fill's first version did)."""
    root = Path(__file__).resolve().parents[2]
    modules = [s.argv[2] for s in steps_for("test", python=sys.executable) if list(s.argv[1:2]) == ["-m"]]
    assert "ddpjob_box.kubenode.store_fill" in modules
    for module in modules:
        # -S: no site-packages, so neither the venv's packages nor the project's installed ones are found
        proc = subprocess.run(
            [sys.executable, "-S", "-c", f"import {module}"],
            cwd=root,
            env={"PYTHONPATH": str(root / "box"), "PATH": os.environ.get("PATH", "")},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, f"{module}: {proc.stderr.strip().splitlines()[-1:]}"


def test_the_demo_venv_holds_the_operator_extra_and_the_demo_imports_nothing_beyond_it() -> None:
    """make demo installs the operator's extra alone on the host (no torch, no test tools): the demo and the box
    it starts must import none of the trainer's or the test tools' packages."""

    def venv(purpose: str) -> list[str]:
        return list(next(s for s in steps_for(purpose, python="python3") if s.name == "venv").argv)

    assert venv("demo")[-2:] == ["venv", f"VENV_EXTRAS={DEMO_EXTRAS}"]
    assert DEMO_EXTRAS == "operator"
    assert not any(a.startswith("VENV_EXTRAS") for a in venv("test") + venv("setup"))
    refused = ["torch", "torchvision", "pytest", "_pytest", "xdist", "hypothesis", "mypy", "grafana_foundation_sdk"]
    probe = (
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {refused!r}:\n"
        "            raise ImportError('not in the demo venv: ' + name)\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "import ddpjob_box.demo, ddpjob_box.box, ddpjob_box.provisioner, kubernetes.client, kubernetes.config\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr.strip().splitlines()[-1:]
