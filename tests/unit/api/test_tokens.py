"""TokenSigner: a minted JWT verifies to its user and key; expired, forged, tampered or foreign tokens are refused
with the `invalid_token` challenge the SDK answers by exchanging its key again; previous keys still verify."""

from __future__ import annotations

import pytest

from app.api.tokens import TokenSigner, looks_like_jwt
from app.errors import InvalidToken

OLD, NEW = "o" * 32, "n" * 32  # keys of at least 32 bytes, as the server requires


def test_round_trip_and_rotation() -> None:
    old = TokenSigner(OLD)
    token = old.mint("alice", 7, ttl_s=60)
    assert looks_like_jwt(token) and not looks_like_jwt("tml-abc")
    assert old.verify(token) == ("alice", 7)
    assert TokenSigner(NEW, previous=(OLD,)).verify(token) == ("alice", 7)  # during a rotation
    with pytest.raises(InvalidToken) as refused:
        TokenSigner(NEW).verify(token)  # the old key dropped
    assert refused.value.status_code == 401
    assert refused.value.headers() == {"www-authenticate": 'Bearer error="invalid_token"'}


def test_expired_tampered_and_malformed_tokens_are_refused() -> None:
    signer = TokenSigner(NEW)
    with pytest.raises(InvalidToken, match="expired"):
        signer.verify(signer.mint("alice", 7, ttl_s=60, now=1_000_000))
    header, payload, signature = signer.mint("alice", 7, ttl_s=60).split(".")
    bob = signer.mint("bob", 8, ttl_s=60).split(".")[1]
    for forged in (f"{header}.{bob}.{signature}", f"{header}.{payload}.", "eyJ.e30.x", "eyJhbGciOiJub25lIn0.e30."):
        with pytest.raises(InvalidToken, match="not valid"):
            signer.verify(forged)


def test_short_signing_keys_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_SERVE_JWT_SIGNING_KEY", "short")
    with pytest.raises(ValueError, match="TINKER_SERVE_JWT_SIGNING_KEY"):
        TokenSigner.from_environment("d" * 64)
    monkeypatch.setenv("TINKER_SERVE_JWT_SIGNING_KEY", NEW)
    monkeypatch.setenv("TINKER_SERVE_JWT_PREVIOUS_KEYS", f"{OLD}, ")
    assert TokenSigner.from_environment("d" * 64) == TokenSigner(NEW, (OLD,))
