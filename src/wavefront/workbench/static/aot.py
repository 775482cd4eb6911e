"""Compile one recorded launch ahead of time for a GPU target, the way Triton's JIT would, and read it.

The specialization comes from Triton itself: the launch's arguments are replaced by light proxies that
carry what specialization looks at (a tensor's dtype, data pointer and byte range; an int's value) and
passed through the JIT's own binder (``create_function_from_signature``) and ``JITFunction._pack_args``
for the target's backend. That gives the signature (``*bf16``, ``i32``/``i64``, ``fp32``, constexpr for
None and for ints equal to 1), the ``tt.divisibility`` 16 attributes (16-byte aligned pointers, ints
divisible by 16) and, on AMD, ``tt.pointer_range`` 32 for tensors under 2 GiB (buffer instructions) -
exactly what a real launch with the benchmark's tensors would produce.

Compilation runs in worker processes (``python -m wavefront.workbench.static.aot``) with the Triton
interpreter off: under ``TRITON_INTERPRET=1`` the kernels are ``InterpretedFunction`` objects that
``triton.compile`` cannot take (a kernel's @triton.jit helpers would be interpreted functions too), and
the workers compile in parallel. They are plain subprocesses fed pickled jobs on stdin, so the caller's
main module is never re-imported (as multiprocessing's spawn would). Kernels are found again in the
worker by module and qualified name (or by file, for kernels defined in test modules).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wavefront.runtime import get_arch
from wavefront.workbench.static.parse import MachineCode, parse_amdgcn, parse_nvidia, parse_ptx_widths


@dataclass(frozen=True)
class TensorProxy:
    """What Triton's specialization reads from a tensor argument (picklable, no storage)."""

    dtype: Any  # torch.dtype
    ptr: int
    range_bytes: int  # bytes from the first to one past the last element (the HIP backend's ptr_range)

    def data_ptr(self) -> int:
        return self.ptr

    def ptr_range(self) -> int:
        return self.range_bytes


@dataclass(frozen=True)
class CompileJob:
    """One kernel specialization for one target."""

    module: str
    qualname: str
    file: str  # the module's source file: fallback when the module is not importable by name
    args: tuple[Any, ...]  # positional runtime args: TensorProxy, int, float, bool or None
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]
    target: str  # "sm_90", "gfx942", ...
    keep_asm: bool = False
    frontend_only: bool = False  # stop after Triton's front end: TTIR only (e.g. to look for tt.dot)


@dataclass
class CompileResult:
    ok: bool
    target: str
    kernel: str
    code: MachineCode | None = None
    num_warps: int = 0
    threads_per_block: int = 0
    shared_bytes: int = 0  # Triton's dynamic shared memory / LDS per block
    signature: dict[str, str] = field(default_factory=dict)
    divisible_args: list[str] = field(default_factory=list)  # args specialized as divisible by 16
    ptx_load_widths: dict[int, int] = field(default_factory=dict)
    ptx_store_widths: dict[int, int] = field(default_factory=dict)
    asm: dict[str, str] = field(default_factory=dict)
    uses_dot: bool | None = None  # the front-end IR has tt.dot / tt.dot_scaled (matrix units)
    error: str | None = None
    compile_s: float = 0.0  # CPU wall time of the compile: not a performance figure


def gpu_target(name: str):
    """The triton GPUTarget for a compile-target name ("sm_90", "gfx942", ...)."""
    from triton.backends.compiler import GPUTarget  # lazy: Triton-free import

    arch = get_arch(name)
    if arch.family == "nvidia":
        return GPUTarget("cuda", int(name.removeprefix("sm_")), arch.warp_size)
    if arch.family.startswith("amd"):
        return GPUTarget("hip", name, arch.warp_size)
    raise ValueError(f"{name!r} is not a GPU compile target")


def _load_kernel(job: CompileJob):
    from triton.runtime.jit import JITFunction  # lazy: Triton-free import

    try:
        module = importlib.import_module(job.module)
    except ImportError:
        spec = importlib.util.spec_from_file_location(f"_wavefront_inspect_{abs(hash(job.file))}", job.file)
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    obj = module
    for part in job.qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, JITFunction):
        raise TypeError(f"{job.module}.{job.qualname} is {type(obj).__name__}, not a JITFunction "
                        "(is TRITON_INTERPRET set in the compile worker?)")
    return obj


def specialize(fn, target, args: tuple, constexprs: dict, options: dict):
    """(signature, constexprs, attrs, options) exactly as the JIT derives them for `target`."""
    from triton.compiler.compiler import make_backend  # lazy: Triton-free import
    from triton.runtime.jit import create_function_from_signature  # lazy: Triton-free import

    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = dict(constexprs) | dict(options)
    bound, specialization, opts = binder(*args, **kwargs)
    return fn._pack_args(backend, kwargs, bound, specialization, opts)


def frontend_ir(src, target, options: dict) -> str:
    """The TTIR Triton's front end makes for `src` (the first step of ``triton.compile``, without the rest)."""
    from triton._C.libtriton import ir  # lazy: Triton-free import
    from triton.compiler.compiler import make_backend  # lazy: Triton-free import

    backend = make_backend(target)
    opts = backend.parse_options(dict(options))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), context)
    return str(module)


def _one_line(exc: BaseException) -> str:
    """An exception in one line: its type, first line and last line (Triton's CompilationError puts the
    source excerpt between them), and the underlying cause."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = " ... ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else ""
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip() and str(cause).strip() not in text:
        text += f" (cause: {type(cause).__name__}: {str(cause).strip().splitlines()[-1]})"
    return f"{type(exc).__name__}: {text[:400]}"


def _run_tool(tool: str, *args: str) -> str:
    from triton import knobs  # lazy: Triton-free import

    path = getattr(knobs.nvidia, tool).path
    out = subprocess.run([path, *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{tool} failed ({out.returncode}): {out.stderr.strip()[:300]}")
    return out.stdout


def _source_class(fn):
    """Triton's AST source for a ``@triton.jit`` kernel, Gluon's for a ``@gluon.jit`` one (``triton.compile``
    takes either; a Gluon kernel's IR starts with explicit layouts)."""
    from triton.compiler import ASTSource  # lazy: Triton-free import

    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource  # lazy: Triton-free import

        return GluonASTSource
    return ASTSource


def compile_job(job: CompileJob) -> CompileResult:
    """Compile and read one job; errors are returned, not raised (a kernel that stops compiling is a finding)."""
    t0 = time.perf_counter()
    result = CompileResult(ok=False, target=job.target, kernel=job.qualname.split(".")[-1])
    try:
        import triton  # lazy: Triton-free import

        fn = _load_kernel(job)
        target = gpu_target(job.target)
        options = dict(job.options)
        _, signature, constexprs, attrs = specialize(fn, target, job.args, dict(job.constexprs), options)
        result.signature = {k: str(v) for k, v in signature.items()}
        result.divisible_args = [fn.arg_names[path[0]] for path, a in attrs.items()
                                 if any(x[0] == "tt.divisibility" for x in a)]
        src = _source_class(fn)(fn, signature, constexprs, attrs)
        if job.frontend_only:
            ttir = frontend_ir(src, target, options)
            result.uses_dot = "tt.dot" in ttir
            if job.keep_asm:
                result.asm = {"ttir": ttir}
            result.ok = True
            return result
        kernel = triton.compile(src, target=target, options=options)
        # A Gluon kernel starts at TTGIR (no TTIR), where its products are ttng.warp_group_dot / tc_gen5_mma.
        front = kernel.asm["ttir"] if "ttir" in kernel.asm else kernel.asm["ttgir"]
        result.uses_dot = any(op in front for op in ("tt.dot", "warp_group_dot", "tc_gen5_mma"))
        md = kernel.metadata
        result.num_warps = int(md.num_warps)
        result.threads_per_block = result.num_warps * get_arch(job.target).warp_size
        result.shared_bytes = int(md.shared)
        if target.backend == "cuda":
            with tempfile.TemporaryDirectory() as tmp:
                cubin = Path(tmp) / "kernel.cubin"
                cubin.write_bytes(kernel.asm["cubin"])
                resources = _run_tool("cuobjdump", "--dump-resource-usage", str(cubin))
                sass = _run_tool("cuobjdump", "-sass", str(cubin))
            result.code = parse_nvidia(resources, sass, md.name, kernel.asm["ptx"])
            result.ptx_load_widths, result.ptx_store_widths, _ = parse_ptx_widths(kernel.asm["ptx"])
            if job.keep_asm:
                result.asm = {"ptx": kernel.asm["ptx"], "sass": sass, "resources": resources}
        else:
            result.code = parse_amdgcn(kernel.asm["amdgcn"])
            if job.keep_asm:
                result.asm = {"amdgcn": kernel.asm["amdgcn"]}
        result.ok = True
    except Exception as exc:  # reported per kernel x target; the run goes on
        last = traceback.extract_tb(exc.__traceback__)[-1:] or [None]
        where = f" ({Path(last[0].filename).name}:{last[0].lineno})" if last[0] else ""
        result.error = f"{_one_line(exc)}{where}"
    finally:
        result.compile_s = time.perf_counter() - t0
    return result


# ---------------------------------------------------------------------------------------------------
# Worker processes: length-prefixed pickles over the worker's stdin/stdout.

_HEADER = struct.Struct("<Q")


def _send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _recv(stream):
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("compile worker closed its pipe")
    (n,) = _HEADER.unpack(head)
    return pickle.loads(stream.read(n))


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "0"
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated to silence its warning
    # The parent's import path (src checkouts, test directories) so kernels import the same way.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "wavefront.workbench.static.aot"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_worker_env())

    def run(self, job: CompileJob) -> CompileResult:
        _send(self.proc.stdin, job)
        return _recv(self.proc.stdout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class WorkerPool:
    """`n` compile workers, started on first use and reused; a worker that dies is replaced."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"workers must be >= 1, got {n}")
        self.n = n
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._sem = threading.Semaphore(n)

    def compile(self, job: CompileJob) -> CompileResult:
        with self._sem:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = _Worker()
            try:
                result = worker.run(job)
            except (EOFError, OSError, pickle.UnpicklingError) as exc:
                worker.close()
                code = worker.proc.returncode
                return CompileResult(ok=False, target=job.target, kernel=job.qualname.split(".")[-1],
                                     error=f"compile worker died ({type(exc).__name__}, exit code {code})")
            with self._lock:
                self._idle.append(worker)
            return result

    def close(self) -> None:
        with self._lock:
            workers, self._idle = self._idle, []
        for w in workers:
            w.close()


def serve() -> None:
    """Worker main loop: compile jobs from stdin until it closes. Results go out on the original stdout;
    anything else the compile prints is sent to stderr so it cannot corrupt the stream.

    At the end the worker leaves without interpreter finalization: a Gluon kernel compiled on a cold Triton
    cache leaves four ``ir.attribute`` objects alive inside Triton's extension (no Python container holds them;
    a ``gc.collect()`` does not free them), and nanobind's shutdown check then prints 25-48 lines of "nanobind:
    leaked ..." on the caller's terminal, after its summary and without a final newline. The worker has no
    state to save: every result has been sent and flushed."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr
    stdin = sys.stdin.buffer
    while True:
        try:
            job = _recv(stdin)
        except EOFError:
            break
        _send(out, compile_job(job))
    sys.stderr.flush()
    out.flush()
    os._exit(0)


if __name__ == "__main__":
    # Through the package, so pickled results name wavefront.workbench.static.aot, not __main__.
    from wavefront.workbench.static import aot as inspect_compile

    inspect_compile.serve()
