"""Options: kw-only dataclasses that generate the CLI flags and the env variables.

Every field is an option. Its flag is ``--field-name`` and its env variable ``TRAIN_FIELD_NAME``
(five fields take the generic names the operator injects: ``CHECKPOINT_DIR``, ``METRICS_PORT``,
``TERMINATION_MESSAGE_PATH``, ``TERMINATION_GRACE_SECONDS`` and ``MAX_RESTARTS``).
Precedence: flag, then env variable, then the default. Validation lives in ``__post_init__`` so a
``Config`` that exists is valid; errors name the flag and the env variable. Torch-free on purpose:
bad options fail in a fraction of a second, before torch is imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, get_args, get_origin, get_type_hints

from ddp_trainer.errors import ConfigError
from ddpjob_contract.pods import (
    DEFAULT_TERMINATION_GRACE_SECONDS,
    ENV_CHECKPOINT_DIR,
    ENV_MAX_RESTARTS,
    ENV_METRICS_PORT,
    ENV_TERMINATION_GRACE_SECONDS,
    ENV_TERMINATION_MESSAGE_PATH,
)

ENV_PREFIX = "TRAIN_"
MESSAGE_PATH_ENV = ENV_TERMINATION_MESSAGE_PATH

ModelName = Literal["resnet50", "resnet18", "tinycnn"]
DataSource = Literal["synthetic", "imagefolder", "cifar10"]
Schedule = Literal["constant", "cosine", "step"]
Amp = Literal["none", "bf16", "fp16"]
Strategy = Literal["ddp", "dp"]


def doc(help: str, *, env: str | None = None) -> dict[str, str | None]:
    """Field metadata of an option: ``help`` documents it, ``env`` overrides its env variable's name."""
    return {"help": help, "env": env}


def flag_name(f: dataclasses.Field[Any]) -> str:
    return "--" + f.name.replace("_", "-")


def env_name(f: dataclasses.Field[Any]) -> str:
    return f.metadata.get("env") or ENV_PREFIX + f.name.upper()


def _option_named(section: object, name: str) -> str:
    f = next(f for f in dataclasses.fields(section) if f.name == name)  # type: ignore[arg-type]
    return f"{flag_name(f)} ({env_name(f)})"


class _Section:
    """Checks Literal choices for every field, then the section's own rules in ``validate``."""

    def __post_init__(self) -> None:
        for name, hint in get_type_hints(type(self)).items():
            if get_origin(hint) is Literal and getattr(self, name) not in get_args(hint):
                choices = ", ".join(get_args(hint))
                self._invalid(name, f"unknown value {getattr(self, name)!r}; choose one of {choices}")
        self.validate()

    def validate(self) -> None:
        """Rules of one section; raise through ``_invalid``."""

    def _invalid(self, name: str, why: str) -> NoReturn:
        raise ConfigError(f"{_option_named(self, name)}: {why}")

    def _at_least(self, name: str, minimum: float) -> None:
        if getattr(self, name) < minimum:
            self._invalid(name, f"is {getattr(self, name)}, must be at least {minimum}")


@dataclass(kw_only=True, frozen=True)
class ModelConfig(_Section):
    model: ModelName = field(
        default="resnet50", metadata=doc("Model: resnet50, resnet18 (torchvision, random init) or tinycnn.")
    )
    image_size: int = field(default=224, metadata=doc("Square image side in pixels; use 32-64 for quick CPU runs."))
    num_classes: int = field(
        default=0, metadata=doc("Number of classes; 0 takes it from the data (1000 for synthetic).")
    )
    channels_last: bool = field(
        default=False, metadata=doc("Use the channels_last memory format (faster convolutions on GPU).")
    )
    compile: bool = field(
        default=False,
        metadata=doc(
            "Compile the model with torch.compile (inside the DDP wrapper). Step 1 then includes the compilation; "
            "a model that fails to compile trains eagerly after one warning line."
        ),
    )

    def validate(self) -> None:
        self._at_least("image_size", 8)
        self._at_least("num_classes", 0)


@dataclass(kw_only=True, frozen=True)
class DataConfig(_Section):
    data: DataSource = field(
        default="synthetic",
        metadata=doc(
            "Data source: synthetic (random images and labels), imagefolder (--data-dir/<class>/<image>) "
            "or cifar10 (the python-pickle batches in --data-dir). Nothing is downloaded."
        ),
    )
    data_dir: str = field(default="", metadata=doc("Directory of the imagefolder or cifar10 data."))
    synthetic_samples: int = field(
        default=1_281_167, metadata=doc("Samples in one synthetic epoch (default: ImageNet's size).")
    )
    num_workers: int = field(
        default=2, metadata=doc("DataLoader worker processes per rank; 0 loads in the training process.")
    )
    pin_memory: bool = field(
        default=True, metadata=doc("Pin host memory for faster copies to the GPU (ignored on CPU).")
    )

    def validate(self) -> None:
        self._at_least("synthetic_samples", 1)
        self._at_least("num_workers", 0)
        if self.data != "synthetic":
            if not self.data_dir:
                self._invalid("data_dir", f"is required with --data {self.data}; point it at the data")
            if not os.path.isdir(self.data_dir):
                self._invalid("data_dir", f"directory {self.data_dir!r} does not exist; fix the path")


@dataclass(kw_only=True, frozen=True)
class OptimConfig(_Section):
    batch_size: int = field(
        default=32, metadata=doc("Batch size per rank (per micro-batch when accumulating gradients).")
    )
    steps: int = field(
        default=0, metadata=doc("Optimizer steps to train for; 0 means run --epochs full epochs instead.")
    )
    epochs: int = field(default=1, metadata=doc("Epochs to train for when --steps is 0."))
    grad_accum_steps: int = field(
        default=1, metadata=doc("Micro-batches per optimizer step; gradients sync only on the last.")
    )
    lr: float = field(default=0.1, metadata=doc("Peak learning rate of SGD."))
    lr_schedule: Schedule = field(
        default="cosine", metadata=doc("Schedule after warm-up: constant, cosine (to 0) or step.")
    )
    lr_warmup_steps: int = field(default=0, metadata=doc("Steps of linear warm-up from 0 to --lr."))
    lr_step_size: int = field(
        default=1000, metadata=doc("With --lr-schedule step: multiply the lr by --lr-gamma every this many steps.")
    )
    lr_gamma: float = field(default=0.1, metadata=doc("With --lr-schedule step: the decay factor."))
    momentum: float = field(default=0.9, metadata=doc("SGD momentum."))
    weight_decay: float = field(default=1e-4, metadata=doc("SGD weight decay."))
    amp: Amp = field(
        default="none", metadata=doc("Automatic mixed precision: none, bf16, or fp16 (with a gradient scaler).")
    )
    seed: int = field(default=0, metadata=doc("Seed for model init, data order and augmentation."))
    deterministic: bool = field(
        default=False, metadata=doc("Use deterministic algorithms only (bit-exact resume; slower on GPU).")
    )

    def validate(self) -> None:
        self._at_least("batch_size", 1)
        self._at_least("steps", 0)
        self._at_least("epochs", 0)
        if self.steps == 0 and self.epochs == 0:
            self._invalid("epochs", "is 0 and so is --steps; set one of them")
        self._at_least("grad_accum_steps", 1)
        if self.lr <= 0:
            self._invalid("lr", f"is {self.lr}, must be positive")
        self._at_least("lr_warmup_steps", 0)
        self._at_least("lr_step_size", 1)
        self._at_least("momentum", 0)
        self._at_least("weight_decay", 0)


@dataclass(kw_only=True, frozen=True)
class DistConfig(_Section):
    strategy: Strategy = field(
        default="ddp",
        metadata=doc(
            "ddp: one process per device (the real thing). dp: single-process nn.DataParallel, "
            "only for measuring the DP vs DDP comparison; never use it for training."
        ),
    )
    bucket_cap_mb: float = field(default=25.0, metadata=doc("DDP gradient bucket size in MiB."))
    static_graph: bool = field(
        default=False,
        metadata=doc(
            "DDP static_graph: the model uses the same parameters every step, so DDP may skip its per-step "
            "search for unused ones. It refuses models whose graph changes between steps; off by default."
        ),
    )
    pg_timeout_seconds: float = field(
        default=300.0,
        metadata=doc("Collective timeout; a rank waiting longer for a peer exits with the retryable code."),
    )
    max_restarts: int = field(
        default=0,
        metadata=doc(
            "Restart the gang's training processes in place up to this many times when one fails in a way a restart "
            "can fix (a lost peer, a collective timeout, killed by a signal): each rank's process stays up as a "
            "supervisor, and its new training process, forked with torch already imported, resumes from the "
            "newest checkpoint. Rank 0's supervisor listens on MASTER_PORT + 1. 0: a failure ends the process (its "
            "launcher restarts it). The operator sets it to the restarts the job has left.",
            env=ENV_MAX_RESTARTS,
        ),
    )

    def validate(self) -> None:
        self._at_least("max_restarts", 0)
        if self.bucket_cap_mb <= 0:
            self._invalid("bucket_cap_mb", f"is {self.bucket_cap_mb}, must be positive")
        if self.pg_timeout_seconds <= 0:
            self._invalid("pg_timeout_seconds", f"is {self.pg_timeout_seconds}, must be positive")


@dataclass(kw_only=True, frozen=True)
class CheckpointConfig(_Section):
    checkpoint_dir: str = field(
        default="",
        metadata=doc(
            "Directory for checkpoints; resume from the latest one in it. Empty: none.", env=ENV_CHECKPOINT_DIR
        ),
    )
    checkpoint_interval: int = field(
        default=0, metadata=doc("Write a checkpoint every this many steps; 0: only at the end.")
    )
    checkpoint_keep: int = field(default=3, metadata=doc("How many complete checkpoints to keep."))
    stop_grace_seconds: float = field(
        default=float(DEFAULT_TERMINATION_GRACE_SECONDS),
        metadata=doc(
            "Time between SIGTERM and SIGKILL (the pod's terminationGracePeriodSeconds; the operator sets it). With "
            "a checkpoint directory, SIGTERM saves one checkpoint at the next step boundary, on every rank's "
            "agreement, and stops; a stop that cannot finish a few seconds before this ends at once, leaving no "
            "partial file. 0: stop at once.",
            env=ENV_TERMINATION_GRACE_SECONDS,
        ),
    )

    def validate(self) -> None:
        self._at_least("checkpoint_interval", 0)
        self._at_least("checkpoint_keep", 1)
        self._at_least("stop_grace_seconds", 0)


@dataclass(kw_only=True, frozen=True)
class ObserveConfig(_Section):
    metrics_port: int = field(
        default=0,
        metadata=doc("Serve Prometheus /metrics on this port + LOCAL_RANK; 0: no server.", env=ENV_METRICS_PORT),
    )
    metrics_linger_seconds: float = field(
        default=0.0,
        metadata=doc(
            "After training ends, keep serving /metrics until every reader (a Prometheus) has read the final values "
            "once more, at most this long."
        ),
    )
    log_interval: int = field(default=10, metadata=doc("Every rank logs one line every this many steps."))
    step_timing: bool = field(
        default=True,
        metadata=doc(
            "Time each step's phases and export them (histograms, loss, img/s in the log); off: only count "
            "steps, with no clock, CUDA event or loss read per step."
        ),
    )

    termination_message_path: str = field(
        default="",
        metadata=doc(
            "At exit, write one line into this file if it exists (the kubelet makes it): the run's JSON summary "
            "(final step, samples, mean step time, samples/s) on success, the one-line error otherwise; empty: none.",
            env=MESSAGE_PATH_ENV,
        ),
    )

    def validate(self) -> None:
        if not 0 <= self.metrics_port <= 65535:
            self._invalid("metrics_port", f"is {self.metrics_port}, must be 0-65535")
        self._at_least("metrics_linger_seconds", 0)
        self._at_least("log_interval", 1)


@dataclass(kw_only=True, frozen=True)
class DebugConfig(_Section):
    slow_rank: int = field(
        default=-1, metadata=doc("Debug: the rank that sleeps --slow-seconds every step (a straggler); -1: none.")
    )
    slow_seconds: float = field(default=0.0, metadata=doc("Debug: how long --slow-rank sleeps each step."))
    slow_until_step: int = field(
        default=0, metadata=doc("Debug: --slow-rank sleeps only in steps up to this one (it recovers); 0: always.")
    )
    crash_at_step: int = field(
        default=0, metadata=doc("Debug: SIGKILL the process after this step (and its checkpoint); 0: never.")
    )
    crash_rank: int = field(default=-1, metadata=doc("Debug: the rank --crash-at-step kills; -1: every rank."))

    def validate(self) -> None:
        self._at_least("slow_rank", -1)
        self._at_least("slow_seconds", 0)
        self._at_least("slow_until_step", 0)
        self._at_least("crash_at_step", 0)
        self._at_least("crash_rank", -1)


SECTIONS: dict[str, type[_Section]] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "dist": DistConfig,
    "checkpoint": CheckpointConfig,
    "observe": ObserveConfig,
    "debug": DebugConfig,
}


@dataclass(kw_only=True, frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _convert(kind: Any, text: str) -> Any:
    """Parse one option value from text; raises ValueError with a message fit for the user."""
    if kind is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"{text!r} is not a boolean; use 1/0, true/false, yes/no")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an integer") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
    return text  # str and Literal: choices are checked in __post_init__ for flags and env alike


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message}; see --help")


def _argument_type(kind: Any, flag: str) -> Any:
    def parse(text: str) -> Any:
        try:
            return _convert(kind, text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = flag  # argparse names the type in some messages
    return parse


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m ddp_trainer",
        description="PyTorch DDP training. Runs alone, under torchrun, or under the DDPJob operator.",
        epilog="Exit codes: 0 done, 2 bad option or data, 200 lost peer or collective timeout (retry), "
        "143 SIGTERM. Distributed setup comes from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.",
    )
    for section_name, section in SECTIONS.items():
        group = parser.add_argument_group(section_name)
        hints = get_type_hints(section)
        for f in dataclasses.fields(section):  # type: ignore[arg-type]
            kind = hints[f.name]
            env = env_name(f)
            default = f.default
            if env in environ:
                try:
                    default = _convert(kind if get_origin(kind) is not Literal else str, environ[env])
                except ValueError as err:
                    raise ConfigError(f"{env} (for {flag_name(f)}): {err}") from None
            shown = "" if f.default == "" else f", default {f.default}"
            help_text = f"{f.metadata['help']} [env {env}{shown}]".replace("%", "%%")
            dest = f"{section_name}.{f.name}"
            if kind is bool:
                group.add_argument(
                    flag_name(f), dest=dest, action=argparse.BooleanOptionalAction, default=default, help=help_text
                )
            else:
                choices = "{" + ",".join(get_args(kind)) + "}" if get_origin(kind) is Literal else None
                group.add_argument(
                    flag_name(f),
                    dest=dest,
                    default=default,
                    type=_argument_type(kind, flag_name(f)),
                    metavar=choices or f.name.upper(),
                    help=help_text,
                )
    return parser


def parse(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Config:
    """Build a valid Config from flags and env variables, or raise ConfigError naming the option."""
    environ = os.environ if environ is None else environ
    values = vars(build_parser(environ).parse_args(list(argv)))
    sections: dict[str, Any] = {}
    for section_name, section in SECTIONS.items():
        prefix = section_name + "."
        kwargs = {k.removeprefix(prefix): v for k, v in values.items() if k.startswith(prefix)}
        sections[section_name] = section(**kwargs)
    return Config(**sections)


def options() -> list[tuple[str, str, Any, str]]:
    """(flag, env, default, help) of every option, for documentation."""
    return [
        (flag_name(f), env_name(f), f.default, f.metadata["help"])
        for section in SECTIONS.values()
        for f in dataclasses.fields(section)  # type: ignore[arg-type]
    ]
