"""One behaviour for ``{env}`` / ``{file}`` secret references on the Edge and on the Node
(``secretref``): the same value, the same refusals, messages that name only the reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from catalog.config import SecretRef, SecretUnavailableError
from nodes.agent.secrets import SecretError, resolve_secret
from nodes.wire import SecretRefPayload

SECRET = "sk-canary-5d1e7b"
Resolve = Callable[..., str]


def on_the_edge(**ref: str) -> str:
    try:
        return SecretRef(**ref).resolve()
    except SecretUnavailableError as exc:
        raise LookupError(str(exc)) from None


def on_the_node(**ref: str) -> str:
    try:
        return resolve_secret(SecretRefPayload(**ref), what="credential")
    except SecretError as exc:
        raise LookupError(str(exc)) from None


both = pytest.mark.parametrize("resolve", [on_the_edge, on_the_node], ids=["edge", "node"])


@both
def test_a_file_under_home_is_found_through_tilde(
    resolve: Resolve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "key").write_text(f"  {SECRET}\n")
    assert resolve(file="~/key") == SECRET


@both
def test_an_env_value_is_stripped(resolve: Resolve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOP_TEST_SECRET_REF", f"{SECRET}\n")
    assert resolve(env="IOP_TEST_SECRET_REF") == SECRET


@both
def test_a_file_that_is_not_utf8_is_refused_naming_the_file(
    resolve: Resolve, tmp_path: Path
) -> None:
    key = tmp_path / "binary.key"
    key.write_bytes(b"\xff\xfe" + SECRET.encode())
    with pytest.raises(LookupError, match="not UTF-8 text") as caught:
        resolve(file=str(key))
    assert str(key) in str(caught.value) and SECRET not in str(caught.value)


@both
@pytest.mark.parametrize(
    ("ref", "reason"),
    [
        ({"env": "IOP_TEST_SECRET_UNSET"}, "environment variable IOP_TEST_SECRET_UNSET is not set"),
        ({"env": "IOP_TEST_SECRET_BLANK"}, "environment variable IOP_TEST_SECRET_BLANK is empty"),
        ({"file": "{dir}/absent"}, "cannot read file {dir}/absent (No such file or directory)"),
        ({"file": "{dir}/blank"}, "file {dir}/blank is empty"),
        ({"file": "{dir}"}, "cannot read file {dir} (Is a directory)"),
    ],
)
def test_refusals_say_the_same_reason_on_both_sides(
    resolve: Resolve,
    ref: dict[str, str],
    reason: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("IOP_TEST_SECRET_UNSET", raising=False)
    monkeypatch.setenv("IOP_TEST_SECRET_BLANK", "  \n")
    (tmp_path / "blank").write_text("\n")
    ref = {key: value.format(dir=tmp_path) for key, value in ref.items()}
    with pytest.raises(LookupError) as caught:
        resolve(**ref)
    assert str(caught.value).endswith(reason.format(dir=tmp_path))
