"""The first forward pass as the plugins trace it (bytesched.core.forward): the priority order, and
TicTac's graph, whose TIC order on a branching model (an Inception-style block) differs from the
layer order; the PyTorch plugin hands that order to a ``tictac`` Core and trains bit for bit."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from bytesched.core import Config, SchedulingParams
from bytesched.core.forward import ForwardOp, ForwardRecorder, forward_order
from bytesched.core.policies.tictac import tic_order
from bytesched.plugins.torch import ScheduledOptimizer
from bytesched.plugins.torch.trace import ForwardTrace


class Inception(nn.Module):
    """A stem, then three branches of one and two convolutions joined by a concatenation, then a
    classifier: the branches' second convolutions wait for their first, which wait for the stem
    only."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.a = nn.Conv2d(8, 4, 1)
        self.b1, self.b2 = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 4, 3, padding=1)
        self.c1, self.c2 = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 4, 5, padding=2)
        self.fc = nn.Linear(12 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        branches = [self.a(x), self.b2(torch.relu(self.b1(x))), self.c2(torch.relu(self.c1(x)))]
        return self.fc(torch.cat(branches, 1).flatten(1))


LAYER_ORDER = ["stem", "a", "b1", "b2", "c1", "c2", "fc"]
"""The order the forward pass first reads the layers' parameters in."""
TIC_ORDER = ["stem", "a", "b1", "c1", "b2", "c2", "fc"]
"""TIC (general oracle, a transfer costs 1): a recv goes by the least number of transfers an op
needing it and another one waits for (M+). Stem 2 (its weight and bias), each branch's first
convolution 4, each second one 6, the classifier all 14; ties keep the forward order."""


def params_in(layers: list[str]) -> list[str]:
    return [f"{layer}.{kind}" for layer in layers for kind in ("weight", "bias")]


def test_the_recorder_folds_a_chain_into_its_op_and_keeps_reads_and_joins() -> None:
    x, w1, w2, t1, t2, t3, t4, t5 = (object() for _ in range(8))
    recorder = ForwardRecorder()
    recorder.op([x, w1], [t1])  # op 0 reads the input and w1
    recorder.op([t1], [t2])  # an activation: folded into op 0
    recorder.op([t2, w2], [t3])  # op 1 reads w2 and op 0's result
    recorder.op([t2], [t4])  # folded into op 0
    recorder.op([t3, t4], [t5])  # a join of op 1 and op 0: op 2
    forward = recorder.finish()
    assert forward.first_reads == {id(x): 0, id(w1): 1, id(w2): 2}
    assert forward.ops == (ForwardOp((), (id(x), id(w1))), ForwardOp((0,), (id(w2),)), ForwardOp((1, 0), ()))
    read, unread = forward_order(["w2", "w1", "lost"], {"w1": [id(w1)], "w2": [id(w2)], "lost": [7]}.__getitem__,
                                 forward)
    assert (read, unread) == (["w1", "w2"], ["lost"])


def traced(model: nn.Module, recorder: ForwardRecorder) -> ForwardTrace:
    """``model``'s first forward pass through a ForwardTrace, driven by module hooks as the
    plugin's forward proxies drive it."""
    trace = ForwardTrace(model.parameters(), recorder)
    for module in model.modules():
        module.register_forward_pre_hook(lambda m, args: trace.module_enter(m))
        module.register_forward_hook(lambda m, args, out: trace.module_exit(m))
    model(torch.randn(2, 3, 6, 6))
    assert trace.state == "done"
    return trace


def test_tic_on_a_traced_branching_pass_differs_from_the_layer_order() -> None:
    model = Inception()
    recorder = ForwardRecorder()
    trace = traced(model, recorder)
    names = {id(p): name for name, p in model.named_parameters()}
    assert [names[key] for key in sorted(trace.first_read, key=lambda key: trace.first_read[key][0])] \
        == params_in(LAYER_ORDER)
    graph = recorder.finish().tictac_graph({key: [name] for key, name in names.items()})
    assert tic_order(graph) == params_in(TIC_ORDER) != params_in(LAYER_ORDER)
    # The folded graph holds an op per parameter read (7 layers) and the one join (the
    # concatenation), not every activation and reshape.
    assert len([op for op in graph.ops if not op.recv]) == 8


def test_a_tictac_optimizer_orders_its_core_by_tic_and_trains_bit_for_bit(one_rank_group: object,
                                                                         tmp_path: Path) -> None:
    """BYTESCHED_POLICY=tictac with the PyTorch plugin: one task per parameter (no fusion); after
    the first forward pass the Core's TicTac ranks are TIC's order, which the timeline records
    with the forward pass's own order, and three steps give the bits of the plain optimizer."""
    torch.manual_seed(0)
    reference = Inception()
    model = copy.deepcopy(reference)
    config = Config(policy="tictac", params=SchedulingParams(partition_bytes=512, credit_bytes=1024), fusion_bytes=1,
                    timeline=str(tmp_path / "tl.json"))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    opt = ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), config=config)
    x = torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    try:
        for _ in range(3):
            for net, optimizer in ((reference, ref_opt), (model, opt)):
                optimizer.zero_grad()
                net(x).square().sum().backward()
                optimizer.step()
        opt.synchronize()
        ranks = opt._core.policy.ranks
        assert sorted(ranks, key=ranks.__getitem__) == params_in(TIC_ORDER)
    finally:
        opt.close()
    for a, b in zip(reference.parameters(), model.parameters()):
        assert torch.equal(a, b)
    from bytesched.core import shutdown
    shutdown()  # writes the timeline's end
    events = json.loads((tmp_path / "tl.json").read_text())
    orders = {e["name"]: e["args"] for e in events if e.get("ph") == "i"}
    assert orders["priority order"] == {"source": "forward pass", "order": params_in(LAYER_ORDER)}
    assert orders["tictac order"]["order"] == params_in(TIC_ORDER)
