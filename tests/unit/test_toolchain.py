"""The Go builds' cache: what the box runs comes from one module; binaries are cached by versions and go.sum."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from ddpjob_box import toolchain


def test_everything_the_box_runs_is_built_from_one_module_so_shared_packages_compile_once() -> None:
    box = toolchain.builds_for("demo")
    assert {b.module_dir for b in box} == {toolchain.BOX_MODULE}
    assert toolchain.kueue_build().module_dir != toolchain.BOX_MODULE  # Kueue pins other Kubernetes libraries


def test_the_demo_builds_only_what_it_runs() -> None:
    def binaries(purpose: str) -> set[str]:
        return {name for build in toolchain.builds_for(purpose) for name in build.packages}

    # the alert tests', the Kueue tests' and the simulated hosts'
    assert binaries("test") - binaries("demo") == {"promtool", "kueue", "kwok"}
    assert toolchain.promtool_build().bin_dir() == toolchain.prometheus_build().bin_dir()


def test_the_standard_library_compiles_with_the_builds_own_flags_beside_it_and_stops_with_it(tmp_path: Path) -> None:
    """Its cache entries are named by the flags: any other flag and the build would compile it again."""
    missing = [
        toolchain.Missing(build, name, package)
        for build in toolchain.builds_for("demo")
        for name, package in build.packages.items()
    ]
    flags = toolchain.compile_flags(missing)
    assert toolchain.standard_library_argv("go", missing) == ["go", "build", *flags, "std"]
    build = toolchain.go_build_argv("go", missing, tmp_path)
    assert build[3 : 3 + len(flags)] == flags and "-tags" not in build[3 + len(flags) :]
    pid_file = tmp_path / "pid"
    sleeper = ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]
    with toolchain._standard_library_alongside(sleeper, cwd=tmp_path, env={}):
        while not pid_file.exists() or not pid_file.read_text().strip():
            time.sleep(0.01)
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists(), "the standard library's build outlived the build"


def test_a_changed_go_sum_moves_every_box_binary_and_only_those(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tools = tmp_path / "tools"
    shutil.copytree(toolchain.TOOLS_DIR, tools, ignore=shutil.ignore_patterns("*.go"))
    monkeypatch.setattr(toolchain, "TOOLS_DIR", tools)
    before = {b.bin_dir().name for b in toolchain.builds_for("test")}
    with (tools / toolchain.BOX_MODULE / "go.sum").open("a") as go_sum:
        go_sum.write("golang.org/x/net v0.61.1 h1:bumped=\n")
    after = {b.bin_dir().name for b in toolchain.builds_for("test")}
    assert toolchain.kueue_build().bin_dir().name in before & after
    assert len(before - after) == 4  # the control plane with the node's binaries, CoreDNS, helm, Prometheus
    assert all(name.startswith(("k8s-v", "coredns-v", "helm-v", "prometheus-v")) for name in after - before)


def test_the_box_binaries_are_one_go_build_each_with_its_own_link_flags_and_kueue_and_kwok_others(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DDPJOB_CACHE", str(tmp_path))
    calls: list[tuple[str, list[toolchain.Missing]]] = []
    monkeypatch.setattr(toolchain, "_build", lambda module, missing, **_: calls.append((module, list(missing))))
    toolchain.ensure_all(toolchain.builds_for("test"))
    assert [module for module, _ in calls] == [toolchain.BOX_MODULE, "kueue", "kwok"]
    box = calls[0][1]
    argv = toolchain.go_build_argv("go", box, tmp_path / "staging")
    for m in box:
        assert argv.count(f"-ldflags={m.package}={m.build.ldflags}") == 1
    assert argv[argv.index("-tags") + 1] == toolchain.prometheus_build().tags
    # no debug information compiled, as every binary is linked stripped (-s -w)
    assert toolchain.NO_DWARF in argv and all("-s -w" in m.build.ldflags for m in box)
    assert argv[-len(box) :] == [m.package for m in box]
    kube_apiserver = next(a for a in argv if a.startswith("-ldflags=k8s.io/kubernetes/cmd/kube-apiserver="))
    assert "-X k8s.io/component-base/version.gitVersion=v" in kube_apiserver and "helm.sh" not in kube_apiserver


def test_a_binary_already_built_is_not_built_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DDPJOB_CACHE", str(tmp_path))
    helm = toolchain.helm_build()
    helm.bin_dir().mkdir(parents=True)
    (helm.bin_dir() / "helm").touch()
    calls: list[list[str]] = []
    monkeypatch.setattr(toolchain, "_build", lambda module, missing, **_: calls.append([m.name for m in missing]))
    toolchain.ensure_all([helm, toolchain.coredns_build()])
    assert calls == [["coredns"]]
