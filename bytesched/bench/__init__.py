"""Benchmarks behind ``bytesched bench <name>``: slow measurements kept out of the test suite.

Each benchmark is a module with ``register(subparsers)``; :mod:`bytesched.bench.cli` lists them.
"""
