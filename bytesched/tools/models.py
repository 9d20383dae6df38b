"""The three benchmark models of the ByteScheduler paper, as plain torch modules.

They exist so that ``bytesched profile`` can build the shipped profiles (parameter sizes from
the architectures, compute from counted FLOPs) and measure them on a real device, without
torchvision. The layer shapes follow the original papers: VGG16 (configuration D, 138,357,544
parameters), ResNet50 (v1.5: stride on the 3x3 convolution, 25,557,032 parameters) and the base
Transformer of "Attention is all you need" (6+6 layers, d_model 512, 8 heads, FFN 2048) with a
32,000-token vocabulary and separate source, target and output embeddings.

Each builder returns ``(model, make_inputs)``: ``make_inputs(batch, device)`` gives the
positional inputs of one batch. Importing this module imports torch.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch
from torch import nn

InputFactory = Callable[[int, "torch.device | str"], tuple[torch.Tensor, ...]]

_VGG16_BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


def vgg16(num_classes: int = 1000, image_size: int = 224) -> tuple[nn.Module, InputFactory]:
    """VGG16 for ImageNet (configuration D, no batch norm); layers named conv1_1 ... fc8."""
    features: OrderedDict[str, nn.Module] = OrderedDict()
    channels = 3
    for block, widths in enumerate(_VGG16_BLOCKS, start=1):
        for i, width in enumerate(widths, start=1):
            features[f"conv{block}_{i}"] = nn.Conv2d(channels, width, 3, padding=1)
            features[f"relu{block}_{i}"] = nn.ReLU(inplace=True)
            channels = width
        features[f"pool{block}"] = nn.MaxPool2d(2)
    side = image_size // 32
    classifier = OrderedDict([
        ("fc6", nn.Linear(512 * side * side, 4096)), ("relu6", nn.ReLU(inplace=True)), ("drop6", nn.Dropout()),
        ("fc7", nn.Linear(4096, 4096)), ("relu7", nn.ReLU(inplace=True)), ("drop7", nn.Dropout()),
        ("fc8", nn.Linear(4096, num_classes)),
    ])
    model = nn.Sequential(OrderedDict([("features", nn.Sequential(features)), ("flatten", nn.Flatten()),
                                       ("classifier", nn.Sequential(classifier))]))
    return model, _images(image_size)


class _Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 reduce, 3x3 (strided), 1x1 expand, plus the shortcut."""

    def __init__(self, inplanes: int, planes: int, stride: int) -> None:
        super().__init__()
        width, out = planes, planes * 4
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(y + shortcut)


class _ResNet50(nn.Module):
    """ResNet50 v1.5 with torchvision's layer names (conv1, bn1, layer1..4, fc)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = 64
        for stage, (planes, count, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), start=1):
            blocks = []
            for i in range(count):
                blocks.append(_Bottleneck(inplanes, planes, stride if i == 0 else 1))
                inplanes = planes * 4
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in range(1, 5):
            x = getattr(self, f"layer{stage}")(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet50(num_classes: int = 1000, image_size: int = 224) -> tuple[nn.Module, InputFactory]:
    """ResNet50 v1.5 for ImageNet."""
    return _ResNet50(num_classes), _images(image_size)


class _Seq2Seq(nn.Module):
    """Embeddings, the encoder-decoder and the output projection, called in that order."""

    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, ffn: int) -> None:
        super().__init__()
        self.source_embedding = nn.Embedding(vocab, d_model)
        self.target_embedding = nn.Embedding(vocab, d_model)
        self.transformer = nn.Transformer(d_model, heads, layers, layers, ffn, dropout=0.1, batch_first=True)
        self.output = nn.Linear(d_model, vocab)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        hidden = self.transformer(self.source_embedding(source), self.target_embedding(target))
        return self.output(hidden)


def transformer(vocab: int = 32_000, d_model: int = 512, heads: int = 8, layers: int = 6, ffn: int = 2048,
                sequence: int = 64) -> tuple[nn.Module, InputFactory]:
    """The base Transformer; one sample is a (source, target) pair of ``sequence`` tokens, so
    a batch of 64 samples is the 4,096 tokens of tensor2tensor's ``transformer_base``."""
    model = _Seq2Seq(vocab, d_model, heads, layers, ffn)

    def make_inputs(batch: int, device: "torch.device | str") -> tuple[torch.Tensor, ...]:
        source = torch.randint(0, vocab, (batch, sequence), device=device)
        return source, torch.randint(0, vocab, (batch, sequence), device=device)

    return model, make_inputs


def _images(image_size: int) -> InputFactory:
    def make_inputs(batch: int, device: "torch.device | str") -> tuple[torch.Tensor, ...]:
        return (torch.randn(batch, 3, image_size, image_size, device=device),)
    return make_inputs


BUILDERS: dict[str, Callable[[], tuple[nn.Module, InputFactory]]] = {
    "vgg16": vgg16,
    "resnet50": resnet50,
    "transformer": transformer,
}

DESCRIPTIONS = {
    "vgg16": "VGG16 (configuration D, 138,357,544 parameters), ImageNet 224x224 images",
    "resnet50": "ResNet50 v1.5 (25,557,032 parameters), ImageNet 224x224 images",
    "transformer": "Transformer base (6+6 layers, d_model 512, FFN 2048, 8 heads, 32,000-token vocabulary, "
                   "separate source/target/output embeddings), samples are sentence pairs of 64 tokens",
}
