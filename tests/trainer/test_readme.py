"""The docs list every option, exit code and metric the code defines (the trainer page and the reference)."""

from __future__ import annotations

from pathlib import Path

from ddp_trainer import config
from ddpjob_contract import exits, metrics

DOCS = Path(__file__).resolve().parents[2] / "docs"
TRAINER = DOCS / "trainer.md"
REFERENCE = DOCS / "reference.md"


def test_the_trainer_page_lists_every_option_with_its_env_variable() -> None:
    text = TRAINER.read_text()
    for flag, env, _, _ in config.options():
        assert f"`{flag}`" in text, flag
        assert f"`{env}`" in text, env


def test_the_reference_lists_every_exit_code_and_metric() -> None:
    text = REFERENCE.read_text()
    for code in (exits.EXIT_OK, exits.EXIT_BUG, exits.EXIT_PERMANENT, exits.EXIT_RETRYABLE, exits.EXIT_SIGTERM):
        assert f"| {code} |" in text, code
    for name in metrics.ALL:
        assert f"`{name}" in text, name
