"""The words the training options accept (torch-free: the CLI and config.py read them before torch loads)."""

from __future__ import annotations

#: ``--parallel``: "single", "ddp" and "fsdp2" name degenerate meshes (mesh.resolve); "auto" picks one.
PARALLEL_PLANS = ("auto", "single", "ddp", "fsdp2", "mesh")
DTYPES = ("auto", "fp32", "bf16")
#: What ``--compare`` can run side by side: Hugging Face's own PyTorch code ("baseline", or "eager" by the
#: name users know it under), ``torch.compile`` of that model, Liger-Kernel's patch (when installed), and
#: wavefront's patch.
VARIANTS = ("baseline", "eager", "compile", "liger", "wavefront")
