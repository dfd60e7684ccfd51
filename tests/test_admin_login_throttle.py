"""Admin login throttling (django-axes): a client address that fails too often is locked out
for the cool-off; a successful login resets its count (docs/admin.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

PASSWORD = "correct-horse-battery"
LOGIN = "/admin/login/?next=/admin/"


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_user(
        "ops", password=PASSWORD, is_staff=True, is_superuser=True
    )


def attempt(client: Client, password: str, address: str = "198.51.100.7") -> int:
    response = client.post(LOGIN, {"username": "ops", "password": password}, REMOTE_ADDR=address)
    return response.status_code


def logged_in(client: Client) -> bool:
    return client.get("/admin/").status_code == 200


def test_the_documented_defaults_are_five_failures_and_fifteen_minutes():
    assert settings.AXES_FAILURE_LIMIT == 5
    assert timedelta(minutes=15) == settings.AXES_COOLOFF_TIME
    assert settings.AXES_RESET_ON_SUCCESS is True


def test_a_wrong_password_below_the_limit_shows_the_form_again(staff):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(client, "wrong") == 200
    assert not logged_in(client)


def test_the_limit_locks_the_address_out_even_with_the_right_password(staff):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "wrong")
    response = client.post(
        LOGIN, {"username": "ops", "password": PASSWORD}, REMOTE_ADDR="198.51.100.7"
    )
    assert response.status_code == 429
    assert b"too many login attempts" in response.content
    assert not logged_in(client)


def test_another_address_is_not_locked_out_by_the_first(staff):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        attempt(Client(), "wrong", address="198.51.100.7")
    other = Client()
    assert attempt(other, PASSWORD, address="203.0.113.9") == 302
    assert logged_in(other)


def test_a_successful_login_resets_the_count_of_its_address(staff):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(client, "wrong")
    assert attempt(client, PASSWORD) == 302
    assert not AccessAttempt.objects.exists()
    fresh = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(fresh, "wrong") == 200
    assert attempt(fresh, PASSWORD) == 302


def test_the_lockout_ends_after_the_cool_off(staff):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "wrong")
    assert attempt(client, PASSWORD) == 429
    # The cool-off counts from the last failure: move it back past the cool-off, no waiting.
    AccessAttempt.objects.update(
        attempt_time=AccessAttempt.objects.get().attempt_time
        - settings.AXES_COOLOFF_TIME
        - timedelta(seconds=1)
    )
    assert attempt(client, PASSWORD) == 302
    assert logged_in(client)
