"""The box's container images, built locally with buildah and brought into a containerd.

No registry is reachable here, so every image starts from Debian packages:

* the base: ``debootstrap --variant=minbase bookworm`` with Python, committed with ``buildah``;
* the pause (sandbox) image: the base with an entrypoint that sleeps until it is told to stop.

Each image is tagged with a key derived from its inputs (``localhost/ddpjob/base:<key>``), so a second
call finds it and builds nothing, and a changed input builds afresh. buildah keeps its storage under
``$DDPJOB_CACHE/images/`` (default ``~/.cache/ddpjob``), outside the repository and away from the
system's ``/var/lib/containers``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ddpjob_box.errors import BoxError
from ddpjob_box.toolchain import cache_dir

# Bump when the recipe below changes in a way its inputs do not show.
RECIPE = "1"
SUITE = "bookworm"
# What the Dockerfile's stages need: a venv-capable Python, and groupadd/useradd (passwd).
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "passwd")
# runc, named: crun fails on this machine's hybrid cgroups, and buildah prefers it when both exist.
RUNTIME = "/usr/sbin/runc"
BASE_REPO = "localhost/ddpjob/base"
PAUSE_REPO = "localhost/ddpjob/pause"
# Exits on SIGTERM (a bare `sleep` as PID 1 would ignore it) and reaps what the shell started.
PAUSE_ENTRYPOINT = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
CONTAINERD_NAMESPACE = "k8s.io"


def images_dir() -> Path:
    return cache_dir() / "images"


def _tool(name: str, package: str) -> str:
    path = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)
    if path is None:
        raise BoxError(f"{name} is missing: run 'apt-get install -y {package}' (or 'make system-packages')")
    return path


def buildah_argv(*args: str) -> list[str]:
    """buildah with the box's own storage, so images never land in the system's /var/lib/containers."""
    root = images_dir()
    return [
        _tool("buildah", "buildah"),
        "--root",
        str(root / "storage"),
        "--runroot",
        str(root / "runroot"),
        "--storage-driver",
        "overlay",
        *args,
    ]


def _run(argv: Sequence[str], what: str, *, cwd: Path | None = None) -> str:
    proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr or proc.stdout).strip().splitlines() if line.strip()]
        last = lines[-1].strip() if lines else f"exit status {proc.returncode}"
        raise BoxError(f"{what} failed: {last}")
    return proc.stdout


def buildah(*args: str, what: str) -> str:
    return _run(buildah_argv(*args), what)


def image_id(name: str) -> str | None:
    """The ID of a local image in the box's storage, or None when it is absent."""
    proc = subprocess.run(
        buildah_argv("inspect", "--type", "image", "--format", "{{.FromImageID}}", name),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def input_key(*parts: object) -> str:
    """A short digest of everything an image is made from."""
    blob = json.dumps([RECIPE, *parts], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def debian_mirror() -> str:
    """The mirror apt already uses (``DDPJOB_DEBIAN_MIRROR`` overrides it)."""
    override = os.environ.get("DDPJOB_DEBIAN_MIRROR")
    if override:
        return override
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            continue
        for uri in re.findall(r"^\s*URIs:\s*(\S+)", text, re.MULTILINE) + re.findall(
            r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", text, re.MULTILINE
        ):
            if uri.rstrip("/").endswith("/debian"):
                return str(uri)
    return "http://deb.debian.org/debian"


def ensure_base(*, quiet: bool = False) -> str:
    """The local Debian base image with Python, built once per input key. Returns its name."""
    mirror = debian_mirror()
    name = f"{BASE_REPO}:{input_key('base', SUITE, mirror, BASE_PACKAGES)}"
    if image_id(name):
        return name
    debootstrap = _tool("debootstrap", "debootstrap")
    images_dir().mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"building {name} from debootstrap {SUITE} ({mirror}); about a minute", flush=True)
    with tempfile.TemporaryDirectory(dir=images_dir(), prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run(
            [debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), mirror],
            f"debootstrap {SUITE} from {mirror}",
        )
        # The runtime provides /dev, /proc, /sys and the resolver; apt's caches only add weight.
        for sub in ("dev", "proc", "sys", "var/cache/apt/archives", "var/lib/apt/lists", "tmp"):
            for child in (rootfs / sub).glob("*"):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        container = buildah("from", "scratch", what="buildah from scratch").strip()
        try:
            buildah("copy", "--quiet", container, f"{rootfs}/", "/", what="copying the base's root filesystem")
            buildah(
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                "python3",
                "--label",
                f"io.ddpjob.inputs={name}",
                container,
                what="configuring the base image",
            )
            buildah("commit", "--quiet", "--rm", container, name, what=f"committing {name}")
        except BaseException:
            subprocess.run(buildah_argv("rm", container), capture_output=True, check=False)
            raise
    return name


def ensure_pause(*, quiet: bool = False) -> str:
    """The sandbox image containerd names in ``sandbox_image``: the base, sleeping. Returns its name."""
    base = ensure_base(quiet=quiet)
    name = f"{PAUSE_REPO}:{input_key('pause', base, PAUSE_ENTRYPOINT)}"
    if image_id(name):
        return name
    container = buildah("from", "--pull-never", base, what=f"buildah from {base}").strip()
    try:
        buildah(
            "config",
            "--entrypoint",
            json.dumps(PAUSE_ENTRYPOINT),
            "--cmd",
            "",
            "--user",
            "65535:65535",
            container,
            what="configuring the pause image",
        )
        buildah("commit", "--quiet", "--rm", container, name, what=f"committing {name}")
    except BaseException:
        subprocess.run(buildah_argv("rm", container), capture_output=True, check=False)
        raise
    return name


def export_archive(name: str) -> Path:
    """An OCI archive of a local image, written once per image ID under the cache."""
    ident = image_id(name)
    if ident is None:
        raise BoxError(f"image {name} is not in the box's storage; build it first (make images)")
    archives = images_dir() / "archives"
    archives.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    archive = archives / f"{safe}-{ident[:16]}.tar"
    if archive.exists():
        return archive
    for stale in archives.glob(f"{safe}-*.tar"):
        stale.unlink()
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    buildah("push", "--quiet", name, f"oci-archive:{partial}:{name}", what=f"exporting {name}")
    partial.rename(archive)
    return archive


def import_into_containerd(name: str, socket: Path, namespace: str = CONTAINERD_NAMESPACE) -> None:
    """Bring a local image into the containerd listening on ``socket``, under its own name."""
    archive = export_archive(name)
    ctr = _tool("ctr", "containerd")
    _run(
        [ctr, "--address", str(socket), "-n", namespace, "images", "import", str(archive)],
        f"importing {name} into containerd at {socket}",
    )
