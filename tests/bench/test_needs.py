"""A benchmark run in a virtualenv without the trainer's packages (``make demo``'s) says so and runs nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

WITHOUT_TORCH = textwrap.dedent(
    """
    import sys

    class NoTorch:  # as make demo's virtualenv: no torch, no torchvision
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "torchvision"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTorch())
    import importlib.util
    found = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *a: None if name in ("torch", "torchvision") else found(name, *a)

    from bench.chaos import runner

    def no_box(*args, **kwargs):
        raise RuntimeError("the soak started a box")

    runner.chaos_stack = no_box
    runner.main(["--runs", "1"])
    """
)


def test_the_chaos_soak_without_torch_says_which_make_target_installs_it_and_starts_no_box() -> None:
    """After `make demo`, every run of the soak was reported a VIOLATION (the harness failed importing torch)."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "python -m bench.chaos needs torch and torchvision, which this virtualenv lacks (`make demo` installs only "
        "what the box and the chart need): run `make setup`, which installs them, then run it again"
    ], done.stderr
    assert not done.stdout
