"""bytesched: priority- and credit-based scheduling of gradient communication."""

__version__ = "0.1.0"
