"""Every command's --help, as an operator reads it: no value placeholders on flags, every option explained."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def help_text(*command: str) -> str:
    env = {**os.environ, "COLUMNS": "200"}  # one line per option, whatever terminal runs the tests
    result = subprocess.run([str(BIN / command[0]), *command[1:], "--help"], capture_output=True, text=True,
                            timeout=60, check=False, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("command", [("gpushare",), ("gpushare", "scheduler-config"), ("gpushare", "demo")])
def test_gpushare_flags_take_no_value_placeholder(command: tuple[str, ...]) -> None:
    # typer 0.29 renders a "<bool>" type next to flags such as --help, which take no value; pyproject caps it.
    text = help_text(*command)
    assert "--help" in text
    assert "<bool>" not in text


@pytest.mark.parametrize("command", ["gpushare-extender", "gpushare-device-plugin", "gpushare-local-cluster"])
def test_log_level_is_documented(command: str) -> None:
    # argparse prints an option's help after its choices; without help the next option or the end follows.
    assert re.search(r"^ +--log-level \{[A-Z,]+\}\s+[a-z]", help_text(command), re.MULTILINE), help_text(command)
