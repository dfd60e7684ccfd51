"""The Node policy's matching rules (R-TLS-3, R-TLS-6..9): exact argv and "..." prefixes, every
program (command and probe command), [scheme://]host[:port], the environment allowlist,
secrets by name, single file or directory, a URL that cannot be read."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodes.agent.config import NodeConfigError, parse_config
from nodes.agent.policy import NodePolicy
from nodes.agent.registry import Registry
from nodes.wire import NodePayload, ProviderPayload, SecretRefPayload


def _policy(tmp_path: Path, **policy: object) -> NodePolicy:
    doc = {"node_id": "n", "edge_url": "ws://127.0.0.1:1/ws/node", "token": {"env": "T"}}
    config = parse_config({**doc, "policy": policy}, base_dir=tmp_path)
    assert config.policy is not None
    return config.policy


def _http(url: str, **kw: object) -> ProviderPayload:
    return ProviderPayload(
        id="p", label="p", adapter="openai_compat", driver="openai_chat",
        operations={"chat_completions": url}, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _cli(argv: list[str], **kw: object) -> ProviderPayload:
    return ProviderPayload(id="c", label="c", adapter="cli", driver="cli", command=argv, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "allowed"),
    [
        (["claude", "-p", "--json"], True),
        (["claude", "-p"], True),
        (["claude"], False),  # shorter than the prefix
        (["claude", "--dangerously"], False),
        (["/usr/bin/claude", "-p"], False),  # entries compare exactly, no path lookup
        (["sh", "-c", "claude -p"], False),
        (["ollama", "run"], True),
        (["ollama", "run", "llama3"], False),  # no "...": exactly that argv
    ],
)
def test_a_command_runs_only_as_an_exact_argv_or_under_a_dots_prefix_r_tls_6(
    tmp_path, argv, allowed
):
    """R-TLS-6: exact by default; a last "..." makes an entry a prefix."""
    policy = _policy(tmp_path, commands=["claude -p ...", ["ollama", "run"]])
    refusal = policy.refusal(_cli(argv))
    assert (refusal is None) == allowed
    if not allowed:
        assert argv[0] in refusal  # type: ignore[operator]


@pytest.mark.parametrize(
    ("entry", "argv"),
    [
        (["python3"], ["python3", "-c", "open('marker', 'w')"]),
        (["claude", "-p"], ["claude", "-p", "--dangerously-skip-permissions", "--mcp-config",
                            '{"mcpServers":{"x":{"command":"sh"}}}']),
        (["/usr/bin/ollama", "run"], ["/usr/bin/ollama", "run", "--insecure", "evil.example/m"]),
    ],
)  # fmt: skip
def test_an_old_style_prefix_entry_no_longer_grants_further_arguments_r_tls_6(
    tmp_path, entry, argv
):
    """R-TLS-6, the review's reproductions: each entry now allows exactly its argv, and the
    refusal says what changed."""
    policy = _policy(tmp_path, commands=[entry])
    refusal = policy.refusal(_cli(argv))
    assert refusal is not None
    assert refusal.endswith(
        'is not an allowed command (an entry without a last "..." allows exactly its argv, R-TLS-6)'
    )
    assert policy.refusal(_cli(entry)) is None


def test_the_start_notes_name_interpreter_prefixes_and_what_changed_r_tls_6():
    """R-TLS-6: one warning per prefix on a shell or an interpreter; one line for a policy
    written when entries were prefixes (no "..." anywhere, an entry without a marker)."""
    from nodes.agent.policy_argv import start_notes

    notes = start_notes([["python3.12", "..."], ["/bin/bash", "..."], ["claude", "-p", "..."]])
    assert len(notes) == 2
    assert notes[0].startswith("policy.commands[0] python3.12 ...: a prefix on python3.12")
    assert "lets an Edge run any code" in notes[0] and "policy.commands[1]" in notes[1]
    (old,) = start_notes([["claude", "-p"], ["tool", "$"]])
    assert "now allows exactly its argv" in old and "These entries no longer do: claude -p." in old
    assert start_notes([["claude", "-p"], ["tool", "..."]]) == []  # written for the new meaning
    assert start_notes([["python3", "-c", "print(1)", "$"]]) == []  # exact: no warning


@pytest.mark.parametrize(
    ("name", "allowed"),
    [("GIT_CONFIG_PARAMETERS", False), ("GIT_ASKPASS", False), ("OPENAI_BASE_URL", False),
     ("NODE_TLS_REJECT_UNAUTHORIZED", False), ("ANTHROPIC_API_KEY", True)],
)  # fmt: skip
def test_an_environment_name_runs_only_when_policy_env_lists_it_r_tls_7(tmp_path, name, allowed):
    """R-TLS-7: an allowlist, as a managed credential_env and as a declared cli env name."""
    policy = _policy(tmp_path, commands=[["git", "status"]], env=["ANTHROPIC_API_KEY"],
                     secrets={"env": ["*"]})  # fmt: skip
    ref = SecretRefPayload(env="TOOL_KEY")
    for provider in (
        _cli(["git", "status"], credential_env=name),
        _cli(["git", "status"], env={name: ref}),
    ):
        refusal = policy.refusal(provider)
        assert (refusal is None) == allowed, refusal
        if not allowed:
            assert refusal == f"command environment: {name} is not in policy.env"
    listed = _policy(tmp_path, commands=[["git", "status"]], env=[name])
    assert listed.refusal(_cli(["git", "status"], credential_env=name)) is None


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://api.openai.com/v1/chat/completions", True),
        ("https://eu.api.openai.com/v1/chat/completions", True),
        ("https://openai.com.evil.example/v1", False),
        ("http://api.openai.com/v1/chat/completions", False),  # a bare host is https only
        ("http://127.0.0.1:11434/api/chat", True),
        ("https://127.0.0.1:11434/api/chat", False),  # http:// allows http only
        ("http://127.0.0.1:8080/api/chat", False),  # another port on an allowed host
        ("http://[::1]:9000/v1", True),
        ("http://localhost:11434/api/chat", False),  # names are not resolved
        ("ftp://api.openai.com/v1", False),
    ],
)
def test_an_upstream_url_runs_only_on_an_allowed_scheme_host_and_port_r_tls_3(
    tmp_path, url, allowed
):
    """R-TLS-3 (sharpened): a bare host[:port] allows https only; http must be written."""
    policy = _policy(tmp_path, hosts=["api.openai.com", "*.api.openai.com",
                                      "http://127.0.0.1:11434", "http://[::1]:9000"])  # fmt: skip
    refusal = policy.refusal(_http(url))
    assert (refusal is None) == allowed, refusal


def test_plain_http_to_a_bare_host_policy_is_refused_and_names_the_scheme_r_tls_3(tmp_path):
    """R-TLS-3 (sharpened): `hosts: [api.openai.com]` no longer lets a secret leave in
    cleartext to http://api.openai.com."""
    policy = _policy(tmp_path, hosts=["api.openai.com"])
    refusal = policy.refusal(_http("http://api.openai.com/v1/chat/completions"))
    assert refusal == "upstream http://api.openai.com:80 is not an allowed host"


def test_secrets_are_allowed_by_env_name_pattern_and_by_file_directory(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "keys-evil").mkdir()
    policy = _policy(tmp_path, hosts=["h"], secrets={"env": ["OPENAI_*"], "file_dirs": ["keys"]})
    ok_env = _http("https://h/v1", credential=SecretRefPayload(env="OPENAI_KEY"))
    assert policy.refusal(ok_env) is None
    bad_env = _http("https://h/v1", credential=SecretRefPayload(env="AWS_SECRET"))
    assert "AWS_SECRET" in (policy.refusal(bad_env) or "")
    for path, allowed in [
        (keys / "a.key", True),
        (tmp_path / "single.key", False),
        (keys / ".." / "outside" / "a.key", False),  # no escape by ..
        (tmp_path / "keys-evil" / "a.key", False),  # a sibling with the same prefix
    ]:
        provider = _http("https://h/v1", credential=SecretRefPayload(file=str(path)))
        assert (policy.refusal(provider) is None) == allowed, path
    cli_env = _cli(["x"], env={"TOKEN": SecretRefPayload(env="HOME_TOKEN")})
    policy = _policy(tmp_path, commands=[["x"]], env=["TOKEN"], secrets={"env": ["OPENAI_*"]})
    assert "HOME_TOKEN" in (policy.refusal(cli_env) or "")


def test_a_single_secret_file_allows_that_file_not_its_directory_r_tls_8(tmp_path):
    """R-TLS-8: `secrets.files` (what iop_node_policy prints) allows one file; the node token
    beside it stays out of reach."""
    (tmp_path / "keys").mkdir()
    policy = _policy(tmp_path, hosts=["h"], secrets={"files": ["keys/provider.key"]})
    for name, allowed in [("provider.key", True), ("node.token", False)]:
        ref = SecretRefPayload(file=str(tmp_path / "keys" / name))
        refusal = policy.refusal(_http("https://h/v1", credential=ref))
        assert (refusal is None) == allowed, refusal
    assert refusal == f"credential: secret file {tmp_path}/keys/node.token is not an allowed file"


@pytest.mark.parametrize("url", ["http://[not-an-ip]/v1", "http://[::1/v1", "http://h:99999/v1"])
def test_a_url_the_policy_cannot_read_is_a_refusal_not_an_exception_r_tls_9(tmp_path, url):
    """R-TLS-9: with and without a policy, the provider is refused with the URL escaped."""
    for policy in (_policy(tmp_path, hosts=["*"]), None):
        payload = NodePayload(node_id="n", revision="r", providers=[_http(url)])
        reason = Registry(payload, policy).errors["p"]
        assert (
            reason == f"refused by node policy: upstream {url!r} is not a URL the policy can read"
        )


def test_a_kind_left_out_of_the_policy_allows_nothing_of_that_kind(tmp_path):
    policy = _policy(tmp_path, hosts=["h"])
    assert policy.refusal(_cli(["anything"])) is not None
    assert policy.refusal(_http("https://h/v1", credential=SecretRefPayload(env="K"))) is not None
    assert policy.refusal(_http("https://h/v1")) is None


def test_a_refused_provider_gets_no_adapter_in_the_registry(tmp_path):
    policy = _policy(tmp_path, hosts=["allowed.example"])
    payload = NodePayload(
        node_id="n", revision="r",
        providers=[_http("https://denied.example/v1"), _cli(["rm", "-rf", "/"])],
    )  # fmt: skip
    registry = Registry(payload, policy)
    assert registry.adapters == {}
    assert registry.errors["p"] == (
        "refused by node policy: upstream https://denied.example:443 is not an allowed host"
    )
    assert "c" in registry.errors
    assert "command rm" in registry.errors["c"]


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"hosts": ["h:0"]}, "policy.hosts: h:0: port must be 1..65535"),
        ({"hosts": ["ftp://h"]}, "policy.hosts: ftp://h: the scheme must be http:// or https://"),
        (
            {"hosts": ["https://h/v1"]},
            "policy.hosts: https://h/v1: must be [scheme://]host[:port], without a path",
        ),
        ({"hosts": [":80"]}, "policy.hosts: :80: must name a host"),
        ({"commands": [[]]}, "policy.commands: an argv entry must not be empty"),
        ({"commands": [["..."]]}, "policy.commands: an argv entry must not be empty"),
        (
            {"commands": [["x", "...", "y"]]},
            'policy.commands: x ... y: "..." may only be the last element',
        ),
        ({"env": ["GIT_*"]}, "policy.env: 'GIT_*': an exact environment variable name, no pattern"),
        (
            {"env": ["NODE_OPTIONS"]},
            "policy.env: NODE_OPTIONS changes how programs load or what they run: no policy "
            "may allow it",
        ),
        ({"surprise": 1}, "policy.surprise: unknown key"),
        ({"secrets": {"env": "X"}}, "policy.secrets.env: must be a list"),
    ],
)
def test_a_bad_policy_is_refused_at_load_with_its_path(tmp_path, policy, message):
    with pytest.raises(NodeConfigError) as refused:
        _policy(tmp_path, **policy)
    assert message in refused.value.errors


EDGE_YAML = Path(__file__).resolve().parent.parent / "configs" / "edge.yaml"


def test_iop_node_policy_allows_exactly_the_example_providers_of_that_node(tmp_path):
    """R-TLS-3: what `make run` writes for node-local: every example provider runs, a step
    outside (another command, another port) does not."""
    from io import StringIO

    import msgspec
    import yaml
    from django.core.management import call_command

    from catalog.config import load_snapshot, parse_text
    from nodes.payload import compile_payload

    out = StringIO()
    call_command("iop_node_policy", "node-local", "--config", str(EDGE_YAML), stdout=out)
    policy = _policy(tmp_path, **yaml.safe_load(out.getvalue())["policy"])
    payload = compile_payload(load_snapshot(parse_text(EDGE_YAML.read_text())), "node-local")
    assert {p.id for p in payload.providers} == {"ollama-local", "vllm-local", "echo-cli"}
    assert [policy.refusal(p) for p in payload.providers] == [None, None, None]
    cli = next(p for p in payload.providers if p.command)
    other_cmd = msgspec.structs.replace(cli, command=["python3", "-c", "import os"])
    assert policy.refusal(other_cmd) is not None
    http = next(p for p in payload.providers if p.id == "vllm-local")
    moved = {op: url.replace(":8000", ":8001") for op, url in http.operations.items()}
    assert policy.refusal(msgspec.structs.replace(http, operations=moved)) is not None


@pytest.mark.django_db
def test_iop_node_policy_reads_the_catalog_by_default_as_make_run_does():
    """R-TLS-3: without --config the policy follows the catalog (what `make run` writes)."""
    from io import StringIO

    import yaml
    from django.core.management import CommandError, call_command

    from catalog.config import parse_text
    from catalog.documents import document_to_catalog

    document_to_catalog(parse_text(EDGE_YAML.read_text()))
    out = StringIO()
    call_command("iop_node_policy", "node-local", stdout=out)
    policy = yaml.safe_load(out.getvalue())["policy"]
    assert policy["hosts"] == ["http://127.0.0.1:11434", "http://127.0.0.1:8000"]
    assert policy["commands"] == [["python3", "-c", "import sys; print(sys.stdin.read())", "$"]]
    with pytest.raises(CommandError, match="no node gpu-9"):
        call_command("iop_node_policy", "gpu-9", stdout=StringIO())


def test_a_probe_command_is_checked_like_the_command_r_tls_3(tmp_path):
    """R-TLS-3 (sharpened): an allowed command does not let its provider's probe_command run
    another program; the registry builds no adapter, so no probe or run ever starts."""
    policy = _policy(tmp_path, commands=[["claude", "-p", "..."]])
    sneaky = _cli(["claude", "-p"], probe_command=["/bin/sh", "-c", "id > marker"],
                  probe_interval_s=0.05)  # fmt: skip
    refusal = policy.refusal(sneaky)
    assert refusal == "probe command /bin/sh -c 'id > marker' is not an allowed command"
    registry = Registry(NodePayload(node_id="n", revision="r", providers=[sneaky]), policy)
    assert registry.adapters == {} and "probe command /bin/sh" in registry.errors["c"]
    probed = _cli(["claude", "-p"], probe_command=["claude", "-p", "--version"])
    assert policy.refusal(probed) is None


@pytest.mark.parametrize(
    ("argv", "allowed"),
    [
        (["claude", "-p"], True),
        (["claude", "-p", "--dangerously-skip-permissions"], False),
        (["claude"], False),
        (["ollama", "run", "llama3"], True),  # the "..." form takes trailing arguments
    ],
)
def test_a_commands_entry_ending_in_dollar_still_allows_exactly_that_argv_r_tls_6(
    tmp_path, argv, allowed
):
    """R-TLS-6: an old-style entry ending in "$" keeps meaning exact."""
    policy = _policy(tmp_path, commands=["claude -p $", ["ollama", "run", "..."]])
    assert (policy.refusal(_cli(argv)) is None) == allowed


@pytest.mark.parametrize(
    "name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES", "PYTHONPATH", "PATH",
             "NODE_OPTIONS", "BASH_ENV", "HOME", "LC_ALL", "ld_preload"],
)  # fmt: skip
def test_a_declared_name_that_changes_how_programs_load_is_refused_r_tls_3(tmp_path, name):
    """R-TLS-3 (sharpened): as a cli env name or as a managed credential_env, with or without
    a policy (no policy may allow it)."""
    ref = SecretRefPayload(env="TOOL_KEY")
    for provider in (_cli(["x"], env={name: ref}), _cli(["x"], credential_env=name)):
        payload = NodePayload(node_id="n", revision="r", providers=[provider])
        registry = Registry(payload, None)
        assert registry.adapters == {}
        assert registry.errors["c"].startswith("refused by node policy: command environment: ")
        assert name in registry.errors["c"]
        policy = _policy(tmp_path, commands=[["x"]], secrets={"env": ["*"]})
        assert policy.refusal(provider) is not None
    policy = _policy(tmp_path, commands=[["x"]], env=["TOOL_KEY", "GLM_API_KEY"],
                     secrets={"env": ["*"]})  # fmt: skip
    assert policy.refusal(_cli(["x"], env={"TOOL_KEY": ref})) is None
    assert policy.refusal(_cli(["x"], credential_env="GLM_API_KEY")) is None


def test_without_a_policy_only_http_and_https_upstreams_are_dialed(tmp_path):
    payload = NodePayload(node_id="n", revision="r", providers=[_http("file:///etc/passwd")])
    assert Registry(payload, None).errors["p"] == (
        "refused by node policy: upstream file:// is not http or https"
    )


def test_the_printed_policy_is_the_narrowest_with_probes_and_schemes_r_tls_3(tmp_path):
    """R-TLS-3: iop_node_policy's policy lists each command and probe command as its exact
    argv and each upstream with its scheme; it allows the payload and nothing wider."""
    from nodes.agent.policy import policy_for

    (tmp_path / "keys").mkdir()
    key = str(tmp_path / "keys" / "tool.key")
    cli = _cli(["tool", "-q"], probe_command=["tool", "--version"], credential_env="TOOL_SLOT",
               env={"TOOL_KEY": SecretRefPayload(file=key)})  # fmt: skip
    local = _http("http://127.0.0.1:11434/api/chat")
    cloud = _http("https://api.openai.com/v1/chat/completions")
    broken = _http("http://[::1/v1")  # the Node refuses it: nothing printed for it
    providers = [cli, local, cloud, broken]
    printed = policy_for(NodePayload(node_id="n", revision="r", providers=providers))
    assert printed["commands"] == [["tool", "-q", "$"], ["tool", "--version", "$"]]
    assert printed["env"] == ["TOOL_KEY", "TOOL_SLOT"]  # R-TLS-7
    assert printed["secrets"] == {"env": [], "files": [key]}  # R-TLS-8: the file, not its dir
    assert printed["hosts"] == ["api.openai.com:443", "http://127.0.0.1:11434"]
    policy = _policy(tmp_path, **printed)
    assert [policy.refusal(p) for p in (cli, local, cloud)] == [None, None, None]
    assert policy.refusal(_cli(["tool", "-q", "--extra"])) is not None
    assert policy.refusal(_http("http://api.openai.com/v1/chat/completions")) is not None
    assert policy.refusal(_http("https://127.0.0.1:11434/api/chat")) is not None
