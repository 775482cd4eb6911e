"""Fused optimizers."""

from __future__ import annotations

from wavefront.optim.adamw import AdamW

__all__ = ["AdamW"]
