"""Models by name. Always randomly initialised: no pretrained weights are ever downloaded."""

from __future__ import annotations

import torch
from torch import nn

from ddp_trainer.config import ModelName


class TinyCNN(nn.Module):
    """Two convolutions and a linear layer: fast on CPU for tests and demos.

    No BatchNorm on purpose: DDP does not sync batch statistics, so with BatchNorm two ranks of
    batch B do not train exactly like one process on 2B, and that equivalence is what tests check.
    """

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.classifier(self.features(x))
        return out


def build(name: ModelName, num_classes: int) -> nn.Module:
    if name == "tinycnn":
        return TinyCNN(num_classes)
    from torchvision import models

    model: nn.Module = getattr(models, name)(weights=None, num_classes=num_classes)
    return model
