"""The tools' built-in models by name, without importing torch: the console script lists them in
its help before any model is built (:mod:`.models` builds the paper's, :mod:`.gpucheck` its CNN)."""

PAPER_MODELS = ("vgg16", "resnet50", "transformer")
"""The ByteScheduler paper's three benchmark models (:data:`.models.BUILDERS`), which
``bytesched profile`` builds by name."""

CHECK_MODELS = ("cnn", "resnet50", "vgg16", "transformer")
"""What ``bytesched check-gpu`` can time: its own small CNN, and the paper's models."""
