"""Caller auth (R-AUTH-1) and caller-supplied provider credentials (R-AUTH-2, R-AUTH-3)."""

from __future__ import annotations

import hashlib
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from catalog.config import load_snapshot, parse_text
from catalog.config.snapshot import ProviderAuth
from pool.http.auth import AuthTable, Caller, ProviderAuthRule
from pool.http.errors import HttpError
from tests.support.processes import EDGE_YAML

APP_TOKEN = "tok-app-a-0123456789"
BEARER = "tok-legacy-bearer-42"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def snapshot(**openai: Any) -> Any:
    doc = {
        "edge": {"id": "e", "listen": "127.0.0.1:17000"},
        "admin": {"listen": "127.0.0.1:17001"},
        "openai": {"listen": "127.0.0.1:17002", **openai},
        "nodes": [
            {
                "id": "n1",
                "token_hash_sha256": sha("node"),
                "providers": [
                    {"id": "p1", "profile": "openai", "base_url": "http://127.0.0.1:9/v1"}
                ],
            }
        ],
        "models": [{"id": "m", "providers": {"p1": "served"}}],
    }
    return load_snapshot(doc)


def h(**headers: str) -> dict[bytes, bytes]:
    return {k.replace("_", "-").encode(): v.encode() for k, v in headers.items()}


PRINCIPALS = [
    {"token_ref": "app-a", "token_hash_sha256": sha(APP_TOKEN), "principal_ref": "team-a"},
    {"token_ref": "app-b", "token_hash_sha256": sha("other"), "principal_ref": "team-a"},
]


def test_a_principal_token_authenticates_with_its_labels_r_auth_1() -> None:
    table = AuthTable(snapshot(principal_tokens=PRINCIPALS))
    caller = table.authenticate(h(authorization=f"Bearer {APP_TOKEN}"), x_api_key=False)
    assert caller == Caller(principal_ref="team-a", token_ref="app-a")
    assert table.authenticate(h(authorization="bearer other"), False).token_ref == "app-b"


def test_the_legacy_bearer_token_authenticates_without_labels(monkeypatch: Any) -> None:
    monkeypatch.setenv("T_EDGE_BEARER", BEARER)
    table = AuthTable(snapshot(bearer_token={"env": "T_EDGE_BEARER"}))
    assert table.authenticate(h(authorization=f"Bearer {BEARER}"), False) == Caller(None, None)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong"},
        {"authorization": f"Basic {APP_TOKEN}"},
        {"authorization": "Bearer "},
        {"x_api_key": APP_TOKEN},  # x-api-key only on the Anthropic shape
    ],
)
def test_anything_else_is_invalid_api_key(headers: dict[str, str]) -> None:
    table = AuthTable(snapshot(principal_tokens=PRINCIPALS))
    with pytest.raises(HttpError) as caught:
        table.authenticate(h(**headers), x_api_key=False)
    assert (caught.value.status, caught.value.code) == (401, "invalid_api_key")


def test_x_api_key_works_on_the_anthropic_shape() -> None:
    table = AuthTable(snapshot(principal_tokens=PRINCIPALS))
    assert table.authenticate(h(x_api_key=APP_TOKEN), x_api_key=True).token_ref == "app-a"


def test_an_unset_bearer_secret_authenticates_nobody(caplog: Any) -> None:
    table = AuthTable(snapshot(bearer_token={"env": "T_EDGE_UNSET_VAR"}))
    with pytest.raises(HttpError):
        table.authenticate(h(authorization="Bearer some-token"), False)
    assert "T_EDGE_UNSET_VAR" in caplog.text  # the reference is named, never a value


def test_with_no_token_configured_every_request_is_refused() -> None:
    with pytest.raises(HttpError):
        AuthTable(snapshot()).authenticate(h(authorization="Bearer anything"), False)


def rule(managed: bool = False, **auth: Any) -> ProviderAuthRule:
    return ProviderAuthRule(
        SimpleNamespace(provider_auth=ProviderAuth(**auth), credential_plane_enabled=managed)
    )


def test_forwarding_is_off_by_default_and_the_header_goes_nowhere() -> None:
    assert rule().forward_headers(h(x_iop_provider_authorization="sk-caller")) == ()


def test_legacy_forwarding_puts_the_caller_key_on_the_target_header_r_auth_2() -> None:
    on = rule(enabled=True)
    assert on.forward_headers(h(x_iop_provider_authorization="sk-caller")) == (
        ("Authorization", "Bearer sk-caller"),
    )
    # a value that already carries the scheme is not doubled
    assert on.forward_headers(h(x_iop_provider_authorization="Bearer sk-caller")) == (
        ("Authorization", "Bearer sk-caller"),
    )
    custom = rule(enabled=True, from_header="X-Key", target_header="x-api-key", scheme="")
    assert custom.forward_headers(h(x_key="sk-2")) == (("x-api-key", "sk-2"),)


def test_a_required_missing_provider_key_is_401_and_an_optional_one_forwards_nothing() -> None:
    with pytest.raises(HttpError) as caught:
        rule(enabled=True).forward_headers({})
    assert caught.value.code == "invalid_api_key"
    assert caught.value.param == "X-IOP-Provider-Authorization"
    assert rule(enabled=True, required=False).forward_headers({}) == ()


def test_managed_mode_refuses_caller_provider_credentials_r_auth_3() -> None:
    managed = rule(managed=True)
    with pytest.raises(HttpError) as caught:
        managed.forward_headers(h(x_iop_provider_authorization="sk-caller"))
    assert (caught.value.status, caught.value.code) == (400, "provider_credential_refused")
    assert "sk-caller" not in caught.value.message
    assert managed.forward_headers({}) == ()


def test_the_shipped_example_authenticates_without_a_warning(caplog: Any, monkeypatch: Any) -> None:
    """The quickstart's first request logs nothing about an unset legacy bearer token."""
    monkeypatch.delenv("IOP_OPENAI_TOKEN", raising=False)
    example = load_snapshot(parse_text(EDGE_YAML.read_bytes()))
    with pytest.raises(HttpError):
        AuthTable(example).authenticate(h(authorization="Bearer not-a-token"), False)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
