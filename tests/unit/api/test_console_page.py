"""The web console's page and files (app/console) through the app: served without a key, from the package, with
a policy that runs only its own scripts; the REST calls it makes still need one."""

from __future__ import annotations

from types import SimpleNamespace

from fastapi import Request
from fastapi.testclient import TestClient

from app.api.auth import presented_key
from app.api.main import create_api
from app.api.rates import RateLimiter
from app.config import AuthConfig, LimitsConfig
from app.console import STATIC


class _KeysRefused:
    """An authenticator that only lets open paths through (as api_keys mode does without a key)."""

    mode = "api_keys"

    async def authenticate(self, request: Request) -> None:
        assert presented_key(request, "api_keys") is None


def client() -> TestClient:
    api = create_api()
    config = SimpleNamespace(limits=LimitsConfig(), auth=AuthConfig())
    api.state.services = SimpleNamespace(auth=_KeysRefused(), config=config, failed_auth_rate=RateLimiter(600))
    return TestClient(api, client=("10.1.2.3", 40000))


def test_the_page_and_its_files_need_no_key() -> None:
    http = client()
    page = http.get("/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'self': no inline scripts
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["referrer-policy"] == "no-referrer"
    for asset in ("console.js", "console.css", "vendor/uplot.min.js", "vendor/uplot.min.css"):
        served = http.get(f"/console/static/{asset}")
        assert served.status_code == 200 and served.content == (STATIC / asset).read_bytes()
    assert "MIT License" in (STATIC / "vendor" / "uplot.LICENSE").read_text()


def test_the_console_keeps_the_key_out_of_urls() -> None:
    script = (STATIC / "console.js").read_text()
    assert '"X-API-Key"' in script and "sessionStorage" in script and "localStorage" not in script


def test_its_rest_calls_still_need_a_key() -> None:
    http = client()
    assert http.get("/api/v1/server_status").status_code == 401
    assert http.get("/api/v1/training_runs").status_code == 401
