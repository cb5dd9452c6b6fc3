"""Which model's ready operations go to the worker group next: deficit round robin across users, by tokens.

Every user with ready work is in the round. Credit is granted to all of them equally, in the smallest amount that
lets one of them afford its next operation plus `extra_credit` (classic DRR's quantum, with rounds in which nobody
could run skipped at once), and the first user in the round who can afford theirs is served, with as many of the
model's next operations as their credit pays for, and goes to the end of the round. (The extra credit lets a small
operation, an optim_step, leave with the forward_backward before it, so a run is a whole step.) So over
time each active user gets the same tokens of worker time, whatever their operations' sizes. A user whose work runs
out leaves the round and loses their credit (no banking while idle); one who (re)joins goes first, so a light user's
operation waits for at most about one of a heavy user's. Within a user, their models take turns (least recently
served first). What an operation costs beyond its tokens is known only once it ran (a custom loss's compute): it is
debited then, and such a debt stays, idle or not, until paid.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence


class FairShare:
    def __init__(self, extra_credit: int = 0) -> None:
        self._extra = extra_credit
        self._round: list[str] = []  # users with ready work, in the order they get their turn
        self._credit: dict[str, int] = {}
        self._models: dict[str, list[str]] = {}  # per user: their models, least recently served first

    def pick(
        self,
        ready: Mapping[str, Sequence[str]],
        cost: Callable[[str], int],
        among: Mapping[str, Sequence[str]] | None = None,
    ) -> tuple[str, str, int]:
        """(user, model, credit): whose model runs next and the tokens it may spend now (at least the cost of its
        next operation). `ready`: each user's models whose next operation is ready (non-empty); `cost(model)`: the
        cost of that model's next operation. `among`: when given (non-empty, within `ready`), the choice is of these
        models only (those that can join a pass being formed), while every user in `ready` keeps their place and
        credit."""
        joined = [user for user in ready if user not in self._round]
        self._round = joined + [user for user in self._round if user in ready]
        kept = {user: credit for user, credit in self._credit.items() if user in ready or credit < 0}  # debts stay
        self._credit = kept | {user: kept.get(user, 0) for user in self._round}
        choices = ready if among is None else among
        candidates = [user for user in self._round if choices.get(user)]
        model_of = {user: self._next_model(user, choices[user]) for user in candidates}
        shortfall = {user: cost(model_of[user]) - self._credit[user] for user in candidates}
        grant = max(0, min(shortfall.values()) + self._extra)  # nothing while someone has that much to spare
        for user in self._round:
            self._credit[user] += grant
        user = next(user for user in candidates if shortfall[user] <= grant)
        return user, model_of[user], self._credit[user]

    def charge(self, user: str, model: str, spent: int) -> None:
        """`user`'s `model` was served `spent` tokens (at most the credit `pick` gave): its turn ends."""
        self._credit[user] -= spent
        self._round.remove(user)
        self._round.append(user)
        models = self._models[user]
        models.remove(model)
        models.append(model)

    def debit(self, user: str, tokens: int) -> None:
        """`user` owes `tokens` beyond what their operations were charged when sent (a custom loss's compute, known
        once it ran): their next turns wait until it is paid."""
        self._credit[user] = self._credit.get(user, 0) - tokens

    def forget(self, user: str, model: str) -> None:
        """`model` is gone (closed)."""
        models = self._models.get(user, [])
        if model in models:
            models.remove(model)
        if not models:
            self._models.pop(user, None)

    def _next_model(self, user: str, ready: Sequence[str]) -> str:
        known = self._models.get(user, [])
        models = self._models[user] = [model for model in ready if model not in known] + known  # new: never served
        return next(model for model in models if model in ready)
