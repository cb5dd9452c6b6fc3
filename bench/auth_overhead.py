"""What authentication costs a request. Over HTTP against the real app: the p50 latency of a trivial route that needs
a key (`get_server_capabilities`, its key's record cached) against one that needs none (`healthz`), rounds
interleaved. In process: `Authenticator.authenticate` with the key's record cached and read from a SQLite database
(`auth.key_cache_seconds` 0), and with a JWT. Medians over repeats; the ratios are against the same run's baseline.

    python bench/auth_overhead.py [--requests 400] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from server import ROOT, start_server  # sets up sys.path and the environment first

from app.models.embedded import build_embedded_model

KEY = "tml-bench-auth"


def http_p50s(url: str, requests: int) -> tuple[float, float]:
    """(p50 ms of healthz, p50 ms of get_server_capabilities with a key), one round of each."""
    import httpx

    def p50(path: str, headers: dict[str, str]) -> float:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            http.get(path)  # warm: the connection, and the key's record
            times = []
            for _ in range(requests):
                started = time.perf_counter()
                http.get(path).raise_for_status()
                times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e3

    return p50("/api/v1/healthz", {}), p50("/api/v1/get_server_capabilities", {"X-API-Key": KEY})


async def in_process_us(calls: int) -> dict[str, float]:
    """Median µs of Authenticator.authenticate: cached, read from SQLite each time, and a JWT (cached key)."""
    from starlette.requests import Request

    from app.api.auth import Authenticator
    from app.api.tokens import TokenSigner
    from app.db.audit import AuditLog
    from app.db.keys import KeyStore
    from app.db.migrate import migrate
    from app.db.schema import connect

    def request(key: str) -> Request:
        headers = [(b"x-api-key", key.encode())]
        return Request(
            {"type": "http", "method": "GET", "path": "/api/v1/x", "headers": headers, "client": ("127.0.0.1", 1)}
        )

    db = connect(f"sqlite+aiosqlite:///{tempfile.mkdtemp(prefix='authbench-')}/db.sqlite")
    await migrate(db)
    keys, signer = KeyStore(db), TokenSigner("b" * 32)
    record = await keys.enroll(KEY, "enrolled")
    token = signer.mint(record.owner, record.key_id, ttl_s=3600)
    results = {}
    for name, cache_s, credential in (
        ("cached key", 60.0, KEY),
        ("key read from SQLite", 0.0, KEY),
        ("JWT", 60.0, token),
    ):
        auth = Authenticator("any_tml_key_on_loopback", frozenset(), keys, cache_s, AuditLog(db), signer)
        await auth.authenticate(request(credential))
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            await auth.authenticate(request(credential))
            times.append(time.perf_counter() - started)
        results[name] = statistics.median(times) * 1e6
    await db.dispose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    print("in process (median µs per authenticate):")
    for name, us in asyncio.run(in_process_us(args.requests)).items():
        print(f"  {name:<24} {us:8.1f}")

    tiny = ROOT / "models" / "tiny"
    build_embedded_model("tiny", tiny)
    url, _ = start_server([{"name": "tinker-serve/tiny", "path": str(tiny), "embedded_preset": "tiny"}])
    rounds = []
    for repeat in range(args.repeats):
        healthz, keyed = http_p50s(url, args.requests)
        rounds.append((healthz, keyed))
        print(f"round {repeat + 1}: healthz p50 {healthz:.2f} ms, with a key {keyed:.2f} ms ({keyed / healthz:.2f}x)")
    healthz = statistics.median(r[0] for r in rounds)
    keyed = statistics.median(r[1] for r in rounds)
    print(
        f"medians over {args.repeats} rounds of {args.requests}: no key {healthz:.2f} ms, with a key {keyed:.2f} ms, "
        f"ratio {keyed / healthz:.2f}, overhead {keyed - healthz:.2f} ms"
    )


if __name__ == "__main__":
    main()
