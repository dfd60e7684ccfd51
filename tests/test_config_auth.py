"""Caller auth, secrets and managed credential mode (R-CFG-12, R-AUTH-2..4, R-MGD-1)."""

from __future__ import annotations

import pytest

from catalog.config import ProviderAuth, SecretRef, load_snapshot
from tests.support.config import load_issues
from tests.support.config_examples import example_document

HASH_A, HASH_B = "a" * 64, "b" * 64
RAW_SECRET = "sk-live-DO-NOT-ECHO-0123456789"


def _token(ref: str, digest: str, principal: str = "team", **extra) -> dict:
    return {"token_ref": ref, "token_hash_sha256": digest, "principal_ref": principal, **extra}


def _managed(document: dict) -> dict:
    """Turn the example into a valid managed-mode document."""
    document["edge"]["tls"] = {"cert_file": "/etc/iop/edge.crt", "key_file": "/etc/iop/edge.key"}
    document["openai"]["tls"] = {"cert_file": "/etc/iop/api.crt", "key_file": "/etc/iop/api.key"}
    document["credential_plane"] = {
        "enabled": True,
        "issuer": {"key_id": "edge-issuer-1", "private_key_file": "/etc/iop/issuer.key"},
        "keyring_file": "/etc/iop/keyring.json",
    }
    for node in document["nodes"]:
        node["credential_recipient"] = {
            "key_id": f"{node['id']}-1",
            "public_key_file": f"/etc/iop/{node['id']}.pub",
        }
    return document


def test_principal_tokens_load_with_optional_alias_r_cfg_12():
    """R-CFG-12: entries hold token_ref, sha256, principal_ref and an optional alias."""
    document = example_document()
    document["openai"]["principal_tokens"] = [
        _token("app-a", HASH_A, alias="notebook"),
        _token("app-b", HASH_B),
    ]
    snapshot = load_snapshot(document)
    first, second = snapshot.principal_tokens
    assert (first.token_ref, first.principal_ref, first.alias) == ("app-a", "team", "notebook")
    assert second.alias is None
    assert {t.token_hash_sha256: t for t in snapshot.principal_tokens}[HASH_B] is second


def test_entries_may_share_a_principal_ref_r_cfg_12():
    """R-CFG-12: several tokens per principal; token_ref is the per-app unit."""
    document = example_document()
    document["openai"]["principal_tokens"] = [_token("a", HASH_A), _token("b", HASH_B)]
    refs = {t.principal_ref for t in load_snapshot(document).principal_tokens}
    assert refs == {"team"}


def test_duplicate_token_ref_and_hash_are_rejected_r_cfg_12():
    """R-CFG-12: a repeated token_ref or token_hash_sha256 is a load error."""
    document = example_document()
    document["openai"]["principal_tokens"] = [
        _token("a", HASH_A),
        _token("a", HASH_B),
        _token("c", HASH_A),
    ]
    assert load_issues(document) == [
        "openai.principal_tokens[1].token_ref: duplicate (first at openai.principal_tokens[0])",
        "openai.principal_tokens[2].token_hash_sha256: duplicate "
        "(first at openai.principal_tokens[0])",
    ]


@pytest.mark.parametrize("digest", ["A" * 64, "a" * 63, "g" * 64, RAW_SECRET])
def test_token_hash_must_be_lowercase_sha256_hex_and_is_never_echoed_r_cfg_12(digest):
    """R-CFG-12: only sha256 hex is stored; a raw token pasted here is not repeated back."""
    document = example_document()
    document["openai"]["principal_tokens"] = [_token("a", digest)]
    messages = load_issues(document)
    assert messages == [
        "openai.principal_tokens[0].token_hash_sha256: "
        "must be 64 lowercase hex characters (a sha256 digest)"
    ]
    assert digest not in "\n".join(messages)


def test_provider_auth_defaults_r_auth_2():
    """R-AUTH-2: omitted provider_auth fields take the documented defaults."""
    document = example_document()
    assert load_snapshot(document).provider_auth == ProviderAuth(
        enabled=False,
        from_header="X-IOP-Provider-Authorization",
        target_header="Authorization",
        scheme="Bearer",
        required=True,
    )
    document["openai"]["provider_auth"] = {"enabled": True}
    auth = load_snapshot(document).provider_auth
    assert auth.enabled and auth.required and auth.from_header == "X-IOP-Provider-Authorization"


def test_provider_auth_fields_are_validated_r_auth_2():
    """R-AUTH-2: header names are HTTP tokens; the inbound one may not contain '_'."""
    document = example_document()
    document["openai"]["provider_auth"] = {
        "enabled": True,
        "from_header": "X_Provider_Key",
        "target_header": "bad header",
        "scheme": "two words",
        "required": "no",
    }
    assert load_issues(document) == [
        "openai.provider_auth.from_header: must not contain '_'",
        "openai.provider_auth.required: must be true or false",
        "openai.provider_auth.scheme: must be a single token",
        "openai.provider_auth.target_header: must be an HTTP header name (RFC 9110 token)",
    ]


@pytest.mark.parametrize(
    "header", ["Authorization", "x-api-key", "X-API-KEY", "Cookie", "X-IOP-Node-Id"]
)
@pytest.mark.parametrize("enabled", [True, False])
def test_rauth2_provider_auth_may_not_read_a_header_the_edge_authenticates_with(header, enabled):
    """R-AUTH-2: forwarding the caller's own Edge credential upstream is refused at load,
    in any letter case, whether forwarding is on or off."""
    document = example_document()
    document["openai"]["provider_auth"] = {"enabled": enabled, "from_header": header}
    issues = load_issues(document)
    assert len(issues) == 1
    assert issues[0].startswith(f"openai.provider_auth.from_header: must not be {header}:")
    assert "X-IOP-Provider-Authorization" in issues[0]


def test_rauth2_provider_auth_from_a_header_of_its_own_loads():
    """R-AUTH-2: any other header name is fine."""
    document = example_document()
    document["openai"]["provider_auth"] = {"enabled": True, "from_header": "X-Upstream-Key"}
    assert load_snapshot(document).provider_auth.from_header == "X-Upstream-Key"


@pytest.mark.parametrize(
    ("where", "path"),
    [
        (("openai", "bearer_token"), "openai.bearer_token"),
        (("openai", "metrics_token"), "openai.metrics_token"),
    ],
)
def test_literal_secret_is_rejected_without_echo(where, path):
    """Secrets are references only; the literal value never appears in the error."""
    document = example_document()
    document[where[0]][where[1]] = RAW_SECRET
    messages = load_issues(document)
    assert messages == [
        f"{path}: must be a secret reference {{env: NAME}} or {{file: PATH}}; literals not allowed"
    ]
    assert RAW_SECRET not in "\n".join(messages)


def test_literal_provider_credential_and_cli_env_are_rejected_without_echo():
    document = example_document()
    document["nodes"][0]["providers"][0]["credential"] = RAW_SECRET
    document["nodes"][0]["providers"][2]["env"] = {"API_KEY": RAW_SECRET, "OK": {"env": "X"}}
    messages = load_issues(document)
    assert [m.split(":")[0] for m in messages] == [
        "nodes[0].providers[0].credential",
        "nodes[0].providers[2].env.API_KEY",
    ]
    assert RAW_SECRET not in "\n".join(messages)


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ({}, "a secret reference needs exactly one of env or file"),
        ({"env": "A", "file": "/x"}, "a secret reference needs exactly one of env or file"),
        ({"env": "1BAD"}, "env: must be an environment variable name"),
        ({"vault": "x"}, "vault: unknown key"),
    ],
)
def test_secret_reference_shape(ref, message):
    document = example_document()
    document["openai"]["bearer_token"] = ref
    separator = "." if ":" in message else ": "
    assert load_issues(document) == [f"openai.bearer_token{separator}{message}"]


def test_secret_references_load_and_stay_references_in_the_document():
    document = example_document()
    document["openai"]["bearer_token"] = {"env": "IOP_OPENAI_TOKEN"}
    document["openai"]["metrics_token"] = {"file": "/run/secrets/metrics"}
    document["nodes"][0]["providers"][0]["credential"] = {"env": "UPSTREAM_KEY"}
    document["nodes"][0]["providers"][2]["env"] = {"TOOL_KEY": {"file": "/run/secrets/tool"}}
    snapshot = load_snapshot(document)
    assert snapshot.bearer_token == SecretRef(env="IOP_OPENAI_TOKEN")
    assert snapshot.metrics_token == SecretRef(file="/run/secrets/metrics")
    assert snapshot.providers["compat-a"].credential == SecretRef(env="UPSTREAM_KEY")
    assert snapshot.providers["cli-a"].env["TOOL_KEY"] == SecretRef(file="/run/secrets/tool")
    assert snapshot.document["openai"]["bearer_token"] == {"env": "IOP_OPENAI_TOKEN"}
    assert snapshot.document["nodes"][0]["providers"][2]["env"] == {
        "TOOL_KEY": {"file": "/run/secrets/tool"}
    }


def test_secret_ref_resolves_env_and_file(monkeypatch, tmp_path):
    monkeypatch.setenv("IOP_TEST_SECRET", "value-from-env")
    assert SecretRef(env="IOP_TEST_SECRET").resolve() == "value-from-env"
    secret_file = tmp_path / "token"
    secret_file.write_text("value-from-file\n")
    assert SecretRef(file=str(secret_file)).resolve() == "value-from-file"


def test_secret_ref_failures_name_the_reference_never_a_value(monkeypatch, tmp_path):
    from catalog.config import SecretUnavailableError

    monkeypatch.delenv("IOP_TEST_MISSING", raising=False)
    with pytest.raises(SecretUnavailableError, match=r"\{env: IOP_TEST_MISSING\}.*not set"):
        SecretRef(env="IOP_TEST_MISSING").resolve()
    missing = tmp_path / "absent"
    with pytest.raises(SecretUnavailableError, match="cannot read file") as caught:
        SecretRef(file=str(missing)).resolve()
    assert str(missing) in str(caught.value)
    monkeypatch.setenv("IOP_TEST_BLANK", "  ")
    with pytest.raises(SecretUnavailableError, match="empty"):
        SecretRef(env="IOP_TEST_BLANK").resolve()


def test_secret_ref_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one"):
        SecretRef()
    with pytest.raises(ValueError, match="exactly one"):
        SecretRef(env="A", file="/b")
    assert str(SecretRef(env="A")) == "{env: A}" and str(SecretRef(file="/b")) == "{file: /b}"


def test_credential_headers_must_come_from_a_secret_reference():
    """Static headers are non-secret: Authorization-like names are rejected."""
    document = example_document()
    document["nodes"][0]["providers"][0]["headers"] = {
        "Authorization": RAW_SECRET,
        "X-Api-Key": RAW_SECRET,
        "X-Team": "research",
    }
    messages = load_issues(document)
    assert [m.split(":")[0] for m in messages] == [
        "nodes[0].providers[0].headers.Authorization",
        "nodes[0].providers[0].headers.X-Api-Key",
    ]
    assert RAW_SECRET not in "\n".join(messages)
    del document["nodes"][0]["providers"][0]["headers"]["Authorization"]
    del document["nodes"][0]["providers"][0]["headers"]["X-Api-Key"]
    assert dict(load_snapshot(document).providers["compat-a"].headers) == {"X-Team": "research"}


def test_user_info_in_any_endpoint_is_rejected_without_echo():
    """Credentials never ride in URLs (R-AUTH-3 rejects endpoint user-info)."""
    url = f"https://user:{RAW_SECRET}@up.example/v1"
    document = example_document()
    document["nodes"][0]["providers"][0]["base_url"] = url
    document["protocol_profiles"] = {
        "p": {
            "base": "openai",
            "base_url": url,
            "operations": {"models": url + "/models"},
            "capabilities": ["models"],
        },
    }
    messages = load_issues(document)
    assert [m.split(":")[0] for m in messages] == [
        "nodes[0].providers[0].base_url",
        "protocol_profiles.p.base_url",
        "protocol_profiles.p.operations.models",
    ]
    assert RAW_SECRET not in "\n".join(messages)


def test_managed_mode_loads_with_tls_everywhere_and_its_keys_r_auth_3_r_mgd_4():
    """R-AUTH-3, R-MGD-4: a managed document with Edge and OpenAI TLS, the issuer key, the
    keyring and every Node's recipient key loads."""
    snapshot = load_snapshot(_managed(example_document()))
    assert snapshot.credential_plane_enabled is True
    assert snapshot.edge_tls is not None and snapshot.edge_tls.cert_file == "/etc/iop/edge.crt"
    assert snapshot.openai_tls is not None
    plane = snapshot.credential_plane
    assert plane is not None
    assert (plane.issuer.key_id, plane.issuer.path) == ("edge-issuer-1", "/etc/iop/issuer.key")
    assert (plane.keyring_file, plane.envelope_ttl_s) == ("/etc/iop/keyring.json", 60)
    recipient = snapshot.nodes[0].credential_recipient
    assert recipient is not None and recipient.path == f"/etc/iop/{snapshot.nodes[0].id}.pub"


def test_managed_mode_requires_tls_keys_and_recipients_r_auth_3_r_mgd_4():
    """R-AUTH-3: managed mode needs edge.tls and openai.tls when enabled; R-MGD-4: the issuer
    key, the keyring and a recipient key on every Node (a Node without one is refused)."""
    document = example_document()
    document["credential_plane"] = {"enabled": True}
    need = "is required when credential_plane.enabled (managed mode)"
    assert load_issues(document) == [
        f"credential_plane.issuer: {need}",
        f"credential_plane.keyring_file: {need}",
        f"edge.tls: {need}",
        f"nodes[0].credential_recipient: {need}",
        f"openai.tls: {need} and openai.enabled",
    ]


def test_an_external_control_plane_is_refused_with_the_reason_r_mgd_1():
    """R-MGD-1: the catalog is the control plane; credential_plane.control_plane is refused,
    managed or not."""
    for enabled in (True, False):
        document = _managed(example_document())
        document["credential_plane"]["enabled"] = enabled
        document["credential_plane"]["control_plane"] = {"url": "https://cp.example"}
        assert load_issues(document) == [
            "credential_plane.control_plane: is not supported: the control plane is this "
            "Edge's catalog (credential slots and routes in its database); remove the key"
        ]


def test_managed_mode_without_openai_ingress_needs_no_openai_tls_r_auth_3():
    """R-AUTH-3: OpenAI ingress TLS is required only when the ingress is enabled."""
    document = _managed(example_document())
    del document["openai"]["tls"]
    document["openai"]["enabled"] = False
    assert load_snapshot(document).openai_enabled is False


def test_managed_mode_rejects_every_legacy_credential_source_r_auth_3():
    """R-AUTH-3: bearer token, principal tokens, provider_auth, provider credential/headers/env."""
    document = _managed(example_document())
    document["openai"]["bearer_token"] = {"env": "T"}
    document["openai"]["principal_tokens"] = [_token("a", HASH_A)]
    document["openai"]["provider_auth"] = {"enabled": True}
    providers = document["nodes"][0]["providers"]
    providers[0]["credential"] = {"env": "K"}
    providers[0]["headers"] = {"X-Team": "r"}
    providers[2]["env"] = {"K": {"env": "K"}}
    why = "is not allowed when credential_plane.enabled (managed mode)"
    assert load_issues(document) == [
        f"nodes[0].providers[0].credential: {why}",
        f"nodes[0].providers[0].headers: {why}",
        f"nodes[0].providers[2].env: {why}",
        f"openai.bearer_token: {why}",
        f"openai.principal_tokens: {why}",
        f"openai.provider_auth.enabled: {why}",
    ]


def test_legacy_mode_keeps_provider_auth_available_r_auth_3():
    """R-AUTH-3: outside managed mode provider_auth forwarding stays configurable."""
    document = example_document()
    document["openai"]["provider_auth"] = {"enabled": True, "required": False}
    assert load_snapshot(document).provider_auth.required is False


def test_key_material_is_only_ever_a_file_reference_r_auth_4():
    """R-AUTH-4: certificate/key values are file paths; inline PEM is rejected, not echoed."""
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQ\n-----END PRIVATE KEY-----"
    document = _managed(example_document())
    document["edge"]["tls"]["key_file"] = pem
    document["credential_plane"]["issuer"]["private_key_file"] = pem
    document["nodes"][0]["credential_recipient"]["public_key_file"] = pem
    inline = "must be a file path; inline key or certificate material is not allowed"
    messages = load_issues(document)
    assert messages == [
        f"credential_plane.issuer.private_key_file: {inline}",
        f"edge.tls.key_file: {inline}",
        f"nodes[0].credential_recipient.public_key_file: {inline}",
    ]
    assert "MIIEvQ" not in "\n".join(messages)


def test_admin_listen_must_be_loopback():
    """R-REF-1 (config side): the refresh listener binds loopback only."""
    for host in ("127.0.0.1", "127.8.9.10", "[::1]", "localhost"):
        document = example_document()
        document["admin"]["listen"] = f"{host}:7701"
        assert load_snapshot(document).admin_listen.port == 7701
    for host in ("0.0.0.0", "10.0.0.5", "[::]", "example.com"):
        document = example_document()
        document["admin"]["listen"] = f"{host}:7701"
        assert load_issues(document) == [
            "admin.listen: must be a loopback address (127.0.0.0/8, ::1 or localhost)"
        ]


def test_credential_env_names_a_managed_cli_programs_slot_secret_variable_r_mgd_11():
    """R-MGD-11: a managed cli provider names the environment variable its slot secret goes
    in; it reaches the Node's payload. A name that changes how programs load is refused on
    the Edge as on the Node (R-TLS-3); the key is for cli providers in managed mode only."""
    from nodes.payload import compile_payload

    document = _managed(example_document())
    providers = document["nodes"][0]["providers"]
    assert providers[2]["type"] == "cli"
    providers[2]["credential_env"] = "TOOL_API_KEY"
    snapshot = load_snapshot(document)
    payload = compile_payload(snapshot, document["nodes"][0]["id"])
    cli = next(p for p in payload.providers if p.id == providers[2]["id"])
    assert cli.credential_env == "TOOL_API_KEY"
    providers[2]["credential_env"] = "LD_PRELOAD"
    providers[0]["credential_env"] = "KEY"
    assert load_issues(document) == [
        "nodes[0].providers[0].credential_env: is only for cli providers",
        "nodes[0].providers[2].credential_env: is refused: LD_PRELOAD changes how programs "
        "load or what they run",
    ]
    legacy = example_document()
    legacy["nodes"][0]["providers"][2]["credential_env"] = "TOOL_API_KEY"
    legacy["nodes"][0]["providers"][2]["env"] = {"PYTHONPATH": {"env": "X"}}
    assert load_issues(legacy) == [
        "nodes[0].providers[2].credential_env: is only used in managed mode "
        "(credential_plane.enabled); otherwise give the program its secrets with env",
        "nodes[0].providers[2].env.PYTHONPATH: is refused: PYTHONPATH changes how programs "
        "load or what they run",
    ]
