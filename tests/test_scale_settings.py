"""Per-Edge and scale-out settings (docs/configuration.md, "Several Edges"): typed, with
documented defaults, refused at start naming the variable or flag and the reason."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.core.exceptions import ImproperlyConfigured

from catalog.config import load_snapshot
from catalog.config.addresses import HostPort
from iop_site import scale
from iop_site.edge_local import EdgeLocal, LocalSettingError
from iop_site.env import env_listen, env_match
from iop_site.scale import ScaleSettings
from pool.engine import ProviderPool
from pool.policy import policy_from_snapshot
from tests.support.inprocess import document

SCALE_VARS = ("IOP_REDIS_URL", "IOP_REDIS_PREFIX", "IOP_LEASE_TTL_S", "IOP_REVISION_POLL_S")


@pytest.fixture
def env(monkeypatch):
    for name in SCALE_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def snapshot(**changes):
    doc = document()
    for section, values in changes.items():
        doc.setdefault(section, {}).update(values)
    return load_snapshot(doc)


def no_overrides(**values):
    base = {
        "IOP_EDGE_ID": None,
        "IOP_EDGE_LISTEN": None,
        "IOP_OPENAI_LISTEN": None,
        "IOP_ADMIN_LISTEN": None,
    }
    return SimpleNamespace(**(base | values))


# --- scale-out settings ----------------------------------------------------------------------


def test_without_iop_redis_url_scale_out_is_off_with_the_documented_defaults_r_scale_1(env):
    settings = ScaleSettings.from_env()
    assert settings == ScaleSettings(None, "iop", 10.0, 1.0) and not settings.enabled


def test_scale_out_settings_are_read_from_the_environment(env):
    env.setenv("IOP_REDIS_URL", "redis://127.0.0.1:6379/3")
    env.setenv("IOP_REDIS_PREFIX", "iop-blue")
    env.setenv("IOP_LEASE_TTL_S", "4")
    env.setenv("IOP_REVISION_POLL_S", "0.5")
    assert ScaleSettings.from_env() == ScaleSettings("redis://127.0.0.1:6379/3", "iop-blue", 4, 0.5)


def test_a_redis_url_of_another_scheme_is_refused_without_echoing_it(env):
    env.setenv("IOP_REDIS_URL", "http://user:s3cret@redis:6379/0")
    with pytest.raises(ImproperlyConfigured) as err:
        ScaleSettings.from_env()
    assert str(err.value).startswith("IOP_REDIS_URL: must be redis://")
    assert "s3cret" not in str(err.value)


def test_a_sentinel_url_names_its_sentinels_service_database_and_tls_r_ha_1():
    from pool.engine_redis.connect import parse

    store = parse(
        "rediss+sentinel://app:p%40ss@10.0.0.1:26379,[::1]:26380/main/2"
        "?ssl_ca_certs=/etc/ca.pem&sentinel_password=sp"
    )
    assert store.sentinels == (("10.0.0.1", 26379), ("::1", 26380))
    assert (store.service, store.db, store.tls) == ("main", 2, True)
    assert store.options == {"ssl_ca_certs": "/etc/ca.pem", "sentinel_password": "sp",
                             "username": "app", "password": "p@ss"}  # fmt: skip
    assert parse("redis+sentinel://127.0.0.1:26379/main").db == 0
    assert not parse("redis://127.0.0.1:6379/0").sentinel


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis+sentinel://127.0.0.1:26379", "names the service after the sentinels"),
        ("redis+sentinel://127.0.0.1:26379/a/b/c", "names the service after the sentinels"),
        ("redis+sentinel://127.0.0.1/main/0", "every sentinel is HOST:PORT, got '127.0.0.1'"),
        ("redis+sentinel://h:1,:2/main/0", "every sentinel is HOST:PORT, got ':2'"),
        ("redis+sentinel://u:s3cret@h:1/main/x", "the database after the service must be a number"),
        ("redis+sentinel://h:1/main/0?ssl_ca_certs=x", "unknown option 'ssl_ca_certs'"),
    ],
)
def test_a_bad_sentinel_url_is_refused_saying_why_never_echoing_it_r_ha_1(env, url, expected):
    env.setenv("IOP_REDIS_URL", url)
    with pytest.raises(ImproperlyConfigured, match=expected) as err:
        ScaleSettings.from_env()
    assert str(err.value).startswith("IOP_REDIS_URL: ") and "s3cret" not in str(err.value)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("IOP_REDIS_PREFIX", "has space", "IOP_REDIS_PREFIX: must be 1 to 64 letters"),
        ("IOP_LEASE_TTL_S", "0.1", "IOP_LEASE_TTL_S: must be >= 0.5"),
        ("IOP_LEASE_TTL_S", "ten", "IOP_LEASE_TTL_S: expected a number"),
        ("IOP_REVISION_POLL_S", "0", "IOP_REVISION_POLL_S: must be >= 0.05"),
    ],
)
def test_a_bad_scale_out_setting_is_refused_naming_the_variable(env, name, value, expected):
    env.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=expected):
        ScaleSettings.from_env()


# --- per-Edge settings -------------------------------------------------------------------------


def test_a_listen_variable_is_read_as_host_port_or_refused_naming_it(monkeypatch):
    monkeypatch.setenv("IOP_OPENAI_LISTEN", "0.0.0.0:8081")
    assert env_listen("IOP_OPENAI_LISTEN") == "0.0.0.0:8081"
    monkeypatch.setenv("IOP_OPENAI_LISTEN", "8081")
    with pytest.raises(ImproperlyConfigured, match="IOP_OPENAI_LISTEN: must be host:port"):
        env_listen("IOP_OPENAI_LISTEN")
    monkeypatch.delenv("IOP_OPENAI_LISTEN")
    assert env_listen("IOP_OPENAI_LISTEN") is None


def test_an_edge_id_outside_the_allowed_characters_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("IOP_EDGE_ID", "edge a")
    with pytest.raises(ImproperlyConfigured, match="IOP_EDGE_ID: must be 1 to 64"):
        env_match("IOP_EDGE_ID", r"[A-Za-z0-9_.-]{1,64}", "1 to 64 letters")


def test_flags_win_over_the_environment():
    settings = no_overrides(IOP_EDGE_ID="from-env", IOP_OPENAI_LISTEN="127.0.0.1:9000")
    local = EdgeLocal.from_settings(settings, edge_id="from-flag", edge_listen="127.0.0.1:9001")
    assert local == EdgeLocal("from-flag", "127.0.0.1:9001", "127.0.0.1:9000", None)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"edge_id": "x" * 65}, "--edge-id: must be 1 to 64"),
        ({"admin_listen": "localhost"}, "--admin-listen: must be host:port"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(flags, expected):
    with pytest.raises(LocalSettingError, match=expected):
        EdgeLocal.from_settings(no_overrides(), **flags)


def test_listen_overrides_change_the_listeners_but_not_the_shared_document():
    original = snapshot()
    local = EdgeLocal(edge_listen="127.0.0.1:27000", openai_listen="0.0.0.0:27002").localize(
        original
    )
    assert local.edge_listen == HostPort("127.0.0.1", 27000)
    assert local.openai_listen == HostPort("0.0.0.0", 27002)
    assert local.admin_listen == original.admin_listen
    assert local.digest == original.digest and local.document == original.document


def test_an_admin_listen_override_off_loopback_is_refused_r_ref_1():
    with pytest.raises(LocalSettingError, match=r"admin listen 0\.0\.0\.0:27001: must be"):
        EdgeLocal(admin_listen="0.0.0.0:27001").localize(snapshot())


def test_a_listen_override_on_a_port_another_listener_uses_is_refused():
    original = snapshot()
    clash = f"127.0.0.1:{original.edge_listen.port}"
    with pytest.raises(
        LocalSettingError, match=r"admin listen: port \d+ is already used by the edge"
    ):
        EdgeLocal(admin_listen=clash).localize(original)


def test_the_edge_id_defaults_to_hostname_and_edge_port(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "box 7.example")
    local = EdgeLocal(edge_listen="127.0.0.1:27000")
    assert local.resolved_edge_id(local.localize(snapshot())) == "box-7.example-27000"
    assert EdgeLocal(edge_id="given").resolved_edge_id(snapshot()) == "given"


# --- refusals and the pool engine ------------------------------------------------------------


REDIS_ON = ScaleSettings(redis_url="redis://127.0.0.1:6379/0")


def test_scale_out_on_sqlite_is_refused_with_the_reason():
    reason = scale.refusal(REDIS_ON, "django.db.backends.sqlite3", snapshot())
    assert reason is not None and "DATABASE_URL=postgresql://" in reason


def test_scale_out_on_postgresql_is_allowed():
    assert scale.refusal(REDIS_ON, "django.db.backends.postgresql", snapshot()) is None


def test_without_redis_nothing_is_refused_r_scale_1():
    assert scale.refusal(ScaleSettings(), "django.db.backends.sqlite3", snapshot()) is None


def test_without_redis_the_pool_is_the_in_memory_one_r_scale_1():
    policy = policy_from_snapshot(snapshot())
    pool = scale.build_pool(policy, scale=ScaleSettings(), edge_id="e", clock=lambda: 0.0)
    assert type(pool) is ProviderPool


def test_with_redis_the_pool_is_the_shared_redis_engine_r_scale_2():
    from pool.engine_redis import RedisPool

    policy = policy_from_snapshot(snapshot())
    pool = scale.build_pool(policy, scale=REDIS_ON, edge_id="e", clock=lambda: 0.0)
    assert type(pool) is RedisPool  # built, not started: nothing reached Redis yet


def test_scale_out_with_managed_mode_starts_r_scale_7():
    """R-SCALE-7: managed mode is no reason to refuse several Edges any more."""
    managed = SimpleNamespace(credential_plane=object())  # only the switch would be read
    assert scale.refusal(REDIS_ON, "django.db.backends.postgresql", managed) is None  # type: ignore[arg-type]
