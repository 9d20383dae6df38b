"""Tensor fusion: small gradients share one CommTask (a *bucket*), so each costs no message of its own.

Every collective pays a fixed cost (a Gloo round trip, a rank-0 order announcement, the Core's
events), several times a small tensor's payload, which DDP's buckets pay a few times per step
(figures: docs/experiments/per-tensor-cost.md, "Figures behind the PyTorch plugin's rules").
A bucket is a run of parameters, consecutive in the optimizer's order (the reverse of which is
the order backward produces them for most models), of one group, dtype and device, holding at
most ``fusion_bytes`` together; a larger parameter is a bucket alone.
The bucket's gradients are copied into one flat buffer, which the Core partitions and orders like
any tensor, and copied back once it is reduced: the per-element arithmetic is that of the
unfused all-reduce.

Ranks may register parameters in different orders, so rank 0's layout is the job's: it is sent
to the others once, at construction, by name. A start-up plan that stays out of the way later
merges consecutive buckets under a larger bound (:func:`merge_buckets`), from that common layout
and the members' sizes alone, so every rank merges alike without another collective.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from bytesched.core import filled_runs, fusion_runs

if TYPE_CHECKING:
    from .backend import Backend
    from .slots import ParamSlot
    from .task import GradientTask


class Bucket:
    """Parameters whose gradients are all-reduced as one CommTask.

    Attributes:
        slots: the members, in the order their gradients lie in the flat buffer.
        name: the CommTask's name, identical on every rank: the first member's name, with
            ``+N`` for the N other members.
        group: the members' index in the optimizer's ``param_groups`` (shared).
        task: the bucket's GradientTask, from the moment every member's gradient was ready until
            the members' updates were applied (or discarded).
        waiting: members whose gradient of this iteration is not final yet.
    """

    __slots__ = ("slots", "name", "group", "task", "waiting")

    def __init__(self, slots: Sequence["ParamSlot"]) -> None:
        self.slots = list(slots)
        first = self.slots[0]
        self.name = first.name if len(self.slots) == 1 else f"{first.name}+{len(self.slots) - 1}"
        self.group = first.group
        self.task: "GradientTask | None" = None
        self.waiting = len(self.slots)
        for slot in self.slots:
            slot.bucket = self

    @property
    def priority(self) -> int:
        """The most urgent member's: the bucket is needed as soon as that one is."""
        slots = self.slots
        return slots[0].priority if len(slots) == 1 else min(slot.priority for slot in slots)

    def __repr__(self) -> str:
        return f"Bucket({self.name!r}, {len(self.slots)} parameters)"


def plan_buckets(slots: Sequence["ParamSlot"], fusion_bytes: float) -> list[list[int]]:
    """Indices into ``slots`` of each bucket: consecutive runs of one kind (group, dtype, device)
    holding at most ``fusion_bytes`` together, or a single larger parameter."""
    return fusion_runs([_nbytes(slot) for slot in slots], fusion_bytes, [_kind(slot) for slot in slots])


def _nbytes(slot: "ParamSlot") -> int:
    return slot.param.numel() * slot.param.element_size()


def _kind(slot: "ParamSlot") -> tuple:
    """What parameters sharing a bucket have in common: group, dtype and device."""
    return slot.group, slot.param.dtype, slot.param.device


def agree_on_buckets(backend: "Backend", slots: Sequence["ParamSlot"], fusion_bytes: float) -> list[Bucket]:
    """Rank 0's buckets, on every rank (a collective: one all-gather of two integers per parameter).

    Rank 0 plans in its own order; it sends, for each member in bucket order, the member's index
    among the parameter names sorted (the same on every rank: construction checked that the names
    match) and its bucket's number.
    """
    plan = plan_buckets(slots, fusion_bytes)
    if backend.size == 1:
        return [Bucket([slots[i] for i in members]) for members in plan]
    by_name = sorted(range(len(slots)), key=lambda i: slots[i].name)
    name_index = {slot_index: position for position, slot_index in enumerate(by_name)}
    local = torch.tensor([value for number, members in enumerate(plan) for i in members
                          for value in (name_index[i], number)], dtype=torch.int64)
    rank0 = backend.all_gather(local)[0].view(-1, 2).tolist()
    buckets: list[list["ParamSlot"]] = []
    for position, number in rank0:
        if number == len(buckets):
            buckets.append([])
        buckets[number].append(slots[by_name[position]])
    return [Bucket(members) for members in buckets]


def backward_order(buckets: Sequence[Bucket]) -> list[Bucket]:
    """``buckets`` in the order backward produces them (the last layer's first): the same on every
    rank, since priorities come from the first forward pass."""
    return sorted(buckets, key=lambda bucket: -bucket.priority)


def merge_buckets(buckets: Sequence[Bucket], fusion_bytes: float) -> list[Bucket]:
    """``buckets`` merged into runs of consecutive buckets of one kind (group, dtype, device),
    each closed once it holds ``fusion_bytes`` (DDP's rule, :func:`bytesched.core.filled_runs`);
    the first bucket stays alone (in most models the first layers', which backward produces last): what is
    all-reduced after backward ended stays as small as before, while the others merge (measured:
    docs/experiments/per-tensor-cost.md, "Figures behind the PyTorch plugin's rules"). The
    members keep their order, and the first bucket is the
    same on every rank (rank 0's layout), so every rank merges alike."""
    first, rest = buckets[0], buckets[1:]
    runs = filled_runs([sum(_nbytes(slot) for slot in bucket.slots) for bucket in rest], fusion_bytes,
                       [_kind(bucket.slots[0]) for bucket in rest])
    return [Bucket(first.slots), *(Bucket([slot for index in run for slot in rest[index].slots]) for run in runs)]


def pack(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The gradients' elements in one contiguous buffer: flat for several, and for a lone
    gradient the gradient's own memory in its own shape (nothing copied, not even a flat view;
    the buffer is flattened only where it is split into partitions).

    The buffer never shares a version counter with a gradient, so what the backend writes into it
    (Gloo's CUDA path copies the reduced result back, bumping the counter) leaves the gradients'
    ``_version`` alone: a change there is the user's doing (see ``GradientTask.modified``)."""
    if len(grads) == 1:
        grad = grads[0]
        # A view of the gradient would share its counter; ``.data`` is the same memory under a
        # counter of its own.
        return grad.data if grad.is_contiguous() else grad.contiguous()
    return _flatten_dense_tensors(grads)


def unpack(reduced: torch.Tensor, grads: Sequence[torch.Tensor]) -> None:
    """Write each gradient's share of ``reduced`` back into it, unless it is that memory (a lone
    gradient :func:`pack` did not copy). Several gradients are split and copied by two calls into
    torch's C++ rather than a Python step each, which costs under half as much per gradient
    (figures: docs/experiments/per-tensor-cost.md, "Figures behind the PyTorch plugin's rules")."""
    if len(grads) == 1:
        grad = grads[0]
        if reduced.data_ptr() != grad.data_ptr():
            grad.copy_(reduced.view(grad.shape))
        return
    torch._foreach_copy_(list(grads), _unflatten_dense_tensors(reduced, grads))
