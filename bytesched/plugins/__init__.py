"""Per-framework plugins: the glue between a training framework and the bytesched Core.

Each plugin wraps one tensor's communication as a :class:`~bytesched.core.CommTask`, signals the
Core when the tensor is ready (a Dependency Proxy after the computation that produces it) and when
its communication finished, and keeps the framework's own API so that enabling scheduling takes
two lines of user code. Plugins are imported explicitly (``bytesched.plugins.torch``,
``bytesched.plugins.mxnet``) so that using one framework never imports another.
"""
