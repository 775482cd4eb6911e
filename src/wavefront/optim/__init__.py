"""Fused optimizers."""
