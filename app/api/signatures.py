"""Signed links (export downloads, trace exports) and the comparison of presented secrets.

Comparisons run in constant time and are total: any string a client can send compares (unequal), never raises.
"""

from __future__ import annotations

import hashlib
import hmac


def sign(key: str, resource: str, expires: int) -> str:
    """The HMAC that authorises `resource` until `expires`."""
    return hmac.new(key.encode(), f"{resource}\n{expires}".encode(), hashlib.sha256).hexdigest()


def same_secret(presented: str, expected: str) -> bool:
    """Whether `presented` equals `expected`, in time independent of where they differ; False for any other string,
    non-ASCII included (hmac.compare_digest raises TypeError on non-ASCII str, so both are compared as UTF-8)."""
    return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def signature_valid(key: str, resource: str, expires: int, signature: str) -> bool:
    """Whether `signature` is the one `sign` gives `resource` and `expires` (expiry is the caller's check)."""
    return same_secret(signature, sign(key, resource, expires))
