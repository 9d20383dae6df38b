"""One bucket's update cycle (bytesched.plugins.torch.cycle) over every ordering of its events.

The events of one iteration: ``reduce`` (update thread), ``release`` (step()), ``synchronize``
and ``zero_grad`` (the user), ``apply`` (update thread, when the cycle said the update is due).
Every permutation of them is played; a permutation the pipeline can never produce (apply before
the update is due, synchronize before reduce) must be refused, and every other one must decide
the same things: the update is due exactly once, at the second of reduce and release; a
zero_grad before apply is carried out by apply (the last one wins); synchronize only marks the
gradients as the user's.
"""

from __future__ import annotations

import itertools

import pytest

from bytesched.plugins.torch.cycle import CycleError, UpdateCycle

EVENTS = ("reduce", "release", "synchronize", "zero_grad(set_to_none=True)", "zero_grad(set_to_none=False)",
          "apply")


def play(order: tuple[str, ...]) -> tuple[UpdateCycle, list[str], str | None]:
    """Play ``order`` on a fresh cycle: (the cycle, the events at which the update became due,
    what apply asked to clear)."""
    cycle = UpdateCycle()
    due_at: list[str] = []
    cleared = None
    for event in order:
        if event in ("reduce", "release"):
            if getattr(cycle, event)():
                due_at.append(event)
        elif event == "synchronize":
            cycle.synchronize()
        elif event.startswith("zero_grad"):
            cycle.zero_grad(set_to_none=event.endswith("True)"))
        else:
            cleared = cycle.apply()
    return cycle, due_at, cleared


def possible(order: tuple[str, ...]) -> bool:
    """Could the pipeline produce ``order``? apply only once due; synchronize only once reduced;
    zero_grad only while the update is pending (after apply the bucket has no task)."""
    position = order.index
    due = max(position("reduce"), position("release"))
    return (position("apply") > due and position("synchronize") > position("reduce")
            and all(position(e) < position("apply") for e in order if e.startswith("zero_grad")))


def test_every_ordering_decides_alike_or_is_refused() -> None:
    played = 0
    for order in itertools.permutations(EVENTS):
        if not possible(order):
            with pytest.raises(CycleError):
                play(order)
            continue
        cycle, due_at, cleared = play(order)
        second = "reduce" if order.index("reduce") > order.index("release") else "release"
        assert due_at == [second], order  # exactly once, at the second of the two
        assert cycle.applied and cycle.synchronized and not cycle.due, order
        last_zero = [e for e in order if e.startswith("zero_grad")][-1]
        assert cleared == ("none" if last_zero.endswith("True)") else "zero"), order
        played += 1
    assert played == 84  # apply after the other four (4! orders), synchronize anywhere after reduce


def test_without_zero_grad_apply_clears_nothing_and_events_twice_are_refused() -> None:
    cycle = UpdateCycle()
    assert not cycle.release() and cycle.reduce() and cycle.due
    assert cycle.apply() is None
    for again in (cycle.reduce, cycle.release, cycle.apply):
        with pytest.raises(CycleError):
            again()
