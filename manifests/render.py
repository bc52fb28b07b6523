"""Render manifests/crd.yaml and manifests/operator.yaml from the Helm chart, the one source of both.

    python manifests/render.py           # rewrite them
    python manifests/render.py --check   # exit 1 when they differ from the chart (a test runs this)

operator.yaml is `helm template` with the chart's defaults for release `ddpjob` in namespace
ddpjob-system (namespaced mode: the operator watches ddpjob-system), preceded by that Namespace.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "ddpjob"
OUT = ROOT / "manifests"
RELEASE = "ddpjob"
NAMESPACE = "ddpjob-system"

CRD_HEADER = "# Generated from helm/ddpjob/crds/ by manifests/render.py: edit the chart, then re-render.\n"
OPERATOR_HEADER = f"""\
# Generated from helm/ddpjob by manifests/render.py (the chart's defaults, release {RELEASE!r},
# namespace {NAMESPACE}): edit the chart, then re-render. Apply after crd.yaml:
#   kubectl apply --server-side -f manifests/crd.yaml
#   kubectl apply -f manifests/operator.yaml
# The operator watches {NAMESPACE} only; `helm install` sets other namespaces or cluster-wide mode.
apiVersion: v1
kind: Namespace
metadata:
  name: {NAMESPACE}
  labels:
    pod-security.kubernetes.io/enforce: restricted
"""


def helm() -> str:
    from ddpjob_box import toolchain

    return str(toolchain.ensure(toolchain.helm_build(), quiet=True)["helm"])


def _run(*args: str) -> str:
    proc = subprocess.run([helm(), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"helm {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def render() -> dict[Path, str]:
    """File -> the text it must hold."""
    crds = _run("show", "crds", str(CHART))
    operator = _run("template", RELEASE, str(CHART), "--namespace", NAMESPACE)
    return {OUT / "crd.yaml": CRD_HEADER + crds, OUT / "operator.yaml": OPERATOR_HEADER + operator}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python manifests/render.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs from the chart; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path, text in render().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.write_text(text)
    for path in stale:
        print(f"{path.relative_to(ROOT)} differs from the chart: run python manifests/render.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
