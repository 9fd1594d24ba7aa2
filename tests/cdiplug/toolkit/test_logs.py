"""cdiplug.toolkit.logs: the text and JSON log formats, through real ``logging`` records into a StringIO.

Covers: one JSON object per line with time, level, logger, message and the resource/device fields
when given; tracebacks; the text format with its context; setting up twice does not double lines.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from cdiplug.toolkit.logs import setup_logging


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_json_lines(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("json", stream=out)
    log = logging.getLogger("cdiplug.deviceplugin.frontend")
    log.info("allocated %s", "fpga-0", extra={"resource": "example.com/fpga", "device": "fpga-0"})
    log.warning("no context here")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["time"])
    assert first == {
        "time": first["time"],
        "level": "INFO",
        "logger": "cdiplug.deviceplugin.frontend",
        "message": "allocated fpga-0",
        "resource": "example.com/fpga",
        "device": "fpga-0",
    }
    assert "resource" not in second and "device" not in second
    assert second["level"] == "WARNING"


def test_json_carries_the_traceback_on_one_line(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("json", stream=out)
    try:
        raise ValueError('bad "quote"\nand newline')
    except ValueError:
        logging.getLogger("cdiplug.toolkit.supervisor").exception("task failed", extra={"resource": "r/x"})
    [line] = out.getvalue().splitlines()
    entry = json.loads(line)
    assert "ValueError" in entry["exception"] and "Traceback" in entry["exception"]
    assert entry["resource"] == "r/x"


def test_text_lines(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("text", level="DEBUG", stream=out)
    logging.getLogger("cdiplug.deviceplugin.server").debug("stream opened", extra={"resource": "example.com/fpga"})
    logging.getLogger("cdiplug.deviceplugin.allocator").info(
        "prepared", extra={"resource": "example.com/nic", "device": "0000:3b:00.1"}
    )
    first, second = out.getvalue().splitlines()
    assert re.fullmatch(r"\S+Z DEBUG cdiplug\.deviceplugin\.server \[example\.com/fpga\]: stream opened", first)
    assert second.endswith("INFO cdiplug.deviceplugin.allocator [example.com/nic 0000:3b:00.1]: prepared")


def test_setting_up_twice_does_not_double_lines(restore_root: None) -> None:
    first, second = io.StringIO(), io.StringIO()
    setup_logging("text", stream=first)
    setup_logging("json", stream=second)
    logging.getLogger("cdiplug").info("once")
    assert first.getvalue() == ""
    assert len(second.getvalue().splitlines()) == 1


def test_unknown_format_is_refused(restore_root: None) -> None:
    with pytest.raises(ValueError, match="text, json"):
        setup_logging("xml")
