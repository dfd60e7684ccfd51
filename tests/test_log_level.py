"""``LOG_LEVEL`` on the Edge and ``--log-level`` on the Node take the documented level names
in any case, and refuse anything else naming the values (docs/configuration.md, "Logs,
traces and the request log")."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from iop_site.env import LOG_LEVELS, env_log_level
from nodes.agent.cli import _parser


def test_the_edge_takes_each_level_in_any_case_and_defaults_to_info(monkeypatch):
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    assert env_log_level() == "INFO"
    for level in LOG_LEVELS:
        monkeypatch.setenv("LOG_LEVEL", f" {level.lower()} ")
        assert env_log_level() == level


def test_the_edge_refuses_an_unknown_level_naming_the_values(monkeypatch):
    monkeypatch.setenv("LOG_LEVEL", "loud")
    with pytest.raises(ImproperlyConfigured, match=r"LOG_LEVEL: one of DEBUG, INFO, .*'loud'"):
        env_log_level()


def test_the_node_takes_the_same_levels_and_refuses_others(capsys):
    assert _parser().parse_args(["--config", "n.yaml"]).log_level == "INFO"
    assert _parser().parse_args(["--config", "n.yaml", "--log-level", "debug"]).log_level == "DEBUG"
    with pytest.raises(SystemExit):
        _parser().parse_args(["--config", "n.yaml", "--log-level", "loud"])
    assert "invalid choice: 'LOUD'" in capsys.readouterr().err
