"""Memcheck for interpreted Triton kernels: every load, store, atomic and tensor-descriptor block of every
``@triton.jit`` kernel run under the Triton interpreter (``TRITON_INTERPRET=1``) is bounds-checked lane by lane
against the kernel's tensor arguments; a violation raises :class:`MemcheckError` (kernel, program id, operation,
offending offsets, the tensor's extent) before the access happens. See docs/memcheck.md.

    import wavefront.memcheck as memcheck

    with memcheck.checking():
        my_kernel[grid](x, y, n, BLOCK=128)   # any kernel, wavefront's or yours

``WAVEFRONT_MEMCHECK=1`` turns it on for the whole process (applied when this module is imported and at the
first wavefront launch); the test suite runs with it on (``pytest --no-memcheck`` turns it off).
"""

from __future__ import annotations

from wavefront.kernels._memcheck import Extent, MemcheckError, checking, enabled, env_mode, indirect, install_from_env

__all__ = ["Extent", "MemcheckError", "checking", "enabled", "env_mode", "indirect", "install_from_env"]

install_from_env()
