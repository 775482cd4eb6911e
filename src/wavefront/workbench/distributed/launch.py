"""Starting the ranks of a distributed job: under torchrun, re-launched under torchrun, or spawned here.

Every job in this package (``train``, ``comm``, ``overlap``) runs on every rank. A job started by hand
either re-runs its own command line under torchrun (:func:`relaunch_under_torchrun`, what ``train
--nproc-per-node`` does) or spawns local processes that each call the job (:func:`spawn`, what ``comm
--nproc`` does).
"""

from __future__ import annotations

import gc
import importlib
import os
import pkgutil
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


class LaunchError(RuntimeError):
    """A rank failed, or the job could not be started; ``exit_code`` for the command line."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def under_launcher() -> bool:
    """Whether this process is a rank of a launched job (torchrun sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: torch.distributed modules whose function signatures default to ``group=group.WORLD``, a value read once, when the
#: module is first imported. Imported after init_process_group (torch._dynamo, FSDP and torch.distributed._shard
#: import torch.distributed.nn lazily, e.g. on the first torch.library custom op call), those defaults hold the
#: default process group for the rest of the process: destroy_process_group then only shuts it down, and the
#: gloo backend, with its worker and TCP-loop threads, lives on until the interpreter's last garbage collection
#: destroys it in the middle of Python's own teardown. Imported before, the defaults are None.
WORLD_DEFAULT_MODULES = ("torch.distributed.nn",)

#: Name prefixes of the threads a c10d backend runs (gloo's work loop and TCP loop, NCCL's watchdog), as
#: /proc/self/task/*/comm shows them.
C10D_THREAD_PREFIXES = ("pt_gloo", "gloo_", "pt_nccl", "pt_tcpstore")


def import_world_defaults() -> None:
    """Import :data:`WORLD_DEFAULT_MODULES` now; call it before init_process_group."""
    for name in WORLD_DEFAULT_MODULES:
        importlib.import_module(name)


def c10d_threads() -> list[str]:
    """Names of this process's threads that belong to a c10d backend (Linux /proc; [] elsewhere)."""
    names = []
    tasks = Path("/proc/self/task")
    for task in sorted(tasks.iterdir()) if tasks.is_dir() else ():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended while we looked
            continue
        if name.startswith(C10D_THREAD_PREFIXES):
            names.append(name)
    return names


def destroy_process_group(*, barrier: bool) -> list[str]:
    """Destroy every process group; first a barrier when every rank got here (after a failure a peer may be gone:
    pass barrier=False). Returns :func:`c10d_threads` afterwards: empty unless something still holds a group.

    torch's destroy_process_group shuts the groups down and forgets them, but a group object still referenced
    elsewhere lives on with its backend threads, and a gloo worker thread that drops a finished collective's
    tensors after the interpreter began finalizing aborts the process ("terminate called without an active
    exception"). Freed here instead, each group's destructor joins its threads while Python is fully alive."""
    import torch.distributed as dist  # lazy: torch-free import

    if dist.is_initialized():
        try:
            if barrier:
                dist.barrier()
        finally:
            dist.destroy_process_group()
            # Models and their FSDP2 state form reference cycles (module -> hook -> FSDPParam -> mesh info ->
            # group) that only the cyclic collector frees: now, rather than in the interpreter's final collection.
            gc.collect()
            _drop_mesh_groups()
    return c10d_threads()


def _drop_mesh_groups() -> None:
    """Empty the group registry of every DeviceMesh still alive. A mesh used by DTensor/FSDP2 outlives its model
    (torch keeps it referenced from outside Python's view) and holds its groups in ``_pg_registry``; after
    destroy_process_group those entries name destroyed groups, and dropping them frees the groups now."""
    device_mesh = sys.modules.get("torch.distributed.device_mesh")
    mesh_type = getattr(device_mesh, "DeviceMesh", None)
    if mesh_type is None:  # no mesh was ever made in this process
        return
    for obj in gc.get_objects():
        if issubclass(type(obj), mesh_type) and isinstance(getattr(obj, "_pg_registry", None), dict):
            obj._pg_registry.clear()


def init_process_group(backend: str):
    """Initialise the default process group from the environment; returns this rank's device.
    backend: "auto" (nccl with GPUs, else gloo), "nccl" or "gloo"."""
    import torch  # lazy: torch-free import
    import torch.distributed as dist  # lazy: torch-free import

    import_world_defaults()

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # Each rank gets an equal share of the cores instead of every rank spinning up all of them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return device


def _rank_main(local_rank: int, world: int, port: int, fn: Callable, request) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(local_rank),
                       "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)})
    fn(request)


def spawn(fn: Callable, request, nproc: int, preload: Sequence[str] = ()) -> None:
    """Run ``fn(request)`` on `nproc` local ranks (a free rendezvous port); `fn` must be importable by
    name (a module-level function). Raises LaunchError with the failing rank's last message.

    preload: modules to import here first (``pkg.*``: every submodule of pkg); the ranks then fork from this
    process with them loaded instead of each importing them again (several CPU seconds per rank for torch and
    transformers). Only for a caller that has computed nothing yet, so no thread pool exists to fork."""
    import torch.multiprocessing as mp  # lazy: torch-free import

    for name in preload:
        if name.endswith(".*"):
            package = importlib.import_module(name[:-2])
            for module in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{package.__name__}.{module.name}")
        else:
            importlib.import_module(name)
    try:
        mp.start_processes(_rank_main, args=(nproc, free_port(), fn, request), nprocs=nproc, join=True,
                           start_method="fork" if preload else "spawn")
    except mp.ProcessRaisedException as exc:
        last = [line for line in str(exc).strip().splitlines() if line.strip()][-1]
        raise LaunchError(f"a rank failed: {last}") from None
    except mp.ProcessExitedException as exc:
        if exc.exit_code not in (0, None):
            raise LaunchError(f"a rank exited with code {exc.exit_code}", exc.exit_code) from None


def replace_option(argv: Sequence[str], option: str, value: str) -> list[str]:
    """`argv` with the value of `option` (``--opt V`` or ``--opt=V``) replaced by `value`."""
    out, skip = [], False
    for arg in argv:
        if skip:
            out.append(value)
            skip = False
        elif arg == option:
            out.append(arg)
            skip = True
        else:
            out.append(f"{option}={value}" if arg.startswith(f"{option}=") else arg)
    return out


def save_stdin(out_dir: str, name: str) -> str:
    """Standard input saved as `out_dir`/`name` (a document piped into a job whose ranks all need it)."""
    path = Path(out_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(sys.stdin.read())
    return str(path)


def relaunch_under_torchrun(argv: Sequence[str], nproc: int, drop_option: str) -> int:
    """Re-run ``python -m wavefront <argv>`` under torchrun with `nproc` processes, without `drop_option`
    (and its value). Relays the ranks' stderr minus torchrun's own tracebacks (each rank already printed
    one clear line); returns torchrun's exit code."""
    clean: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == drop_option:
            skip = True
        elif not arg.startswith(f"{drop_option}="):
            clean.append(arg)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "wavefront", *clean]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    in_agent_report = False
    for line in proc.stderr:
        if line.startswith("Traceback") or "ChildFailedError" in line:
            in_agent_report = True
        if not in_agent_report and "distributed/elastic" not in line and "distributed.elastic" not in line:
            sys.stderr.write(line)
    return proc.wait()
