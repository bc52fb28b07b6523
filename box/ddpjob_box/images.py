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

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ddpjob_box import toolchain
from ddpjob_box.errors import BoxError
from ddpjob_box.kubenode.configs import CONTAINERD_NAMESPACE, SNAPSHOTTER
from ddpjob_box.overlap import stop_like_ctrl_c
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


def buildah_env() -> dict[str, str]:
    """buildah's temporary files (push staging, cache mounts) under the box's cache, not /var/tmp."""
    tmp = images_dir() / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, TMPDIR=str(tmp))


def _run(argv: Sequence[str], what: str, *, cwd: Path | None = None) -> str:
    proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, check=False, env=buildah_env())
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr or proc.stdout).strip().splitlines() if line.strip()]
        last = lines[-1].strip() if lines else f"exit status {proc.returncode}"
        raise BoxError(f"{what} failed: {last}")
    return proc.stdout


def _run_echoed(argv: Sequence[str], what: str) -> None:
    """Run a long command with its output passed on line by line (its progress), failing with its last line."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=buildah_env())
    assert proc.stdout is not None
    last = ""
    with proc:
        for line in proc.stdout:
            print(line, end="", flush=True)
            last = line.strip() or last
    if proc.returncode != 0:
        raise BoxError(f"{what} failed: {last or f'exit status {proc.returncode}'}")


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


def image_entrypoint(name: str) -> list[str]:
    """The entrypoint a local image declares."""
    config = json.loads(buildah("inspect", "--type", "image", name, what=f"inspecting {name}"))
    return [str(part) for part in config["OCIv1"]["config"].get("Entrypoint") or []]


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
        print(f"building {name} from debootstrap {SUITE} ({mirror})", flush=True)
    with tempfile.TemporaryDirectory(dir=images_dir(), prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        argv = [debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), mirror]
        what = f"debootstrap {SUITE} from {mirror}"
        if quiet:
            _run(argv, what)
        else:
            _run_echoed(argv, what)
        # The runtime provides /dev, /proc, /sys and the resolver; apt's caches only add weight.
        for sub in ("dev", "proc", "sys", "var/cache/apt/archives", "var/lib/apt/lists", "tmp"):
            for child in (rootfs / sub).glob("*"):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        config = ["--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "--env", "LANG=C.UTF-8",
                  "--cmd", "python3", "--label", f"io.ddpjob.inputs={name}"]  # fmt: skip
        commit_image(SCRATCH, name, config, copies=[(f"{rootfs}/", "/")], what="the base image")
    return name


SCRATCH = "scratch"
"""buildah's empty starting point."""


def commit_image(start: str, name: str, config: Sequence[str], *, copies: Sequence[tuple[str, str]] = (),
                 what: str) -> None:  # fmt: skip
    """An image ``name``: a working container from the local image ``start`` (or ``SCRATCH``), ``copies``
    (host path, image path) copied in, ``config`` (``buildah config`` options) applied, committed; the working
    container is removed whatever happens."""
    container = buildah("from", *([] if start == SCRATCH else ["--pull-never"]), start, what=f"buildah from {start}")
    container = container.strip()
    try:
        for source, destination in copies:
            buildah("copy", "--quiet", container, source, destination, what=f"copying {source} into {what}")
        buildah("config", *config, container, what=f"configuring {what}")
        buildah("commit", "--quiet", "--rm", container, name, what=f"committing {name}")
    except BaseException:
        subprocess.run(buildah_argv("rm", container), capture_output=True, check=False)
        raise


def ensure_pause(*, quiet: bool = False) -> str:
    """The sandbox image containerd names in ``sandbox_image``: the base, sleeping. Returns its name."""
    base = ensure_base(quiet=quiet)
    name = f"{PAUSE_REPO}:{input_key('pause', base, PAUSE_ENTRYPOINT)}"
    if image_id(name):
        return name
    config = ["--entrypoint", json.dumps(PAUSE_ENTRYPOINT), "--cmd", "", "--user", "65535:65535"]
    commit_image(base, name, config, what="the pause image")
    return name


KUEUE_REPO = "localhost/ddpjob/kueue"
# As Kueue's own Dockerfile lays its image out: the manager at /manager, run as its distroless base's nonroot
# user (the chart's runAsNonRoot needs a numeric one).
KUEUE_BINARY = "/manager"
KUEUE_USER = "65532:65532"


def ensure_kueue(*, quiet: bool = False) -> str:
    """Kueue's manager image: the local base with the manager built from the Go module proxy
    (toolchain.kueue_build), keyed by the binary's digest. Built only for a box that wants Kueue."""
    binary = toolchain.ensure(toolchain.kueue_build(), quiet=quiet)["kueue"]
    base = ensure_base(quiet=quiet)
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    name = f"{KUEUE_REPO}:{toolchain.kueue_version()}-{input_key('kueue', base, digest, KUEUE_BINARY, KUEUE_USER)}"
    if image_id(name):
        return name
    if not quiet:
        print(f"building {name} from {binary}", flush=True)
    config = ["--entrypoint", json.dumps([KUEUE_BINARY]), "--cmd", "", "--user", KUEUE_USER, "--workingdir", "/",
              "--label", f"io.ddpjob.inputs={name}"]  # fmt: skip
    commit_image(base, name, config, copies=[(str(binary), KUEUE_BINARY)], what="the Kueue image")
    drop_older(name)
    return name


def containerd_digest(name: str, socket: Path, namespace: str = CONTAINERD_NAMESPACE) -> str | None:
    """The manifest digest containerd holds under ``name``, or None."""
    out = _ctr(socket, namespace, "images", "ls", f"name=={name}", what=f"listing images in containerd at {socket}")
    for line in out.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[0] == name:
            return fields[2]
    return None


def _ctr(socket: Path, namespace: str, *args: str, what: str) -> str:
    return _run([_tool("ctr", "containerd"), "--address", str(socket), "-n", namespace, *args], what)


def layout_dir() -> Path:
    """The OCI layout of uncompressed layers (``oci``, its earlier name, held the gzip layers of buildah's push)."""
    return images_dir() / "oci-tar"


def export_argv(name: str, layout: Path, digest_file: Path) -> list[str]:
    """skopeo's copy of ``name`` from buildah's storage into ``layout``, its layers uncompressed.

    Not ``buildah push``: buildah 1.28 gzips every layer for an ``oci:`` destination, ``--disable-compression``
    or not, and re-reads every layer on each push. skopeo writes plain tar layers, whose digests are the ones the
    storage already knows, so a layer the layout holds is not read again. Measured on the trainer (2026-11-27):
    buildah's push 125 s and 100 CPU-s (40% of it gzip), skopeo's copy 49 s and 43 CPU-s, and 0.02 s again
    unchanged; containerd then unpacks the layers without gunzipping them."""
    root = images_dir()
    source = f"containers-storage:[overlay@{root / 'storage'}+{root / 'runroot'}]{name}"
    # --insecure-policy: a copy between two local stores, which no signature policy concerns
    argv = [_tool("skopeo", "skopeo"), "--insecure-policy", "copy", "--quiet", "--dest-oci-accept-uncompressed-layers"]
    return [*argv, "--digestfile", str(digest_file), source, f"oci:{layout}:{name}"]


def export_layout(name: str) -> str:
    """Write ``name`` into the cache's OCI layout, uncompressed; returns its manifest digest.

    The digest is remembered per image ID, so an unchanged image costs no copy at all, and a changed one
    writes only its new layers (``export_argv``): after a source change, the trainer's small top layer, not
    its 5.8 GB of dependencies. The import after it sends only what containerd lacks.
    """
    ident = image_id(name)
    if ident is None:
        raise BoxError(f"image {name} is not in the box's storage; build it first (make images)")
    layout = layout_dir()
    exported = _exported(layout, ident)
    if exported is not None:
        return exported
    remembered = layout / "digests" / ident
    remembered.parent.mkdir(parents=True, exist_ok=True)
    digest_file = remembered.with_suffix(".partial")
    _run(export_argv(name, layout, digest_file), f"exporting {name}")
    digest_file.rename(remembered)
    _collect_garbage(layout)
    return remembered.read_text().strip()


LAYOUT_BLOBS = Path("blobs") / "sha256"
"""Where an OCI layout keeps its blobs, one file per digest."""


def _blob(layout: Path, digest: str) -> Path:
    """The layout's file of blob ``digest`` (``sha256:<hex>``)."""
    return layout / LAYOUT_BLOBS / digest.split(":")[-1]


def _exported(layout: Path, ident: str) -> str | None:
    """The manifest digest of image ``ident`` when the layout holds it already (remembered, and its manifest there)."""
    remembered = layout / "digests" / ident
    if remembered.exists() and _blob(layout, remembered.read_text().strip()).exists():
        return remembered.read_text().strip()
    return None


def _manifest_blobs(layout: Path, digest: str) -> list[str]:
    """The manifest's own digest, its config's and its layers', in that order."""
    manifest = json.loads(_blob(layout, digest).read_text())
    return [digest, manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])]


def _collect_garbage(layout: Path) -> None:
    """Delete the blobs no image in the layout's index still names (earlier builds' layers)."""
    index = json.loads((layout / "index.json").read_text())
    live = {blob for entry in index["manifests"] for blob in _manifest_blobs(layout, entry["digest"])}
    for blob in (layout / LAYOUT_BLOBS).iterdir():
        if f"sha256:{blob.name}" not in live:
            blob.unlink()
    for partial in layout.glob("oci-put-blob*"):  # left by a copy that was killed
        partial.unlink()
    for remembered in (layout / "digests").iterdir():
        if remembered.read_text().strip() not in live:
            remembered.unlink()


def import_into_containerd(name: str, socket: Path, root: Path, namespace: str = CONTAINERD_NAMESPACE) -> bool:
    """Bring a local image into the containerd listening on ``socket``, whose root directory is ``root``, under its
    own name.

    Only the blobs containerd lacks cross over: a one-line source change moves one small layer, not the
    trainer's 5.8 GB of dependencies. Each one it lacks is hard-linked from the layout into its content store just
    before its ingest (``_link_layer``), so it is written once on this disk. Returns False when containerd already
    held that very image, unpacked.
    """
    with _layout_lock():
        digest = export_layout(name)
        if containerd_digest(name, socket, namespace) == digest and _unpacked(digest, socket, namespace):
            return False
        layers = _manifest_blobs(layout_dir(), digest)[2:]
        _import_missing(name, digest, layers, socket, namespace, root)
    return True


CONTENT_BLOBS = Path("io.containerd.content.v1.content") / "blobs" / "sha256"
"""Where containerd's local content store keeps its blobs under its root, one file per digest: the same bytes as the
layout's blob of that digest."""
DEFAULT_CONTAINERD_ROOT = Path("/var/lib/containerd")
"""containerd's own default root, for ``make images CONTAINERD_SOCKET=...`` (``--containerd-root`` for another)."""


def _link_layer(layer: str, root: Path) -> None:
    """Hard-link ``layer`` from the layout into the content store of the containerd at ``root``. ``_ingest`` then
    registers it with containerd without reading it: under its default content sharing policy (``shared``),
    containerd takes a blob its store already holds as written. Measured on the trainer (2026-11-27): an import
    into a new store took 78 s and 89 CPU-s streaming its 3.2 GB layer, 43 s and 45 CPU-s linked. Where a link
    cannot be made (another filesystem), the ingest copies the blob instead."""
    blobs = root / CONTENT_BLOBS
    with contextlib.suppress(OSError):  # there already, or not linkable (not writable, another filesystem)
        blobs.mkdir(parents=True, exist_ok=True)
        os.link(_blob(layout_dir(), layer), blobs / layer.split(":")[1])


def _collect_garbage_now(socket: Path, namespace: str) -> None:
    """Have containerd collect its garbage now, and wait for it (a lease deleted with ``--sync``).

    A collection deletes every blob of its content store that no image or lease names, and so a layer linked in
    but not yet ingested. containerd collects once shortly after it starts (its scheduler's ``startup_delay``), and
    that pass, landing in the middle of a new store's first import, made the ingests copy their layers: a cold
    ``make demo`` (2026-11-27, 36f82bc) filled its store in 84 s with every layer copied, against 36 s linked. A
    collection run here takes the place of that one, before anything is linked."""
    lease = f"ddpjob-collect-{os.getpid()}"
    _ctr(socket, namespace, "leases", "create", "--id", lease, what=f"creating lease {lease}")
    _ctr(socket, namespace, "leases", "delete", "--sync", lease, what=f"collecting garbage in {socket}")


def top_snapshot(digest: str) -> str:
    """The name containerd gives the snapshot of the top layer of the layout's image ``digest``: the OCI chain ID
    of its layers' diff IDs."""
    layout = layout_dir()
    config_digest = _manifest_blobs(layout, digest)[1]
    config = json.loads(_blob(layout, config_digest).read_text())
    diff_ids = config["rootfs"]["diff_ids"]
    chain = str(diff_ids[0])
    for diff_id in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
    return chain


def _unpacked(digest: str, socket: Path, namespace: str) -> bool:
    """Whether containerd holds the snapshot of the image's top layer. An import stopped while it unpacked (a
    Ctrl-C in the setup's node stores step) leaves the image's name and blobs, but not all its snapshots, and a
    container of it then fails to start ('parent snapshot does not exist'); importing it again unpacks it."""
    top = top_snapshot(digest)
    try:
        _ctr(socket, namespace, "snapshots", "--snapshotter", SNAPSHOTTER, "info", top, what=f"finding snapshot {top}")
    except BoxError:
        return False
    return True


@contextlib.contextmanager
def _layout_lock() -> Iterator[None]:
    """One writer of the layout at a time: an export or its garbage collection must not race an import."""
    layout_dir().mkdir(parents=True, exist_ok=True)
    with open(layout_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _import_missing(name: str, digest: str, layers: Sequence[str], socket: Path, namespace: str, root: Path) -> None:
    """Ingest the ``layers`` containerd lacks, then import the image's manifest and config, which name them."""
    have = set(_ctr(socket, namespace, "content", "ls", "--quiet", what=f"listing content in {socket}").split())
    missing = [layer for layer in layers if layer not in have]
    if missing:
        _collect_garbage_now(socket, namespace)
    try:
        _ingest(missing, socket, namespace, root)
        _stream_import(name, digest, socket, namespace)
    except BoxError:
        # containerd may have collected a blob between the listing and the import: ingest them all
        _ingest(layers, socket, namespace, root)
        _stream_import(name, digest, socket, namespace)


def _ingest(layers: Sequence[str], socket: Path, namespace: str, root: Path) -> None:
    """Link each layer into the content store of the containerd at ``root`` (``_link_layer``), then ``ctr content
    ingest`` it from the layout, its digest and size checked: containerd takes the linked blob as it is, reports it
    complete, and reads nothing. One layer at a time, so that no collection can come between a link and its ingest
    but the one a previous ``ctr`` set off as it exited."""
    for layer in layers:
        _link_layer(layer, root)
        blob = _blob(layout_dir(), layer)
        argv = [_tool("ctr", "containerd"), "--address", str(socket), "-n", namespace, "content", "ingest"]
        argv += ["--expected-size", str(blob.stat().st_size), "--expected-digest", layer, f"ddpjob-import-{layer}"]
        # a file, not a pipe: containerd answers a blob it holds with its full size, and ctr seeks there
        with blob.open("rb") as data:
            proc = subprocess.run(argv, stdin=data, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            said = (proc.stderr or proc.stdout).strip().splitlines()
            raise BoxError(
                f"ingesting {layer} into containerd at {socket} failed: {said[-1] if said else proc.returncode}"
            )


def _stream_import(name: str, digest: str, socket: Path, namespace: str) -> None:
    """Pipe an OCI archive of ``name``'s manifest and config into ``ctr images import``, which unpacks the layers
    containerd holds (``_ingest``)."""
    layout = layout_dir()
    blobs = _manifest_blobs(layout, digest)
    manifest_size = _blob(layout, digest).stat().st_size
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest,
                "size": manifest_size,
                "annotations": {"org.opencontainers.image.ref.name": name},
            }
        ],
    }
    argv = [_tool("ctr", "containerd"), "--address", str(socket), "-n", namespace, "images", "import", "-"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=log)
        assert proc.stdin is not None
        try:
            with tarfile.open(fileobj=proc.stdin, mode="w|") as tar:
                for member, data in (
                    ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
                    ("index.json", json.dumps(index).encode()),
                ):
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                for blob in blobs[:2]:
                    tar.add(_blob(layout, blob), str(_blob(Path(), blob)))
        except BrokenPipeError:
            pass
        finally:
            proc.stdin.close()
        code = proc.wait()
        if code != 0:
            log.seek(0)
            lines = log.read().decode(errors="replace").strip().splitlines()
            raise BoxError(f"importing {name} into containerd at {socket} failed: {lines[-1] if lines else code}")


# The project's images, from the top-level Dockerfile's targets.
REPO_ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "ghcr.io/ddpjob"
TARGETS = ("operator", "trainer")
# Packages listed in pyproject.toml that a target's image does not keep (its Dockerfile stage deletes them),
# so a change to them does not rebuild that image.
DROPPED = {"operator": {"ddpjob_box"}, "trainer": {"ddpjob_box", "ddpjob_cli", "ddpjob_operator"}}


def pip_cache() -> Path:
    """The host's pip cache, mounted into the builds so torch is downloaded once per machine."""
    return Path(os.environ.get("PIP_CACHE_DIR", cache_dir() / "pip"))


def build_volumes() -> list[str]:
    """``--volume`` arguments that give the build's pip what the host's pip has: its cache, its CA bundle
    (a TLS-inspecting proxy signs PyPI with its own CA) and its index. Mounts are not part of a layer."""
    cache = pip_cache()
    cache.mkdir(parents=True, exist_ok=True)
    volumes = [f"{cache}:/root/.cache/pip"]
    conf = ["[global]"]
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        bundle = os.environ.get(var)
        if bundle and Path(bundle).is_file():
            volumes.append(f"{Path(bundle).resolve()}:/etc/ddpjob-build/ca.crt:ro")
            conf.append("cert = /etc/ddpjob-build/ca.crt")
            break
    for var, key in (("PIP_INDEX_URL", "index-url"), ("PIP_EXTRA_INDEX_URL", "extra-index-url")):
        if os.environ.get(var):
            conf.append(f"{key} = {os.environ[var]}")
    conf.append(f"timeout = {os.environ.get('PIP_DEFAULT_TIMEOUT', '120')}")
    path = images_dir() / "pip.conf"
    path.write_text("\n".join(conf) + "\n")
    volumes.append(f"{path}:/etc/pip.conf:ro")
    return volumes


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def image_name(target: str) -> str:
    """The name the chart and the manifests use: ``ghcr.io/ddpjob/<target>:<version>``."""
    return f"{REGISTRY}/{target}:{_pyproject()['project']['version']}"


def _tree_digest(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for top in paths:
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def target_inputs(target: str) -> list[Path]:
    """What an image is built from: the Dockerfile, the context's filter (.dockerignore), pyproject.toml and the
    packages it keeps."""
    package_dirs = _pyproject()["tool"]["setuptools"]["package-dir"]
    kept = sorted(set(package_dirs) - DROPPED[target])
    files = [REPO_ROOT / name for name in ("Dockerfile", ".dockerignore", "pyproject.toml")]
    return [*files, *(REPO_ROOT / package_dirs[p] for p in kept)]


def bud_argv(target: str, base: str, tag: str) -> list[str]:
    """``buildah bud`` for one Dockerfile target on the local base, with layer caching."""
    return buildah_argv(
        "bud",
        "--layers",
        # a failed step leaves no mounted working container behind
        "--force-rm",
        "--pull-never",
        "--runtime",
        RUNTIME,
        # runc's state under the box's own directory, not /run/runc
        "--runtime-flag",
        f"root={images_dir() / 'runroot' / 'runc'}",
        "--network",
        "host",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        "--target",
        target,
        *(arg for volume in build_volumes() for arg in ("--volume", volume)),
        "--tag",
        tag,
        "--file",
        str(REPO_ROOT / "Dockerfile"),
        str(REPO_ROOT),
    )


def ensure_target(target: str, *, quiet: bool = False) -> str:
    """Build one of the Dockerfile's targets once per input key; returns the name the chart uses."""
    if target not in TARGETS:
        raise BoxError(f"unknown image target {target!r}: choose one of {', '.join(TARGETS)}")
    base = ensure_base(quiet=quiet)
    name = image_name(target)
    keyed = f"localhost/ddpjob/{target}:{input_key(target, base, _tree_digest(target_inputs(target)))}"
    if image_id(keyed) is None:
        if not quiet:
            print(f"building {name} ({keyed}) with buildah", flush=True)
        argv = bud_argv(target, base, keyed)
        proc = subprocess.run(argv, text=True, capture_output=quiet, check=False, env=buildah_env())
        if proc.returncode != 0:
            if quiet:
                print((proc.stdout + proc.stderr)[-4000:])
            raise BoxError(f"building the {target} image failed (buildah output above); fix it and rerun 'make images'")
    if image_id(name) != image_id(keyed):
        buildah("tag", keyed, name, what=f"tagging {keyed} as {name}")
        drop_older(keyed)
    return name


# Builds kept per repository: other checkouts (worktrees) share this storage, and each would otherwise drop
# the others' build and rebuild its own, 3 GB dependency layer included, on every call.
KEEP_BUILDS = 3


def shipped_images() -> list[str]:
    """The operator and trainer images, built from the Dockerfile (cached by their inputs)."""
    return [ensure_target(target, quiet=True) for target in TARGETS]


def drop_older(keyed: str) -> None:
    """Remove all but the newest builds of ``keyed``'s repository. Untagged stage images stay: they are
    buildah's layer cache, and removing one breaks the cache of every step built on it."""
    repo = keyed.rsplit(":", 1)[0]
    builds = sorted(
        ((image["created"], name) for image in _listing() for name in image.get("names") or []),
        reverse=True,
    )
    ours = [name for _, name in builds if name.startswith(f"{repo}:") and name != keyed]
    for name in ours[KEEP_BUILDS - 1 :]:
        subprocess.run(buildah_argv("rmi", name), capture_output=True, check=False)


def _listing() -> list[dict[str, Any]]:
    listing: list[dict[str, Any]] = json.loads(buildah("images", "--all", "--json", what="listing images") or "[]")
    return listing


def ensure_all(
    socket: Path | None = None,
    *,
    root: Path = DEFAULT_CONTAINERD_ROOT,
    namespace: str = CONTAINERD_NAMESPACE,
    quiet: bool = False,
) -> list[str]:
    """Build the base, the pause and both targets; import them into the containerd at ``socket`` (its root
    directory ``root``) if given."""
    names = [ensure_pause(quiet=quiet), *(ensure_target(target, quiet=quiet) for target in TARGETS)]
    if socket is not None:
        for name in names:
            if import_into_containerd(name, socket, root, namespace) and not quiet:
                print(f"imported {name} into {socket}", flush=True)
    return names


EARLIER_LAYOUTS = ("oci",)
"""Layouts of earlier versions under the images cache (``oci``: buildah's gzip layers, 3.5 GB), which nothing reads."""


def drop_earlier_layouts() -> None:
    for name in EARLIER_LAYOUTS:
        shutil.rmtree(images_dir() / name, ignore_errors=True)


def export_all(names: Sequence[str]) -> None:
    """Write each image into the cache's OCI layout, where a node's import reads it: the trainer's 5.8 GB are then
    written while the Go builds run, not while the box starts."""
    drop_earlier_layouts()
    for name in names:
        with _layout_lock():
            layout = layout_dir()
            ident = image_id(name)
            if ident is None or _exported(layout, ident) is None:
                print(f"exporting {name} into {layout}", flush=True)
            export_layout(name)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m ddpjob_box.images [--containerd-socket SOCK]``: what ``make images`` runs."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m ddpjob_box.images", description=main.__doc__)
    parser.add_argument("--containerd-socket", type=Path, help="import the images into this containerd")
    parser.add_argument(
        "--containerd-root",
        type=Path,
        default=DEFAULT_CONTAINERD_ROOT,
        help=f"that containerd's root directory, where layers are linked to (default: {DEFAULT_CONTAINERD_ROOT})",
    )
    parser.add_argument("--namespace", default=CONTAINERD_NAMESPACE, help="containerd namespace (default: k8s.io)")
    parser.add_argument(
        "--export-layout",
        action="store_true",
        help="also write them into the cache's OCI layout, as a node's first import does (make setup: in advance)",
    )
    args = parser.parse_args(argv)
    stop_like_ctrl_c()  # stopped by make setup: remove the half-built root filesystem and working container
    if args.containerd_socket is not None and not args.containerd_socket.is_socket():
        print(
            f"ddpjob: --containerd-socket {args.containerd_socket} is not a socket; start containerd first",
            file=sys.stderr,
        )
        sys.exit(2)
    started = time.monotonic()
    try:
        names = ensure_all(args.containerd_socket, root=args.containerd_root, namespace=args.namespace)
        if args.export_layout:
            export_all([ensure_base(quiet=True), *names])
    except BoxError as err:
        print(f"ddpjob: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"{' '.join(names)} ready in {time.monotonic() - started:.1f}s", flush=True)


if __name__ == "__main__":
    main()
