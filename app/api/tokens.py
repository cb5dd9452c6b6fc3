"""Short-lived JWTs (HS256) that stand for an API key: `POST /auth/token` mints one for the key a request presents,
and the SDK sends it instead of the key while `auth.jwt_enabled` tells it to (client/config `pjwt_auth_enabled`).

Signing keys: $TINKER_SERVE_JWT_SIGNING_KEY signs (else a random key every replica shares through the database), and
$TINKER_SERVE_JWT_PREVIOUS_KEYS (comma-separated) still verify. To rotate: move the current key into the previous
ones, set a new current key, restart; drop the old key after auth.jwt_ttl_seconds, when every token it signed has
expired. A token is refused once it expires, or once the key it stands for is revoked."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import jwt

from app.errors import InvalidToken

SIGNING_KEY_ENV = "TINKER_SERVE_JWT_SIGNING_KEY"
PREVIOUS_KEYS_ENV = "TINKER_SERVE_JWT_PREVIOUS_KEYS"
ISSUER = "tinker-serve"
_ALGORITHM = "HS256"
_MIN_KEY_BYTES = 32


def looks_like_jwt(credential: str) -> bool:
    return credential.startswith("eyJ") and credential.count(".") == 2


@dataclass(frozen=True)
class TokenSigner:
    current: str
    previous: tuple[str, ...] = ()

    @classmethod
    def from_environment(cls, shared_default: str) -> TokenSigner:
        """The keys the environment names, else `shared_default` (the database's shared secret)."""
        previous = tuple(k.strip() for k in os.environ.get(PREVIOUS_KEYS_ENV, "").split(",") if k.strip())
        signer = cls(os.environ.get(SIGNING_KEY_ENV) or shared_default, previous)
        if any(len(key) < _MIN_KEY_BYTES for key in (signer.current, *signer.previous)):
            raise ValueError(
                f"{SIGNING_KEY_ENV} and {PREVIOUS_KEYS_ENV} need keys of at least {_MIN_KEY_BYTES} characters "
                "(e.g. `openssl rand -hex 32`)"
            )
        return signer

    def mint(self, user: str, key_id: int, ttl_s: int, now: float | None = None) -> str:
        issued = int(time.time() if now is None else now)
        claims = {"iss": ISSUER, "sub": user, "key_id": key_id, "iat": issued, "exp": issued + ttl_s}
        return jwt.encode(claims, self.current, algorithm=_ALGORITHM)

    def verify(self, token: str) -> tuple[str, int]:
        """(user, key_id) of a token signed by one of the keys and not expired; InvalidToken otherwise."""
        for key in (self.current, *self.previous):
            try:
                claims = jwt.decode(
                    token, key, algorithms=[_ALGORITHM], issuer=ISSUER, options={"require": ["exp", "iat", "sub"]}
                )
            except jwt.ExpiredSignatureError:
                raise InvalidToken("this token expired: exchange your API key for another (POST /auth/token)") from None
            except jwt.InvalidSignatureError:
                continue
            except jwt.PyJWTError:
                break
            key_id = claims.get("key_id")
            if isinstance(key_id, int):
                return str(claims["sub"]), key_id
            break
        raise InvalidToken("this token is not valid here: exchange your API key for a new one (POST /auth/token)")
