"""`manage.py check --deploy` finds nothing in this project's settings once the HTTPS settings
that TLS turns on are set: the admin login throttling, the REST API permissions and the
database options add no warning of their own."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command
from django.test import override_settings

TLS_ON = {
    "SECURE_HSTS_SECONDS": 31536000,
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
    "SECURE_HSTS_PRELOAD": True,
    "SECURE_SSL_REDIRECT": True,
    "SESSION_COOKIE_SECURE": True,
    "CSRF_COOKIE_SECURE": True,
}
DEPLOY_KEY = "deploy-check-Kp3Xr9Vb2Wq7Zt5Lm8Nc4Hs6Jd1Fg0Yu-a7B-Qe4Rw8Ty2Ui6Op0As"


@override_settings(DEBUG=False, SECRET_KEY=DEPLOY_KEY, **TLS_ON)
def test_with_the_https_settings_on_the_deploy_check_finds_nothing():
    out = StringIO()
    call_command("check", "--deploy", "--fail-level", "WARNING", stdout=out, stderr=out)
    assert "System check identified no issues" in out.getvalue()
