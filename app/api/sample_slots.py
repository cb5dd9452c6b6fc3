"""The samples one ingress replica has admitted for each base model, by user: a pool of quotas.max_pending_samples
shared fairly. A user under their share (quotas.max_pending_samples_per_user) gets in while the pool has room; one
past it only while their share of the pool would still stay free for the others. So a lone user may use all but a
share, and whoever arrives while they do still gets in (as training's fair share lets a light user in, simply)."""

from __future__ import annotations

from collections import Counter


class SampleSlots:
    def __init__(self) -> None:
        self._held: dict[str, Counter[str]] = {}  # per base model: samples admitted and not yet answered, by user

    def admit(self, base_model: str, user: str, limit: int, share: int) -> bool:
        """Take one of `base_model`'s slots for `user`: False when the pool of `limit` is full, or when `user`
        already holds `share` and taking one more would leave fewer than `share` free."""
        held = self._held.setdefault(base_model, Counter())
        room = limit if held[user] < share else limit - share
        if held.total() >= room:
            return False
        held[user] += 1
        return True

    def release(self, base_model: str, user: str) -> None:
        """Give back one of `user`'s slots (their sample finished, or will not be sent)."""
        held = self._held[base_model]
        held[user] -= 1
        if held[user] <= 0:
            del held[user]

    def held(self, base_model: str, user: str | None = None) -> int:
        """`base_model`'s admitted samples: all of them, or `user`'s."""
        held = self._held.get(base_model, Counter())
        return held.total() if user is None else held[user]
