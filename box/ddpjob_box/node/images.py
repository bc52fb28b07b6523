"""Which images the local node can run: only the project's own, mapped to this checkout's environment."""

from __future__ import annotations

from dataclasses import dataclass

# Repository names (registry and tag ignored) and the entrypoint each image's Dockerfile target declares.
PROJECT_IMAGES: dict[str, tuple[str, ...]] = {
    "ddpjob/trainer": ("python", "-m", "ddp_trainer"),
    "ddpjob/operator": ("ddpjob", "operator"),
}


@dataclass(frozen=True)
class ImageRefused:
    reason: str
    message: str


def repository(image: str) -> str:
    """``ghcr.io/ddpjob/trainer:0.1`` -> ``ddpjob/trainer``."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    parts = name.split("/")
    return "/".join(parts[-2:])


def entrypoint(image: str) -> tuple[str, ...] | ImageRefused:
    found = PROJECT_IMAGES.get(repository(image))
    if found is None:
        return ImageRefused(
            reason="ErrImageNeverPull",
            message=(
                f"image {image!r} is not one of this project's images ({', '.join(sorted(PROJECT_IMAGES))}); "
                "the local node runs only those, from this checkout's environment"
            ),
        )
    return found
