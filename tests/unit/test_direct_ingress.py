"""The Ingress replica's own HTTP server binds its pinned port like Serve's proxy (deployments/direct_ingress.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ray.serve._private import replica

from deployments import direct_ingress


def test_the_replica_server_binds_with_serve_proxy_s_socket_options(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    async def serve_s_own(app: object, options: object, **kwargs: Any) -> str:
        calls.append(kwargs)
        return "started"

    monkeypatch.setattr(replica, "start_asgi_http_server", serve_s_own)
    direct_ingress.bind_like_serve_proxy()
    direct_ingress.bind_like_serve_proxy()  # once only: a second call does not wrap the wrapper
    started = asyncio.run(replica.start_asgi_http_server(None, None, event_loop=None, enable_so_reuseport=False))
    assert started == "started" and calls == [{"event_loop": None, "enable_so_reuseport": True}]


def test_nothing_changes_without_a_pinned_port(monkeypatch: pytest.MonkeyPatch) -> None:
    before = replica.start_asgi_http_server
    monkeypatch.setenv("RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT", "31000")  # a range: Serve's own behaviour holds
    asyncio.run(direct_ingress.prepare())
    assert replica.start_asgi_http_server is before
