"""Scheduling policies, selected by name (``BYTESCHED_POLICY``); see docs/policies.md."""

from __future__ import annotations

from ..config import SIMULATED_POLICIES, ConfigError, SchedulingParams
from .base import CreditPolicy, Policy, PriorityPolicy, Window
from .bytescheduler import ByteSchedulerPolicy
from .fifo import FifoPolicy
from .follow import FollowOrderPolicy, ImmediatePolicy, order_mode, ps_order
from .p3 import P3Policy
from .prophet import ProphetPolicy
from .tictac import TicTacPolicy

_REGISTRY: dict[str, type[Policy]] = {
    ByteSchedulerPolicy.name: ByteSchedulerPolicy,
    FifoPolicy.name: FifoPolicy,
    P3Policy.name: P3Policy,
    TicTacPolicy.name: TicTacPolicy,
    ProphetPolicy.name: ProphetPolicy,
}


def register(cls: type[Policy]) -> type[Policy]:
    """Add a policy class to the registry under ``cls.name`` (used as a class decorator)."""
    _REGISTRY[cls.name] = cls
    return cls


def make_policy(name: str, params: SchedulingParams) -> Policy:
    """Instantiate the policy called ``name`` (one of :data:`SIMULATED_POLICIES`; a job's
    configuration admits only :data:`~bytesched.core.config.POLICIES`)."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"policy {name!r} is unknown: expected one of {', '.join(SIMULATED_POLICIES)}") from None
    return cls(params)


def partition_size(name: str, params: SchedulingParams) -> float:
    """The partition size policy ``name`` cuts tensors into under ``params`` (its own default
    where ``params`` name none): what the Scheduler uses, for the plugins that cut a tensor's
    pieces themselves."""
    return make_policy(name, params).partition_bytes()


__all__ = [
    "Policy", "PriorityPolicy", "CreditPolicy", "Window", "ByteSchedulerPolicy", "FifoPolicy",
    "P3Policy", "TicTacPolicy", "ProphetPolicy", "ImmediatePolicy", "FollowOrderPolicy",
    "make_policy", "order_mode", "partition_size", "ps_order", "register",
]
