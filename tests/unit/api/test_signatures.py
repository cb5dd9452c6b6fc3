"""Signed links: a signature verifies only for its resource and expiry, and any presented string compares."""

from __future__ import annotations

import pytest

from app.api.signatures import same_secret, sign, signature_valid


def test_a_signature_verifies_only_its_resource_and_expiry() -> None:
    good = sign("key", "run/ckpt/a.bin", 100)
    assert signature_valid("key", "run/ckpt/a.bin", 100, good)
    assert not signature_valid("key", "run/ckpt/b.bin", 100, good)
    assert not signature_valid("key", "run/ckpt/a.bin", 101, good)
    assert not signature_valid("other", "run/ckpt/a.bin", 100, good)


@pytest.mark.parametrize("presented", ["", "é", "ä" * 64, "\udcff", "\x00", "0" * 10_000])
def test_any_presented_string_compares_without_raising(presented: str) -> None:
    assert not same_secret(presented, sign("key", "trace/s", 1))
    assert not signature_valid("kéy", "trace/ü", -1, presented)
