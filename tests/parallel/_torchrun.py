"""Run a worker script of this folder on N gloo processes under torchrun; collect rank 0's JSON."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from filelock import FileLock

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parents[1] / "src")


@contextlib.contextmanager
def process_group(out: str):
    """Worker side, around the whole of every worker's main: the gloo default group for the body, then its
    teardown, also when the body raises. Leaving normally (every rank got here) means a barrier first; after an
    exception a peer may be gone, so no barrier. At interpreter exit (atexit: the worker's locals, a subgroup
    among them, are gone by then) each rank records the c10d threads still alive in `teardown_path(out, rank)`
    for run_worker to assert on: none, so no backend thread is left for Python's own shutdown."""
    import atexit

    import torch.distributed as dist

    from wavefront.workbench.distributed import launch

    launch.import_world_defaults()  # before init: see launch.WORLD_DEFAULT_MODULES
    dist.init_process_group("gloo")
    rank, ok = dist.get_rank(), False
    try:
        yield rank, dist.get_world_size()
        ok = True
    finally:
        left = launch.destroy_process_group(barrier=ok)
        atexit.register(_record_teardown, out, rank, left)


def _record_teardown(out: str, rank: int, after_destroy: list[str]) -> None:
    """atexit: garbage the worker's own frames left in cycles is collected while Python is alive (not in its
    final collection), then what still runs is recorded."""
    import gc

    from wavefront.workbench.distributed import launch

    gc.collect()
    teardown_path(out, rank).write_text(json.dumps({"rank": rank, "c10d_threads_after_destroy": after_destroy,
                                                    "c10d_threads_at_exit": launch.c10d_threads()}))


def teardown_path(out: str | Path, rank: int) -> Path:
    return Path(out).with_name(f"teardown.{rank}.json")


def report(results: list, path: str) -> None:
    """Worker side, the last step inside `process_group`: every rank's checks to rank 0, written as the JSON
    `run_worker` reads."""
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump({"world": dist.get_world_size(), "ranks": gathered}, f)


def teardowns(out: Path, world: int) -> list[dict]:
    """Every rank's teardown record (`process_group`); a rank that wrote none is reported as such."""
    docs = []
    for rank in range(world):
        path = teardown_path(out, rank)
        docs.append(json.loads(path.read_text()) if path.is_file() else {"rank": rank, "missing": str(path)})
    return docs


def run_worker(script: str, tmp: Path, world: int, *args: str, timeout: int = 600) -> dict:
    """torchrun `script` on `world` processes; rank 0's result, with every rank's checks under "ranks"."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    out_file = tmp / "result.json"
    # --standalone: a free rendezvous port, so parallel test workers never collide.
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={world}", str(HERE / script), str(out_file), *args],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    doc = json.loads(out_file.read_text())
    assert doc["world"] == world and len(doc["ranks"]) == world
    # Every rank tore its groups down: no backend thread left for interpreter shutdown (where a gloo thread still
    # dropping a finished collective's tensors used to abort a rank with "terminate called without an active
    # exception" after all its checks passed).
    done = teardowns(out_file, world)
    assert all(d.get("c10d_threads_at_exit") == [] for d in done), done
    return doc


def run_worker_once(script: str, tmp_path_factory, world: int, *args: str) -> dict:
    """run_worker once per pytest session, also when pytest-xdist spreads a module's tests over several
    workers (each would otherwise start its own module fixture): the first worker runs it under a file lock
    in the session's shared temporary folder, the others read its result."""
    stem = f"{Path(script).stem}-{world}"
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return run_worker(script, tmp_path_factory.mktemp(stem), world, *args)
    done = tmp_path_factory.getbasetemp().parent / f"{stem}.json"  # the session's folder, above each worker's
    with FileLock(str(done) + ".lock"):
        if done.is_file():
            return json.loads(done.read_text())
        doc = run_worker(script, tmp_path_factory.mktemp(stem), world, *args)
        done.write_text(json.dumps(doc))
        return doc


def by_name(doc: dict) -> dict:
    """{check name: {rank: result}}."""
    out: dict = {}
    for rank, results in enumerate(doc["ranks"]):
        for r in results:
            out.setdefault(r["name"], {})[rank] = r
    return out
