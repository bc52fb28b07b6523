"""Options: one flag and one env variable each, validated at the edge with errors naming both."""

from __future__ import annotations

import dataclasses

import pytest

from ddp_trainer import config
from ddp_trainer.config import Config, parse
from ddp_trainer.errors import ConfigError


def test_every_option_has_a_flag_an_env_variable_and_help() -> None:
    opts = config.options()
    flags = [flag for flag, _, _, _ in opts]
    envs = [env for _, env, _, _ in opts]
    assert len(set(flags)) == len(flags) and len(set(envs)) == len(envs)
    for flag, env, _, help_text in opts:
        assert flag.startswith("--") and help_text
        assert env.startswith(config.ENV_PREFIX) or env in (
            "CHECKPOINT_DIR",
            "METRICS_PORT",
            "TERMINATION_MESSAGE_PATH",
            "TERMINATION_GRACE_SECONDS",
            "MAX_RESTARTS",
        ), env


def test_the_defaults_form_a_valid_config_with_the_documented_values() -> None:
    cfg = parse([], {})
    assert cfg == Config()
    assert cfg.model.model == "resnet50"
    assert cfg.data.data == "synthetic"
    assert cfg.dist.pg_timeout_seconds == 300
    assert cfg.checkpoint.checkpoint_dir == "" and cfg.observe.metrics_port == 0


def test_a_flag_overrides_its_env_variable_which_overrides_the_default() -> None:
    env = {"TRAIN_BATCH_SIZE": "16", "TRAIN_LR": "0.5"}
    cfg = parse(["--batch-size", "8"], env)
    assert cfg.optim.batch_size == 8
    assert cfg.optim.lr == 0.5
    assert cfg.optim.momentum == 0.9


def test_the_operator_variables_set_the_checkpoint_dir_and_metrics_port() -> None:
    cfg = parse([], {"CHECKPOINT_DIR": "/ckpt", "METRICS_PORT": "9400"})
    assert cfg.checkpoint.checkpoint_dir == "/ckpt"
    assert cfg.observe.metrics_port == 9400


@pytest.mark.parametrize(("text", "value"), [("1", True), ("true", True), ("YES", True), ("0", False), ("off", False)])
def test_boolean_env_variables_accept_the_usual_spellings(text: str, value: bool) -> None:
    assert parse([], {"TRAIN_DETERMINISTIC": text}).optim.deterministic is value


def test_boolean_flags_have_a_negative_form() -> None:
    assert parse(["--no-pin-memory"], {}).data.pin_memory is False
    assert parse(["--channels-last"], {}).model.channels_last is True


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--batch-size", "0"], {}, "--batch-size (TRAIN_BATCH_SIZE): is 0, must be at least 1"),
        ([], {"TRAIN_BATCH_SIZE": "many"}, "TRAIN_BATCH_SIZE (for --batch-size): 'many' is not an integer"),
        ([], {"TRAIN_DETERMINISTIC": "maybe"}, "TRAIN_DETERMINISTIC"),
        (["--model", "vgg"], {}, "--model (TRAIN_MODEL): unknown value 'vgg'; choose one of resnet50, resnet18"),
        ([], {"TRAIN_AMP": "fp8"}, "--amp (TRAIN_AMP): unknown value 'fp8'"),
        (["--data", "imagefolder"], {}, "--data-dir (TRAIN_DATA_DIR): is required with --data imagefolder"),
        (["--data", "cifar10", "--data-dir", "/no/such"], {}, "directory '/no/such' does not exist"),
        (["--steps", "0", "--epochs", "0"], {}, "--epochs (TRAIN_EPOCHS): is 0 and so is --steps"),
        (["--lr", "-1"], {}, "--lr (TRAIN_LR): is -1.0, must be positive"),
        ([], {"METRICS_PORT": "70000"}, "--metrics-port (METRICS_PORT): is 70000"),
        (["--pg-timeout-seconds", "0"], {}, "--pg-timeout-seconds (TRAIN_PG_TIMEOUT_SECONDS)"),
        (["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
    ],
)
def test_a_bad_value_raises_a_config_error_naming_the_option(
    argv: list[str], env: dict[str, str], expected: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse(argv, env)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_sections_cannot_be_built_invalid_even_without_the_parser() -> None:
    with pytest.raises(ConfigError, match="--grad-accum-steps"):
        config.OptimConfig(grad_accum_steps=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.OptimConfig().lr = 1.0  # type: ignore[misc]
