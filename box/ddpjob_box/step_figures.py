"""The moving figure of a setup step, read from its output one line at a time.

Each figure says how far its step has come in the units its tools print: Go modules downloaded and Go
packages compiled (``go build -v``), Debian packages retrieved and unpacked (debootstrap), the Dockerfile's
STEP n/m and the megabytes of wheels pip has downloaded (``buildah bud``). Pure: lines in, text out.
"""

from __future__ import annotations

import re
from typing import Protocol


class Figure(Protocol):
    """What a step's output says about its progress so far."""

    def read(self, line: str) -> None: ...

    def text(self) -> str: ...


class NoFigure:
    """For a step whose tools print nothing countable (pip -q, apt-get -qq): its elapsed time says it all."""

    def read(self, line: str) -> None:
        pass

    def text(self) -> str:
        return ""


# go build -v names each package as it compiles it: a bare import path, nothing else on the line.
_IMPORT_PATH = re.compile(r"[A-Za-z0-9_.~\-]+(?:/[A-Za-z0-9_.~\-]+)*")
# what ddpjob_box.toolchain prints before each go build: "building <names> (<key>[+<key>...]) into <dir>"
_GO_BUILD = re.compile(r"^building .+ \((?P<key>[^)\s]+)\) into ")


class GoFigure:
    """Go builds: which one runs, the modules downloaded and the packages compiled so far."""

    def __init__(self) -> None:
        self.build = ""
        self.modules = 0
        self.packages = 0

    def read(self, line: str) -> None:
        line = line.strip()
        if match := _GO_BUILD.match(line):
            # one go build may make several keys' binaries: "k8s-v1.37.2-etcd-v3.7.2+helm-v3.19.5" -> "k8s+helm"
            self.build = "+".join(re.sub(r"-v\d.*", "", key) for key in match.group("key").split("+"))
        elif line.startswith("go: downloading "):
            self.modules += 1
        elif _IMPORT_PATH.fullmatch(line):
            self.packages += 1

    def text(self) -> str:
        if not self.build:
            return ""
        parts = [f"building {self.build}"]
        if self.modules:
            parts.append(f"{self.modules} modules downloaded")
        parts.append(f"{self.packages} Go packages compiled")
        return ", ".join(parts)


_IMAGE = re.compile(r"^building (?:ghcr\.io|localhost)/ddpjob/(?P<image>[a-z-]+)[:\s]")
_EXPORT = re.compile(r"^exporting (?:ghcr\.io|localhost)/ddpjob/(?P<image>[a-z-]+)[:\s]")
# what kubenode.store_fill prints: "importing <image> into node store <n>"
_IMPORT = re.compile(r"^importing (?:ghcr\.io|localhost)/ddpjob/(?P<image>[a-z-]+)\S* into (?P<store>node store \S+)")
# a multi-stage build prefixes its stage: "[2/7] STEP 1/4: FROM ..."
_STEP = re.compile(r"^(?:\[(?P<stage>\d+/\d+)\] )?STEP (?P<step>\d+/\d+):")
_DOWNLOAD = re.compile(r"Downloading (?:\S*/)?(?P<file>[^/\s]+) \((?P<size>[\d.]+) (?P<unit>[kMG]B)\)")
_DEBOOTSTRAP = re.compile(r"^I: (?P<verb>Retrieving|Unpacking|Configuring) (?P<what>\S+)")
# "Retrieving InRelease/Packages" fetch the indexes; "Unpacking required packages..." names a phase
_DEBOOTSTRAP_PHASES = {"InRelease", "Release", "Packages", "required", "the", "base"}
_UNITS = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}


def format_megabytes(mb: float) -> str:
    return f"{mb / 1000:.1f} GB" if mb >= 1000 else f"{mb:.0f} MB"


class ImageFigure:
    """Image builds and imports: the image under way (and the node store it goes into), debootstrap's
    package counts for the base, the Dockerfile's STEP n/m and the wheels pip downloads for the others. A wheel
    counts as downloaded once pip says something after it; until then it is named as the one under way."""

    def __init__(self) -> None:
        self.image = ""
        self.action = "building"
        self.debian = {"Retrieving": 0, "Unpacking": 0, "Configuring": 0}
        self.step = ""
        self.downloaded_mb = 0.0
        self.pending: tuple[str, float] | None = None

    def read(self, line: str) -> None:
        line = line.strip()
        if not line:
            return
        if self.pending is not None:
            self.downloaded_mb += self.pending[1]
            self.pending = None
        if match := _IMAGE.match(line):
            self.start(match.group("image"), "building")
        elif match := _EXPORT.match(line):
            self.start(match.group("image"), "exporting")
        elif match := _IMPORT.match(line):
            self.start(f"{match.group('image')} into {match.group('store')}", "importing")
        elif match := _STEP.match(line):
            stage = match.group("stage")
            self.step = match.group("step") + (f" of stage {stage}" if stage else "")
        elif match := _DEBOOTSTRAP.match(line):
            if match.group("what") not in _DEBOOTSTRAP_PHASES:
                self.debian[match.group("verb")] += 1
        elif match := _DOWNLOAD.search(line):
            name = match.group("file").split("-")[0]
            self.pending = (name, float(match.group("size")) * _UNITS[match.group("unit")])

    def start(self, image: str, action: str) -> None:
        self.image, self.action, self.step = image, action, ""
        self.debian = dict.fromkeys(self.debian, 0)

    def text(self) -> str:
        if not self.image:
            return ""
        parts = [f"{self.action} {self.image}" + (f" STEP {self.step}" if self.step else "")]
        if any(self.debian.values()):
            parts.append(
                f"Debian packages: {self.debian['Retrieving']} retrieved, {self.debian['Unpacking']} unpacked, "
                f"{self.debian['Configuring']} configured"
            )
        if self.downloaded_mb or self.pending:
            wheels = f"{format_megabytes(self.downloaded_mb)} of wheels downloaded"
            if self.pending:
                wheels += f", now {self.pending[0]} ({format_megabytes(self.pending[1])})"
            parts.append(wheels)
        return ", ".join(parts)
