"""`tinker-serve`: the operator's console for users and API keys, on the server's own database.

    tinker-serve keys create --user NAME [--name LABEL] [--expires-in-days N]   # prints the new key, once
    tinker-serve keys list [--user NAME]
    tinker-serve keys revoke KEY_ID
    tinker-serve users

The database is the one the server uses: `--config` (default serve_config.yaml) names its state_dir or
database_url, and $TINKER_SERVE_DATABASE_URL overrides both, as for the server. Keys never come from the command
line; a new key is printed once and stored only as its hash.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import ValidationError

from app.config import ServerConfig
from app.db.audit import CONSOLE, AuditLog
from app.db.keys import KeyRecord, KeyStore, expiry_after_days
from app.db.migrate import migrate
from app.db.schema import connect
from app.errors import TinkerServeError

T = TypeVar("T")


def server_config(path: Path) -> ServerConfig:
    """The app's arguments in a Serve config file (its first application), as the server reads them."""
    doc = yaml.safe_load(path.read_text())
    return ServerConfig.model_validate(doc["applications"][0].get("args") or {})


def _on_store(config: ServerConfig, body: Callable[[KeyStore], Awaitable[T]], audit: str | None = None) -> T:
    """Run `body` on the server's key store; `audit`: the event to record (as the console's) about the key it
    returns or, with `issue`, the (secret, key) pair's key."""

    async def main() -> T:
        db = connect(config.db_url)
        try:
            await migrate(db)
            done = await body(KeyStore(db))
            if audit is not None:
                key = done[1] if isinstance(done, tuple) else done
                assert isinstance(key, KeyRecord)
                details = {"key_id": key.key_id, "name": key.name, "by": CONSOLE}
                await AuditLog(db).record(audit, CONSOLE, details, subject_owner=key.owner)
            return done
        finally:
            await db.dispose()

    return asyncio.run(main())


def _when(timestamp: float | None) -> str:
    return "-" if timestamp is None else datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M")


def _row(key: KeyRecord) -> str:
    state = "revoked" if key.revoked_at else "expired" if not key.usable(time.time()) else "live"
    return (
        f"{key.key_id:>6}  {key.owner:<24} {key.name:<20} ...{key.hint}  {key.origin:<10} {state:<7} "
        f"created {_when(key.created_at)}  used {_when(key.last_used_at)}  expires {_when(key.expires_at)}"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tinker-serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("serve_config.yaml"), help="the server's Serve config")
    commands = parser.add_subparsers(dest="command", required=True)
    keys = commands.add_parser("keys", help="issue, list and revoke API keys").add_subparsers(dest="action")
    create = keys.add_parser("create", help="issue a key to a user (made if new); prints it once")
    create.add_argument("--user", required=True)
    create.add_argument("--name", default="key", help="a label to tell the user's keys apart")
    create.add_argument("--expires-in-days", type=float, default=None)
    listing = keys.add_parser("list", help="every key (of one user), without secrets")
    listing.add_argument("--user")
    revoke = keys.add_parser("revoke", help="revoke a key by its id: its next call is refused")
    revoke.add_argument("key_id", type=int)
    commands.add_parser("users", help="the named users and their live keys")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "keys" and args.action is None:
        _parser().error("keys needs an action: create, list or revoke")
    try:
        config = server_config(args.config)
    except (OSError, KeyError, IndexError, TypeError, ValidationError) as exc:
        print(f"tinker-serve: cannot read the server's config {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "users":
            for name, created, live in _on_store(config, lambda store: store.users()):
                print(f"{name:<24} created {_when(created)}  live keys {live}")
        elif args.action == "create":
            expires = expiry_after_days(args.expires_in_days)
            secret, record = _on_store(
                config, lambda store: store.issue(args.user, args.name, expires), audit="apikey_created"
            )
            print(_row(record), file=sys.stderr)
            print(secret)  # alone on stdout, once: the only place the key is ever shown
        elif args.action == "list":
            for key in _on_store(config, lambda store: store.keys_of(args.user)):
                print(_row(key))
        else:
            print(_row(_on_store(config, lambda store: store.revoke(args.key_id), audit="apikey_revoked")))
    except TinkerServeError as exc:
        print(f"tinker-serve: {exc.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
