"""TicTac (bytesched.core.policies.tictac): Algorithm 1's properties on hand-checked DAGs, the TIC
and TAC orders, and the policy enforcing them through the Scheduler."""

from __future__ import annotations

import math

import pytest

from bytesched.core import Scheduler, SchedulingParams
from bytesched.core.config import ConfigError
from bytesched.core.policies import TicTacPolicy, make_policy
from bytesched.core.policies.tictac import Layer, Op, TicTacGraph, properties, tac_order, tic_order
from coretools import BufferTask, VirtualDriver

# TicTac's Figure 1a: recv1 -> op1 -> op2 <- recv2, with a time oracle of our choosing.
FIGURE_1A = TicTacGraph(
    ops=[Op("recv1", 2.0, recv=True), Op("recv2", 3.0, recv=True), Op("op1", 5.0), Op("op2", 7.0)],
    edges=[("recv1", "op1"), ("op1", "op2"), ("recv2", "op2")],
)


def test_figure_1a_properties_match_the_paper() -> None:
    p = properties(FIGURE_1A)
    assert p.M["op1"] == 2.0  # T(recv1)
    assert p.M["op2"] == 2.0 + 3.0  # T(recv1) + T(recv2)
    assert p.P == {"recv1": 5.0, "recv2": 0.0}  # T(op1); nothing runs on recv2 alone
    assert p.M_plus == {"recv1": 5.0, "recv2": 5.0}  # T(recv1) + T(recv2), via op2
    general = properties(FIGURE_1A, timing="general")  # TIC's oracle: recv 1, other ops 0
    assert general.M_plus == {"recv1": 2.0, "recv2": 2.0}
    assert general.P == {"recv1": 0.0, "recv2": 0.0}
    # Once recv1 is done, op2 waits only for recv2: its time becomes recv2's P.
    after = properties(FIGURE_1A, outstanding={"recv2"})
    assert after.M["op2"] == 3.0 and after.P == {"recv2": 7.0} and after.M_plus == {"recv2": math.inf}


@pytest.mark.parametrize("variant", ["tic", "tac"])
def test_figure_1a_recv1_is_scheduled_before_recv2(variant: str) -> None:
    # recv2 has the better own priority and is ready first, and the credit lets one sub-task
    # in flight at a time (a blocker outside the graph holds it until t=1): TicTac's order
    # alone puts recv1 first. (TIC ties on M+ = 2; the graph lists recv1 first. TAC: Eq. 2,
    # min(P2, M1) = 0 < min(P1, M2) = 3.)
    params = SchedulingParams(partition_bytes=math.inf, credit_bytes=1)
    policy = TicTacPolicy(params, variant=variant)
    policy.set_graph(FIGURE_1A)
    scheduler = Scheduler(policy)
    driver = VirtualDriver(scheduler, duration=lambda sub: 1.0)
    for ready_at, task in ((0.0, BufferTask("blocker", 0, 1000)), (0.1, BufferTask("recv2", 0, 1000)),
                           (0.2, BufferTask("recv1", 1, 1000))):
        scheduler.enqueue(task, 0.0)
        driver.at(ready_at, "ready", task)
    driver.run()
    assert [(sub.task.name, sub.t_start) for sub in driver.started] == [
        ("blocker", 0.0), ("recv1", 1.0), ("recv2", 2.0)]


# A second DAG, checked by hand: recv a (4 s) feeds x (1 s); recvs b and c (1 s each) both feed
# y (10 s). All outstanding: M: x = 4, y = 2; P: a = T(x) = 1, b = c = 0; M+: a = inf (no op
# needs a and another recv), b = c = M(y) = 2.
# TIC (general oracle): M+ a = inf, b = c = 2 -> b, c, a.
# TAC pick 1: a before b since min(P_b, M_a) = min(0, 4) = 0 < min(P_a, M_b) = min(1, 1) = 1;
#   neither b nor c goes before a (min(P_a, M_b) = 1 vs min(P_b, M_a) = 0). Then b and c tie on
#   Eq. 2 (0 = 0) and on M+ (2 = 2): graph order -> a, b, c.
SPLIT = TicTacGraph(
    ops=[Op("a", 4.0, recv=True), Op("b", 1.0, recv=True), Op("c", 1.0, recv=True), Op("x", 1.0), Op("y", 10.0)],
    edges=[("a", "x"), ("b", "y"), ("c", "y")],
)


def test_split_dag_properties_and_orders() -> None:
    p = properties(SPLIT)
    assert (p.M["x"], p.M["y"]) == (4.0, 2.0)
    assert p.P == {"a": 1.0, "b": 0.0, "c": 0.0}
    assert p.M_plus == {"a": math.inf, "b": 2.0, "c": 2.0}
    assert tic_order(SPLIT) == ["b", "c", "a"]
    assert tac_order(SPLIT) == ["a", "b", "c"]


# TicTac's Figure 5b shape, a chain of joins: op1 <- {A, B}, op2 <- {op1, C}, op3 <- {op2, D},
# recvs listed D, C, B, A; times A=1, B=2, C=3, D=4, ops 1 each. All P are 0 at first, so M+
# decides: A = B = M(op1) = 3 < C = 6 < D = 10, A/B tie -> listed first: B. Then op1 waits for
# A alone: P_A = 1, and A goes next (min(P_C, M_A) = 0 < min(P_A, M_C) = 1); likewise C, D.
JOINS = TicTacGraph(
    ops=[Op("D", 4.0, recv=True), Op("C", 3.0, recv=True), Op("B", 2.0, recv=True), Op("A", 1.0, recv=True),
         Op("op1", 1.0), Op("op2", 1.0), Op("op3", 1.0)],
    edges=[("A", "op1"), ("B", "op1"), ("op1", "op2"), ("C", "op2"), ("op2", "op3"), ("D", "op3")],
)


def test_join_chain_breaks_eq2_ties_by_m_plus_then_by_graph_order() -> None:
    assert properties(JOINS).M_plus == {"A": 3.0, "B": 3.0, "C": 6.0, "D": 10.0}
    after_b = properties(JOINS, outstanding={"A", "C", "D"})
    assert after_b.P == {"A": 1.0, "C": 0.0, "D": 0.0}
    assert after_b.M_plus == {"A": 4.0, "C": 4.0, "D": 8.0}
    assert tac_order(JOINS) == ["B", "A", "C", "D"]
    assert tic_order(JOINS) == ["B", "A", "C", "D"]  # M+ 2, 2, 3, 4 under the general oracle


# Re-computing matters: recvs r0 (3 s), r1 (4 s), r2 (3 s); o0 (1 s) <- {r0, r2}, o1 (3 s) <-
# {r0, r1}. At first all P are 0 and M+ is r0 = r2 = M(o0) = 6 < r1 = M(o1) = 7: r0 goes first.
# Then o0 waits for r2 alone and o1 for r1 alone: P_r1 = 3, P_r2 = 1, and r1 goes before r2
# (min(P_r1, M_r2) = 3 is not < min(P_r2, M_r1) = 1). Stale properties would have sent r2 (M+ 6
# < 7) - and r1 first is the better schedule: o1 (3 s) can run while r2 is in flight.
SHARED = TicTacGraph(
    ops=[Op("r0", 3.0, recv=True), Op("r1", 4.0, recv=True), Op("r2", 3.0, recv=True), Op("o0", 1.0), Op("o1", 3.0)],
    edges=[("r0", "o0"), ("r2", "o0"), ("r0", "o1"), ("r1", "o1")],
)


def test_tac_recomputes_properties_after_each_pick() -> None:
    assert properties(SHARED).M_plus == {"r0": 6.0, "r1": 7.0, "r2": 6.0}
    assert properties(SHARED, outstanding={"r1", "r2"}).P == {"r1": 3.0, "r2": 1.0}
    assert tac_order(SHARED) == ["r0", "r1", "r2"]


def test_tic_ignores_the_durations() -> None:
    # Under the general oracle every M+ here is 2 (each op needs two unit-cost recvs): a
    # three-way tie, kept in graph order - r1 listed first goes first, although by the
    # durations its M+ (7) is the largest.
    graph = TicTacGraph(ops=[SHARED.ops[1], SHARED.ops[0], SHARED.ops[2], *SHARED.ops[3:]], edges=SHARED.edges)
    assert properties(graph, timing="general").M_plus == {"r1": 2.0, "r0": 2.0, "r2": 2.0}
    assert tic_order(graph) == ["r1", "r0", "r2"]


def test_layer_chain_is_the_next_forward_pass_waiting_for_each_layer() -> None:
    graph = TicTacGraph.layer_chain([
        Layer(forward=1.0, backward=2.0, comms={"w0": 3.0, "b0": 0.5}),
        Layer(forward=1.0, backward=2.0, comms={"w1": 3.0}),
    ])
    assert set(graph.edges) == {
        ("forward[0]", "forward[1]"), ("forward[1]", "backward[1]"), ("backward[1]", "backward[0]"),
        ("w0", "forward[0]"), ("b0", "forward[0]"), ("w1", "forward[1]"),
    }
    assert {op.name: op.duration for op in graph.ops if op.recv} == {"w0": 3.0, "b0": 0.5, "w1": 3.0}
    assert tac_order(graph) == tic_order(graph) == ["w0", "b0", "w1"]


def test_layer_chain_orders_a_deep_model_front_to_back() -> None:
    # Transfers that get cheaper towards the output would go output-first by size; TicTac
    # follows the forward pass: layer i's forward unblocks only once layers 0..i are in.
    layers = [Layer(forward=0.1, backward=0.2, comms={f"w{i}": 1.0 / (i + 1)}) for i in range(30)]
    graph = TicTacGraph.layer_chain(layers)
    expected = [f"w{i}" for i in range(30)]
    assert tac_order(graph) == expected
    assert tic_order(graph) == expected


def test_policy_orders_by_graph_rank_then_own_priority_for_unknown_tasks() -> None:
    params = SchedulingParams(partition_bytes=math.inf, credit_bytes=1)
    policy = TicTacPolicy(params, variant="tic")
    assert policy.rank_of(BufferTask("recv2", 7, 10)) == 7  # no graph: layer order
    policy.set_graph(SPLIT)
    assert dict(policy.ranks) == {"b": 0, "c": 1, "a": 2}
    assert policy.rank_of(BufferTask("c", 0, 10)) == 1
    assert policy.rank_of(BufferTask("other", 2, 10)) == 3 + 2  # after every task the graph names


def test_a_graph_without_durations_is_ordered_by_the_variant_the_caller_names() -> None:
    """A traced graph carries no durations: the plugins order it by TIC on a TAC policy (what
    make_policy builds), whose own variant stays for later graphs."""
    policy = make_policy("tictac", SchedulingParams())
    assert isinstance(policy, TicTacPolicy)
    policy.set_graph(SPLIT, variant="tic")
    assert sorted(policy.ranks, key=policy.ranks.__getitem__) == tic_order(SPLIT) == ["b", "c", "a"]
    policy.set_graph(SPLIT)
    assert sorted(policy.ranks, key=policy.ranks.__getitem__) == tac_order(SPLIT) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="variant='tak'"):
        policy.set_graph(SPLIT, variant="tak")


def test_set_graph_reorders_subtasks_already_waiting() -> None:
    params = SchedulingParams(partition_bytes=math.inf, credit_bytes=1)
    policy = TicTacPolicy(params, variant="tac")
    scheduler = Scheduler(policy)
    blocker = BufferTask("blocker", 0, 10)
    scheduler.enqueue(blocker, 0.0)
    (sub,) = scheduler.ready(blocker, 0.0)
    for name, priority in (("c", 0), ("b", 1), ("a", 2)):
        task = BufferTask(name, priority, 10)
        scheduler.enqueue(task, 0.0)
        assert scheduler.ready(task, 0.0) == []  # the blocker holds the whole credit
    policy.set_graph(SPLIT)  # TAC: a, b, c - the reverse of their own priorities
    order = []
    for t in range(1, 4):
        (sub,) = scheduler.finish(sub, float(t))
        order.append(sub.task.name)
    assert order == ["a", "b", "c"]


def test_make_policy_builds_tac_and_bad_input_is_named() -> None:
    policy = make_policy("tictac", SchedulingParams())
    assert isinstance(policy, TicTacPolicy) and policy.variant == "tac"
    with pytest.raises(ConfigError, match="'tik'"):
        TicTacPolicy(SchedulingParams(), variant="tik")
    with pytest.raises(TypeError, match="TicTacGraph"):
        policy.set_graph({"recv1": ["op1"]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'x' is used twice"):
        TicTacGraph([Op("x"), Op("x", recv=True)])
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        TicTacGraph([Op("x")], [("x", "nope")])
    with pytest.raises(ValueError, match="cycle"):
        TicTacGraph([Op("x"), Op("y")], [("x", "y"), ("y", "x")])
    with pytest.raises(ValueError, match="'x' has duration -1"):
        TicTacGraph([Op("x", -1.0)])
    with pytest.raises(ValueError, match="not recvs of the graph"):
        properties(FIGURE_1A, outstanding={"op1"})
