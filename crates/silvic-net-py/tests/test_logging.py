"""The library's tracing events reach Python's logging, under the logger "silvic_net"."""

from __future__ import annotations

import logging

import pytest

from silvic_net import TcpCollective
from test_binding import form


def silvic_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.split(".")[0] == "silvic_net"]


def test_a_short_token_warning_reaches_the_silvic_net_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="silvic_net")
    rings = form(2, tokens=["tok-4821"] * 2)
    assert all(isinstance(ring, TcpCollective) for ring in rings), rings
    warnings = [
        r
        for r in silvic_records(caplog)
        if r.levelno == logging.WARNING and "shorter than 16 bytes" in r.getMessage()
    ]
    assert len(warnings) == 2, [r.getMessage() for r in caplog.records]  # one per rank
    assert all(r.name.startswith("silvic_net.rendezvous") for r in warnings)
    assert not any("tok-4821" in r.getMessage() for r in caplog.records), "the token was logged"


def test_levels_set_on_the_silvic_net_logger_are_obeyed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="silvic_net")
    form(2, tokens=["tok-4821"] * 2)  # warnings seen once: pyo3-log caches the levels
    caplog.clear()
    caplog.set_level(logging.ERROR, logger="silvic_net")
    rings = form(2, tokens=["tok-4821"] * 2)
    assert all(isinstance(ring, TcpCollective) for ring in rings), rings
    assert silvic_records(caplog) == [], [r.getMessage() for r in caplog.records]
    caplog.set_level(logging.INFO, logger="silvic_net")
    form(2, tokens=["tok-4821"] * 2)
    messages = [r.getMessage() for r in silvic_records(caplog)]
    assert any("ring formed" in m for m in messages), messages
