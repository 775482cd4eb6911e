"""Record the real jax.profiler traces in jax_cpu/ (run from the repository root, with jax installed for
recording only: ``pip install jax``; jax is not a dependency of wavefront):

    python tests/data/traces/make_jax_traces.py

Two JAX processes on this CPU (``jax.distributed`` with the gloo CPU collectives) train a small MLP
data-parallel under ``jax.pmap``: each step averages the gradients with an XLA all-reduce across the two
processes. Each process profiles 4 steps marked with ``jax.profiler.StepTraceAnnotation`` and writes the
TensorBoard profile plugin's layout, ``<logdir>/plugins/profile/<run>/<host>.trace.json.gz``; the
Chrome-JSON trace of each is kept here as ``jax_cpu/rank<i>/plugins/profile/run/host.trace.json.gz``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent / "jax_cpu"
PORT = 23457

WORKER = """
import sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address="localhost:PORT", num_processes=2, process_id=int(sys.argv[1]))
import jax.numpy as jnp

def loss(w, x, y):
    return jnp.mean((jnp.tanh(x @ w[0]) @ w[1] - y) ** 2)

def step(w, x, y):
    value, grads = jax.value_and_grad(loss)(w, x, y)
    grads = jax.lax.pmean(grads, "data")
    return [p - 0.01 * g for p, g in zip(w, grads)], jax.lax.pmean(value, "data")

train_step = jax.pmap(step, axis_name="data")
key = jax.random.PRNGKey(int(sys.argv[1]))
w = [jax.random.normal(key, (1, 64, 128)), jax.random.normal(key, (1, 128, 8))]
x, y = jax.random.normal(key, (1, 256, 64)), jax.random.normal(key, (1, 256, 8))
w, value = train_step(w, x, y)  # compile outside the profile
value.block_until_ready()
with jax.profiler.trace(sys.argv[2]):
    for i in range(4):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            w, value = train_step(w, x, y)
            value.block_until_ready()
""".replace("PORT", str(PORT))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        logs = [Path(tmp) / f"log{i}" for i in range(2)]
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(i), str(logs[i])]) for i in range(2)]
        if any(p.wait(timeout=600) != 0 for p in procs):
            return 1
        for i, log in enumerate(logs):
            (found,) = log.glob("plugins/profile/*/*.trace.json.gz")
            dest = HERE / f"rank{i}" / "plugins" / "profile" / "run" / "host.trace.json.gz"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(found, dest)
            print(f"wrote {dest} ({dest.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
