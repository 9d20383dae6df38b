"""Emulated networks for benchmarks and the demo: shaped links inside Linux network namespaces."""

from .network import (Namespace, ShapingUnavailable, format_rate, namespace, parse_rate, shaped_loopback,
                      unavailable_reason)

__all__ = ["Namespace", "ShapingUnavailable", "format_rate", "namespace", "parse_rate", "shaped_loopback",
           "unavailable_reason"]
