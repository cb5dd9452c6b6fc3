"""RecentOutcomes (app.db.outcomes): finished outcomes kept in memory within a count, a byte and an age bound, with
the owner the ingress knew."""

from __future__ import annotations

from app.db.outcomes import MAX_AGE_S, Completed, Failed, RecentOutcomes, size_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def done(request_id: str, nbytes: int = 10) -> Completed:
    return Completed(request_id, b"x" * nbytes, "application/x-protobuf", "forward_backward")


def test_take_answers_once_and_forget_drops() -> None:
    recent = RecentOutcomes()
    failed = Failed("b", {"error": "boom", "category": "server"})
    recent.put(done("a"), owner="alice")
    recent.put(failed)
    assert recent.take("a") == done("a")
    assert recent.take("a") is None  # read once; the next poll reads the row
    recent.forget("b")
    assert recent.take("b") is None
    assert (len(recent), recent.nbytes) == (0, 0)


def test_the_owner_is_exactly_the_user_remembered() -> None:
    recent = RecentOutcomes()
    recent.put(done("a"), owner="alice")
    recent.put(done("b"))  # written by this process: no owner known
    assert recent.owned_by("a", "alice")
    assert not recent.owned_by("a", "bob")
    assert not recent.owned_by("a", "")
    assert not recent.owned_by("b", "alice") and not recent.owned_by("missing", "alice")
    assert recent.take("a") == done("a")  # asking whose it is takes nothing
    recent.put(done("c"), owner="alice")
    recent.put(done("c"))  # handed over again without an owner: the owner goes with the old entry
    assert not recent.owned_by("c", "alice")


def test_bounded_by_count_oldest_first() -> None:
    recent = RecentOutcomes(max_entries=3)
    for request_id in "abcd":
        recent.put(done(request_id))
    assert len(recent) == 3
    assert recent.take("a") is None
    assert [recent.take(r) for r in "bcd"] == [done(r) for r in "bcd"]


def test_bounded_by_bytes() -> None:
    entry = size_of(done("a", 1000))
    recent = RecentOutcomes(max_bytes=2 * entry + 10)
    for request_id in "abc":
        recent.put(done(request_id, 1000))
    assert len(recent) == 2 and recent.nbytes == 2 * entry
    assert recent.take("a") is None
    recent.put(done("huge", 10_000))  # larger than the whole bound: not kept, and it evicts nothing
    assert recent.take("huge") is None
    assert len(recent) == 2 and recent.nbytes == 2 * entry
    assert [recent.take(r) for r in "bc"] == [done(r, 1000) for r in "bc"]
    assert recent.nbytes == 0


def test_replacing_an_entry_counts_its_bytes_once() -> None:
    recent = RecentOutcomes()
    recent.put(done("a", 100))
    recent.put(done("a", 500))
    assert len(recent) == 1 and recent.nbytes == size_of(done("a", 500))


def test_entries_older_than_the_age_bound_are_gone() -> None:
    clock = Clock()
    recent = RecentOutcomes(clock=clock)
    recent.put(done("old"), owner="alice")
    clock.now += MAX_AGE_S / 2
    recent.put(done("young"), owner="alice")
    clock.now += MAX_AGE_S / 2 + 1
    assert not recent.owned_by("old", "alice") and recent.take("old") is None
    assert recent.owned_by("young", "alice")
    clock.now += MAX_AGE_S
    recent.put(done("new"))  # putting drops what has grown too old
    assert len(recent) == 1 and recent.nbytes == size_of(done("new"))


def test_the_age_bound_is_under_the_least_future_retention() -> None:
    """An entry must never outlive the row it copies (expire_finished removes rows past the retention)."""
    from app.config import RetentionConfig

    least = RetentionConfig.model_fields["future_retention_seconds"].metadata
    assert any(getattr(bound, "ge", None) is not None and bound.ge > MAX_AGE_S for bound in least)
