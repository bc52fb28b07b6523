"""Builds the real control-plane binaries from the Go module proxy, cached by version.

The Go modules under tools/ pin every version. The binaries land in
``$DDPJOB_CACHE/bin/<key>-<go.sum digest>/`` (default ``~/.cache/ddpjob``), where
the key names the versions and the digest every dependency's, so a second run
builds nothing and any version bump builds afresh.

Everything the box runs (Kubernetes, etcd, CoreDNS, Prometheus, helm) is built from one module,
tools/box: one set of dependency versions, so the packages they share (client-go, the API types,
gRPC, protobuf: more than half of the source CoreDNS, Prometheus and helm compile) are compiled once
and found in Go's build cache by the next build. Kueue and training-operator, which pin other
Kubernetes libraries, keep modules of their own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpjob_box.errors import BoxError
from ddpjob_box.overlap import stop_like_ctrl_c

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO_ROOT / "tools"
MIN_GO = (1, 26)
TRAINING_OPERATOR_MODULE = "github.com/kubeflow/training-operator"
# the module that builds everything the box runs (the module docstring says why it is one)
BOX_MODULE = "box"


def cache_dir() -> Path:
    return Path(os.environ.get("DDPJOB_CACHE", Path.home() / ".cache" / "ddpjob"))


@dataclass(frozen=True)
class GoBuild:
    """One Go module under tools/ and the commands it builds."""

    module_dir: str
    key: str
    packages: dict[str, str]
    ldflags: str = "-s -w"
    # Go build tags, e.g. to leave out the parts of a command the box does not use
    tags: str = ""

    def bin_dir(self) -> Path:
        """Where its binaries are cached: named by its key and by its module's go.sum, every dependency's
        version, so a bump of any of them builds afresh."""
        go_sum = hashlib.sha256((TOOLS_DIR / self.module_dir / "go.sum").read_bytes()).hexdigest()[:10]
        return cache_dir() / "bin" / f"{self.key}-{go_sum}"


def _required_version(module_dir: str, module: str) -> str:
    text = (TOOLS_DIR / module_dir / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", text, re.MULTILINE)
    if not match:
        raise BoxError(f"tools/{module_dir}/go.mod does not require {module}; restore it from git")
    return match.group(1)


def kubernetes_build() -> GoBuild:
    """The control plane and kubectl."""
    return _kubernetes(
        {
            "etcd": "go.etcd.io/etcd/server/v3",
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        }
    )


def kubernetes_node_build() -> GoBuild:
    """kubelet and kube-proxy: the same module and cache directory, built only when a real node is wanted,
    so starting a control plane never waits for them."""
    return _kubernetes(
        {
            "kubelet": "k8s.io/kubernetes/cmd/kubelet",
            "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
        }
    )


def _kubernetes(packages: dict[str, str]) -> GoBuild:
    k8s = _required_version(BOX_MODULE, "k8s.io/kubernetes")
    etcd = _required_version(BOX_MODULE, "go.etcd.io/etcd/server/v3")
    major, minor = k8s.lstrip("v").split(".")[:2]
    version_pkg = "k8s.io/component-base/version"
    return GoBuild(
        module_dir=BOX_MODULE,
        key=f"k8s-{k8s}-etcd-{etcd}",
        packages=packages,
        # Without these, /version reports v0.0.0 and kubectl warns about skew.
        ldflags=(
            f"-s -w -X {version_pkg}.gitVersion={k8s} -X {version_pkg}.gitMajor={major}"
            f" -X {version_pkg}.gitMinor={minor} -X {version_pkg}.gitTreeState=clean"
        ),
    )


def helm_build() -> GoBuild:
    helm = _required_version(BOX_MODULE, "helm.sh/helm/v3")
    return GoBuild(
        module_dir=BOX_MODULE,
        key=f"helm-{helm}",
        packages={"helm": "helm.sh/helm/v3/cmd/helm"},
        ldflags=f"-s -w -X helm.sh/helm/v3/internal/version.version={helm}",
    )


def coredns_build() -> GoBuild:
    """CoreDNS with the kubernetes plugin, from tools/box/coredns (only the plugins the box's DNS uses)."""
    coredns = _required_version(BOX_MODULE, "github.com/coredns/coredns")
    return GoBuild(
        module_dir=BOX_MODULE,
        key=f"coredns-{coredns}",
        packages={"coredns": "ddpjob.dev/tools/box/coredns"},
    )


def prometheus_build() -> GoBuild:
    """Prometheus with only its kubernetes service discovery (Debian's package leaves that one out)."""
    return _prometheus({"prometheus": "github.com/prometheus/prometheus/cmd/prometheus"})


def promtool_build() -> GoBuild:
    """promtool, which only the chart's alert tests run: the same version and cache directory as Prometheus,
    built for ``make test`` and not for the demo."""
    return _prometheus({"promtool": "github.com/prometheus/prometheus/cmd/promtool"})


def _prometheus(packages: dict[str, str]) -> GoBuild:
    prometheus = _required_version(BOX_MODULE, "github.com/prometheus/prometheus")
    # Module v0.316.0 is Prometheus 3.16.0.
    release = re.sub(r"^v0\.(\d)(\d\d)\.", lambda m: f"{m.group(1)}.{int(m.group(2))}.", prometheus)
    return GoBuild(
        module_dir=BOX_MODULE,
        key=f"prometheus-{prometheus}",
        packages=packages,
        ldflags=f"-s -w -X github.com/prometheus/common/version.Version={release.lstrip('v')}",
        tags="remove_all_sd,enable_kubernetes_sd",
    )


def kueue_version() -> str:
    """The Kueue release tools/kueue/go.mod pins (e.g. v0.17.0)."""
    return _required_version("kueue", "sigs.k8s.io/kueue")


def kueue_build() -> GoBuild:
    """Kueue's manager, for the box's --kueue mode; its chart and CRDs come from the same module
    (kueue_module_dir)."""
    kueue = kueue_version()
    return GoBuild(
        module_dir="kueue",
        key=f"kueue-{kueue}",
        packages={"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
        # What Kueue's own Makefile sets; the manager logs it at start and in its metrics.
        ldflags=f"-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion={kueue}",
    )


def kueue_module_dir() -> Path:
    """Kueue's module source (its chart lives under charts/kueue), downloaded by the Go toolchain into its cache."""
    return go_module_dir("kueue", "sigs.k8s.io/kueue", kueue_version())


def kwok_version() -> str:
    """The KWOK release tools/kwok/go.mod pins (e.g. v0.8.0)."""
    return _required_version("kwok", "sigs.k8s.io/kwok")


def kwok_build() -> GoBuild:
    """KWOK's controller, for the box's simulated nodes (ddpjob_box.kwok)."""
    kwok = kwok_version()
    return GoBuild(
        module_dir="kwok",
        key=f"kwok-{kwok}",
        packages={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
        ldflags="-s -w",
    )


def training_operator_version() -> str:
    """The Kubeflow training-operator release tools/training-operator/go.mod pins (e.g. v1.9.3)."""
    return _required_version("training-operator", TRAINING_OPERATOR_MODULE)


def training_operator_build() -> GoBuild:
    """Kubeflow's training-operator, for bench.peer_operator only: never shipped, not built by ``make tools``.
    Its PyTorchJob CRD comes from the same module (go_module_dir)."""
    version = training_operator_version()
    return GoBuild(
        module_dir="training-operator",
        key=f"training-operator-{version}",
        packages={"training-operator": f"{TRAINING_OPERATOR_MODULE}/cmd/training-operator.v1"},
    )


def go_module_dir(module_dir: str, module: str, version: str) -> Path:
    """A module's source, downloaded by the Go toolchain into its cache (from tools/<module_dir>, whose go.sum
    pins it)."""
    proc = subprocess.run(
        [go_command(), "mod", "download", "-json", f"{module}@{version}"],
        cwd=TOOLS_DIR / module_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    match = re.search(r'"Dir":\s*"([^"]+)"', proc.stdout)
    if proc.returncode != 0 or not match:
        raise BoxError(_explain_go_failure(f"{module}@{version}", proc.stderr or proc.stdout))
    return Path(match.group(1))


def go_command() -> str:
    """The ``go`` on PATH, if it is new enough to build what the box needs."""
    go = shutil.which("go")
    if go is None:
        need = "%d.%d" % MIN_GO  # noqa: UP031
        raise BoxError(
            f"the Go toolchain is missing: install Go >= {need} (apt-get install golang, or go.dev/dl) "
            "and put 'go' on PATH"
        )
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout
    match = re.match(r"go(\d+)\.(\d+)", out.strip())
    if match and (int(match.group(1)), int(match.group(2))) < MIN_GO:
        raise BoxError(f"{out.strip()} is too old to build Kubernetes: install Go >= %d.%d" % MIN_GO)
    return go


def _explain_go_failure(name: str, stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "no output"
    download = re.search(
        r"(?:reading|downloading|fetch|proxy|GOPROXY|module lookup|dial tcp|no such host|410 Gone|404)",
        stderr,
    )
    if download:
        return (
            f"building {name} failed while downloading Go modules ({last.strip()}); check that the Go "
            "module proxy is reachable (GOPROXY, network) and retry 'make tools'"
        )
    return f"building {name} failed: {last.strip()}; full output above, fix it and retry 'make tools'"


def _go_binary_name(package: str) -> str:
    """The file name go build gives a main package: its last element, skipping a /vN major suffix."""
    parts = package.rstrip("/").split("/")
    return parts[-2] if re.fullmatch(r"v\d+", parts[-1]) else parts[-1]


def _discard(line: str) -> None:
    pass


def ensure(build: GoBuild, *, quiet: bool = False, echo: Callable[[str], None] = _discard) -> dict[str, Path]:
    """Return the path of each binary, building the missing ones once. ``echo`` gets each line go build
    prints: the modules it downloads and, with -v, each package it compiles."""
    ensure_all([build], quiet=quiet, echo=echo)
    return {name: build.bin_dir() / name for name in build.packages}


def ensure_all(builds: Sequence[GoBuild], *, quiet: bool = False, echo: Callable[[str], None] = _discard) -> None:
    """Build what is missing of ``builds`` with one ``go build`` per module: within one, Go compiles the
    packages the binaries share once and links each binary while it still compiles others, where one build
    after another leaves a core idle at each one's start (loading the packages) and end (the last links)."""
    by_module: dict[str, list[GoBuild]] = {}
    for build in builds:
        by_module.setdefault(build.module_dir, []).append(build)
    for module_dir, group in by_module.items():
        missing = [
            Missing(build, name, package)
            for build in group
            for name, package in build.packages.items()
            if not (build.bin_dir() / name).exists()
        ]
        if missing:
            _build(module_dir, missing, quiet=quiet, echo=echo)


@dataclass(frozen=True)
class Missing:
    """One binary to build: its build (versions, flags, cache directory), its name and its main package."""

    build: GoBuild
    name: str
    package: str


NO_DWARF = "-gcflags=all=-dwarf=false"
"""The compiler writes no debug information, which every binary's ``-s -w`` strips at link time anyway: 14% less
CPU for a cold build (kube-proxy's 1200 packages: 361 against 312 CPU-s, 2026-11-27), the same binaries."""


def compile_flags(missing: Sequence[Missing]) -> list[str]:
    """The flags every package of one build compiles with, which name its entries in Go's build cache. The tags
    are the union, as each is read only by the module that defines it (Prometheus's ``remove_all_sd``)."""
    tags = ",".join(dict.fromkeys(t for m in missing for t in m.build.tags.split(",") if t))
    return ["-trimpath", NO_DWARF, *(["-tags", tags] if tags else [])]


def go_build_argv(go: str, missing: Sequence[Missing], staging: Path) -> list[str]:
    """One go build for binaries of one module. Each main package gets its own build's -ldflags (Go applies a
    ``pattern=`` flag to the packages it names)."""
    argv = [go, "build", "-v", *compile_flags(missing)]
    argv += [f"-ldflags={m.package}={m.build.ldflags}" for m in missing]
    return [*argv, "-o", str(staging) + "/", *(m.package for m in missing)]


def standard_library_argv(go: str, missing: Sequence[Missing]) -> list[str]:
    """Go's standard library, compiled with the build's own flags (so its cache entries are the ones the build
    looks up) and linked into nothing."""
    return [go, "build", *compile_flags(missing), "std"]


@contextlib.contextmanager
def _standard_library_alongside(argv: list[str], *, cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """Compile the standard library while the build downloads its modules. A cold go build compiles nothing
    until every module is on disk (331 for the box: 40 s of network with a core idle); the standard library
    needs none of them, and it is 230 of the box's 3600 packages (46 CPU-s for all of it). Whatever it has
    compiled when the build gets there is found in the cache; it is stopped when the build ends."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()


def _build(module_dir: str, missing: Sequence[Missing], *, quiet: bool, echo: Callable[[str], None]) -> None:
    go = go_command()
    (cache_dir() / "bin").mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(m.build.key for m in missing))
    names = ", ".join(m.name for m in missing)
    if not quiet:
        print(f"building {names} ({'+'.join(keys)}) into {cache_dir() / 'bin'}", flush=True)
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod")
    # one staging directory per build, beside the cache (so the renames below stay atomic): a killed build's
    # leftovers, or another process's build of other versions, never land in this one's cache directories
    with tempfile.TemporaryDirectory(dir=cache_dir() / "bin", prefix=f".staging-{module_dir}-") as tmp:
        staging = Path(tmp)
        cwd = TOOLS_DIR / module_dir
        with _standard_library_alongside(standard_library_argv(go, missing), cwd=cwd, env=env):
            code, said = _run_go(go_build_argv(go, missing, staging), cwd=cwd, env=env, echo=echo)
        if code != 0:
            if echo is _discard:  # else its lines are out already
                print("\n".join(said[-40:]))
            raise BoxError(_explain_go_failure(names, "\n".join(said)))
        for m in missing:
            m.build.bin_dir().mkdir(parents=True, exist_ok=True)
            # rename is atomic: a killed build never leaves a half-written binary under its final name
            (staging / _go_binary_name(m.package)).rename(m.build.bin_dir() / m.name)


# what go build -v prints for each package it compiles: the import path alone
_PACKAGE_LINE = re.compile(r"[A-Za-z0-9_.~\-]+(?:/[A-Za-z0-9_.~\-]+)*")


def _run_go(argv: list[str], *, cwd: Path, env: dict[str, str], echo: Callable[[str], None]) -> tuple[int, list[str]]:
    """Run go, passing each line to ``echo``; returns its exit status and what it said besides package names
    (a package named .../proxy must not read as a proxy error)."""
    said: list[str] = []
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    with proc:
        for line in proc.stdout:
            echo(line.rstrip("\n"))
            if not _PACKAGE_LINE.fullmatch(line.strip()):
                said.append(line.rstrip("\n"))
    return proc.returncode, said


PURPOSES = ("demo", "test")


def builds_for(purpose: str) -> tuple[GoBuild, ...]:
    """What a command needs: the demo runs no Kueue; the tests (and ``make tools``) need everything the box
    can start."""
    demo = (kubernetes_build(), kubernetes_node_build(), coredns_build(), helm_build(), prometheus_build())
    if purpose == "demo":
        return demo
    if purpose == "test":
        return (*demo, promtool_build(), kueue_build(), kwok_build())
    raise ValueError(f"unknown purpose {purpose!r}: choose one of {', '.join(PURPOSES)}")


def main(argv: Sequence[str] | None = None) -> None:
    """Build what the box needs: ``python -m ddpjob_box.toolchain [--for demo|test]``."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m ddpjob_box.toolchain", description=main.__doc__)
    parser.add_argument("--for", dest="purpose", choices=PURPOSES, default="test", help="what to build for")
    parser.add_argument(
        "--progress", action="store_true", help="print each module downloaded and package compiled (for make setup)"
    )
    args = parser.parse_args(argv)
    stop_like_ctrl_c()
    echo = (lambda line: print(line, flush=True)) if args.progress else _discard
    try:
        builds = builds_for(args.purpose)
        ensure_all(builds, echo=echo)
        for build in builds:
            print(f"{build.key}: {' '.join(sorted(build.packages))} in {build.bin_dir()}", flush=True)
    except BoxError as err:
        print(f"ddpjob: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
