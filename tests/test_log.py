from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from nanobot import log


@pytest.fixture
def log_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "logs"
    logger.remove()


def read(log_dir: Path) -> str:
    logger.complete()
    return (log_dir / "nanobot.log").read_text(encoding="utf-8")


def test_secret_values_are_redacted_everywhere(log_dir: Path) -> None:
    log.setup(level="DEBUG", log_dir=log_dir, secrets=["hunter2-secret", "", "abc"])
    logger.info("key is hunter2-secret")
    logging.getLogger("httpx").warning("sent hunter2-secret upstream")
    text = read(log_dir)
    assert "hunter2-secret" not in text
    assert text.count(log.REDACTED) == 2
    assert "sent *** upstream" in text


def test_secret_shapes_are_redacted_without_being_configured(log_dir: Path) -> None:
    log.setup(level="INFO", log_dir=log_dir)
    url = "https://api.telegram.org/bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/getMe"
    logging.getLogger("httpx").warning("HTTP Request: POST %s", url)
    logger.warning("using sk-proj-abcdefghijklmnop")
    text = read(log_dir)
    assert "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw" not in text
    assert "sk-proj-abcdefghijklmnop" not in text
    assert "/bot***/getMe" in text


def test_exception_text_is_redacted(log_dir: Path) -> None:
    secret = "tok-" + "123456"  # not spelt out here: tracebacks quote source lines
    log.setup(level="INFO", log_dir=log_dir, secrets=[secret])
    try:
        raise RuntimeError(f"auth failed for {secret}")
    except RuntimeError:
        logger.exception("call failed")
    assert secret not in read(log_dir)


def test_library_loggers_are_quieter_unless_debugging(log_dir: Path) -> None:
    log.setup(level="INFO", log_dir=log_dir)
    logging.getLogger("telegram.ext").info("polling noise")
    logger.info("our own line")
    text = read(log_dir)
    assert "polling noise" not in text
    assert "our own line" in text


def test_json_lines(log_dir: Path) -> None:
    log.setup(level="INFO", json=True, log_dir=log_dir, secrets=["s3cr3t-value"])
    logger.info("hello s3cr3t-value")
    line = read(log_dir).strip().splitlines()[-1]
    assert '"text"' in line
    assert "s3cr3t-value" not in line
