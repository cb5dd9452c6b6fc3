"""A throwaway PostgreSQL server for the tests: the distribution's `initdb` and `pg_ctl` (Debian's `postgresql`
package, installed by `make postgres`) run into a temp dir, listening on 127.0.0.1 only, on a free port, with no
unix socket. Its one role logs in with a random password (scram-sha-256), which every process of the test
session reads from $PGPASSWORD (set at import, before Ray starts, so Serve replicas inherit it): URLs carry no
password and no command line shows it. As root (CI), the server runs as the `postgres` system user, since
initdb refuses root."""

from __future__ import annotations

import asyncio
import os
import pwd
import random
import secrets
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PG_ROOT = Path("/usr/lib/postgresql")  # Debian's layout: /usr/lib/postgresql/<major>/bin
ROLE = "tinker"
PASSWORD = secrets.token_urlsafe(24)
os.environ["PGPASSWORD"] = PASSWORD  # asyncpg (and libpq) read it when a URL has no password
_HOW_TO_FIX = "run `make postgres` (as root: apt-get install -y postgresql), then the tests again"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be started for the tests."""


@dataclass(frozen=True)
class PostgresServer:
    port: int
    host: str = "127.0.0.1"

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of `database` (no password: asyncpg reads $PGPASSWORD)."""
        return f"postgresql+asyncpg://{ROLE}@{self.host}:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its name."""
        name = "t_" + uuid.uuid4().hex[:16]
        asyncio.run(self._admin(f'CREATE DATABASE "{name}"'))
        return name

    def drop_database(self, name: str) -> None:
        asyncio.run(self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    async def _admin(self, statement: str) -> None:
        import asyncpg

        conn = await asyncpg.connect(host=self.host, port=self.port, user=ROLE, database="postgres")
        try:
            await conn.execute(statement)
        finally:
            await conn.close()


def pg_bin_dir() -> Path:
    """The newest installed PostgreSQL's binaries (found by their Debian path, not PATH)."""
    found = sorted(
        PG_ROOT.glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0
    )
    if not found:
        raise PostgresUnavailable(f"no PostgreSQL server binaries under {PG_ROOT}/*/bin; {_HOW_TO_FIX}")
    return found[-1].parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, chosen below the kernel's ephemeral range and above
    Ray's worker ports (10002-19999): a port the kernel hands out (bind to 0, an outgoing connection) can be taken
    by another process between this choice and the server's bind, as one suite run saw Serve's."""
    low = 20000
    high = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(low, high), min(200, max(0, high - low))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no such range here: any free port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    """`argv` run as the `postgres` system user when we are root (initdb and postgres refuse root)."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


def _give_to_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(path, user.pw_uid, user.pw_gid)


def _run(argv: list[str], what: str, log: Path | None = None) -> None:
    done = subprocess.run(_as_server_user(argv), capture_output=True, text=True, timeout=120, check=False, cwd="/")
    if done.returncode != 0:
        tail = log.read_text()[-2000:] if log is not None and log.exists() else ""
        raise PostgresUnavailable(
            f"{what} failed (exit {done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}{tail}\n{_HOW_TO_FIX}"
        )


@contextmanager
def postgres_server(attempts: int = 3) -> Iterator[PostgresServer]:
    """Start a fresh server (initdb + pg_ctl start), yield it, stop it and delete its files."""
    bin_dir = pg_bin_dir()
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError as exc:
            raise PostgresUnavailable(f"no `postgres` system user to run the server as; {_HOW_TO_FIX}") from exc
    root = Path(tempfile.mkdtemp(prefix="tinker-serve-pg-"))
    _give_to_server_user(root)
    data, log, pwfile = root / "data", root / "server.log", root / "pwfile"
    pwfile.write_text(PASSWORD + "\n")
    pwfile.chmod(0o600)
    _give_to_server_user(pwfile)
    started = False
    try:
        _run(
            [
                str(bin_dir / "initdb"),
                f"--pgdata={data}",
                f"--username={ROLE}",
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ],
            "initdb",
        )
        pwfile.unlink()
        for attempt in range(1, attempts + 1):  # a free port may be taken before the server binds it
            port = free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories='' "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            try:
                _run(
                    [
                        str(bin_dir / "pg_ctl"),
                        "start",
                        "-w",
                        "-t",
                        "60",
                        "-D",
                        str(data),
                        "-l",
                        str(log),
                        "-o",
                        options,
                    ],
                    "pg_ctl start",
                    log,
                )
                started = True
                break
            except PostgresUnavailable:
                if attempt == attempts:
                    raise
        yield PostgresServer(port)
    finally:
        if started:
            subprocess.run(
                _as_server_user([str(bin_dir / "pg_ctl"), "stop", "-m", "fast", "-w", "-D", str(data)]),
                capture_output=True,
                timeout=120,
                check=False,
                cwd="/",
            )
        shutil.rmtree(root, ignore_errors=True)
