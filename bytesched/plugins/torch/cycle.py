"""One bucket's update in one iteration, as a pure state machine: events in, decisions out.

Crossing the barrier, a bucket's update needs two things that arrive in either order from
different threads: its all-reduce is *reduced* (the update thread finalised it) and it is
*released* (the training thread's ``step()`` gave the hyperparameters). The update is due exactly
once, at the second of the two, and is then *applied* by the update thread. Meanwhile the user may
call ``synchronize()`` (the reduced gradients are theirs to read and modify: no in-place check
any more) or ``zero_grad()`` (the gradients must not be cleared under a pending update: the
request waits until the update was applied, the last request winning).

The class holds no lock, thread, clock or tensor: the pipeline calls it under its own lock and
acts on the answers, and ``tests/test_torch_cycle.py`` drives it through every ordering of the
events. A call out of order (applying what is not due, synchronising what is not reduced, an
event twice) raises :class:`CycleError`: a bug in the caller, never the user's doing.
"""

from __future__ import annotations

ZERO_REQUESTS = ("none", "zero")
"""What a deferred ``zero_grad`` does: set the gradients to None, or fill them with zeros."""


class CycleError(RuntimeError):
    """An event arrived that the cycle's state does not allow."""


class UpdateCycle:
    """The state of one bucket's update in one iteration (a GradientTask's ``cycle``)."""

    __slots__ = ("reduced", "released", "synchronized", "applied", "zero_request")

    def __init__(self) -> None:
        self.reduced = False
        self.released = False
        self.synchronized = False
        self.applied = False
        self.zero_request: str | None = None

    @property
    def due(self) -> bool:
        """Reduced and released, not applied yet."""
        return self.reduced and self.released and not self.applied

    def reduce(self) -> bool:
        """The all-reduce finished and was finalised. True: the update is due now."""
        if self.reduced:
            raise CycleError("reduced twice")
        self.reduced = True
        return self.released

    def release(self) -> bool:
        """``step()`` released the update. True: the update is due now."""
        if self.released:
            raise CycleError("released twice")
        self.released = True
        return self.reduced

    def synchronize(self) -> None:
        """The user waited for the reduced gradients; they may read and modify them now."""
        if not self.reduced:
            raise CycleError("synchronized before it was reduced")
        self.synchronized = True

    def zero_grad(self, set_to_none: bool) -> None:
        """``zero_grad()`` while the update is pending: clear the gradients once it was applied."""
        if self.applied:
            raise CycleError("zero_grad after the update was applied (the bucket's next cycle owns it)")
        self.zero_request = "none" if set_to_none else "zero"

    def apply(self) -> str | None:
        """The update ran. Returns the deferred ``zero_grad`` to carry out now (``none`` or
        ``zero``), if any."""
        if not self.due:
            raise CycleError(f"applied while not due (reduced={self.reduced}, released={self.released}, "
                             f"applied={self.applied})")
        self.applied = True
        request, self.zero_request = self.zero_request, None
        return request
