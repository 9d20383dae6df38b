"""What a plugin learnt from the first forward pass, made known once: logged, put on the timeline,
and, where the Core runs ``tictac``, turned into TicTac's order.

Every plugin ranks the gradients by the order in which the first forward pass reads their
parameters (:mod:`bytesched.core.forward`), whatever order or container the user handed to the
optimizer or the Trainer; parameters the pass did not read follow in the order given, and where
nothing was traced (MXNet's Module runs its symbol's executor, which no hook sees) the order
given stays. :func:`announce` says which it is, once per plugin object: at INFO in the
``bytesched`` log, and as a ``priority order`` event on the timeline
(:meth:`~bytesched.core.timeline.ChromeTimeline.order`). :func:`order_by_graph` hands a ``tictac``
Core the traced pass as TicTac's graph, ordered by TIC (docs/policies.md, "tictac").
"""

from __future__ import annotations

import logging
from typing import Hashable, Mapping, Sequence

from bytesched.core import Core
from bytesched.core.forward import ForwardPass
from bytesched.core.timeline import ChromeTimeline

log = logging.getLogger("bytesched")


def announce(core: Core, order: Sequence[str], unread: Sequence[str], *, traced: bool, untraced_why: str = "") -> None:
    """Log and record the priority order: ``order`` as the forward pass first read them, then
    ``unread`` as given (``traced``); or, with nothing traced, ``unread`` alone, with the reason."""
    if traced:
        log.info("bytesched: priorities from the first forward pass (%d read%s): %s", len(order),
                 f"; {len(unread)} not read by it follow as given" if unread else "", ", ".join([*order, *unread]))
    else:
        log.info("bytesched: no forward pass was traced (%s); priorities in the order given: %s",
                 untraced_why, ", ".join(unread))
    timeline = core.timeline
    if isinstance(timeline, ChromeTimeline):
        timeline.order("priority order", [*order, *unread], "forward pass" if traced else "given")


def order_by_graph(core: Core, forward: ForwardPass, tasks_of: Mapping[Hashable, Sequence[str]]) -> list[str] | None:
    """Hand a ``tictac`` Core the traced pass as TicTac's graph (``tasks_of``: the CommTasks
    that bring each leaf); log and record the order it gives. None where the Core's policy has
    no use for a graph."""
    order = core.set_graph(forward.tictac_graph(tasks_of))
    if order is None:
        return None
    log.info("bytesched: tictac orders the tasks by TIC on the traced forward pass: %s", ", ".join(order))
    timeline = core.timeline
    if isinstance(timeline, ChromeTimeline):
        timeline.order("tictac order", order, "TIC on the traced forward pass")
    return order
