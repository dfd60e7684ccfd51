"""Loopback fakes for tests: upstream servers, a CLI tool and the Edge side of the wire."""

from pathlib import Path

from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.base import FakeServer, Faults, Recorded
from tests.fakes.ollama_server import FakeOllama
from tests.fakes.openai_server import FakeOpenAI

CLI_TOOL = str(Path(__file__).with_name("cli_tool.py"))

__all__ = [
    "CLI_TOOL",
    "FakeAnthropic",
    "FakeOllama",
    "FakeOpenAI",
    "FakeServer",
    "Faults",
    "Recorded",
]
