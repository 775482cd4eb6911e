"""`wavefront trace` against Holistic Trace Analysis (HTA) on the same synthetic Kineto traces, in one run.

    PYTHONPATH=src python benchmarks/trace_vs_hta.py                 # 20 MB, 200 MB, 1 GB
    PYTHONPATH=src python benchmarks/trace_vs_hta.py --sizes-mb 20   # quick

For each size it writes one rank's trace (synth.write_large_trace: Kineto's indented layout, ns
timestamps, NCCL all-reduce overlapping compute, launches, memcpy) and, in separate processes so that
nothing is shared:

- ours: ``load_trace`` + ``analyze_trace`` (every analysis: breakdown, kernel table, roofline, launch
  stats) + ``compat.hta_equivalent`` (HTA's definitions on our classification);
- HTA 0.5.0: ``TraceAnalysis`` (parse) + ``get_temporal_breakdown`` + ``get_comm_comp_overlap``, with its
  default JSON parser and with ``IJSON_BATCH_AND_COMPRESS``, its documented choice for big traces.

Each process is timed (wall and CPU seconds) and its peak memory is the largest resident set size of
its process tree, sampled every 0.1 s (a process that passes ``--mem-cap-gb`` is killed and recorded
as such). Agreement compares HTA's numbers with ours under HTA's definitions and rounding. These are
CPU timings of CPU software on this machine; the load average at each run is recorded beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OURS = """
import json, resource, sys, time
t0, c0 = time.perf_counter(), time.process_time()
from wavefront.workbench.trace import load_trace, analyze_trace
from wavefront.workbench.trace.compat import hta_equivalent
trace = load_trace(sys.argv[1])
t1 = time.perf_counter()
analysis = analyze_trace(trace)
t2 = time.perf_counter()
out = {"load_s": t1 - t0, "analyze_s": t2 - t1, "wall_s": t2 - t0, "cpu_s": time.process_time() - c0,
       "n_events": trace.n_events, "n_steps": len(analysis.steps),
       "hta_rounded": hta_equivalent(trace), "ns": hta_equivalent(trace, hta_rounding=False),
       "breakdown_us": analysis.totals(),
       "sums_exact": all(s.total_ns() == s.dur_ns for s in analysis.steps),
       "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
print("RESULT " + json.dumps(out))
"""

HTA = """
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
from hta.common.trace_parser import set_default_trace_parsing_backend
from hta.configs.parser_config import ParserBackend
set_default_trace_parsing_backend(ParserBackend(sys.argv[2]))
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
t1 = time.perf_counter()
tb = ta.get_temporal_breakdown(visualize=False).set_index("rank")
ov = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
t2 = time.perf_counter()
r = tb.index[0]
out = {"load_s": t1 - t0, "analyze_s": t2 - t1, "wall_s": t2 - t0, "cpu_s": time.process_time() - c0,
       "kernel_time_us": float(tb.loc[r, "kernel_time(us)"]), "idle_time_us": float(tb.loc[r, "idle_time(us)"]),
       "compute_time_us": float(tb.loc[r, "compute_time(us)"]),
       "non_compute_time_us": float(tb.loc[r, "non_compute_time(us)"]),
       "comp_comm_overlap_pctg": float(ov.loc[r, "comp_comm_overlap_pctg"])}
print("RESULT " + json.dumps(out))
"""


def _tree_rss_bytes(pid: int) -> int:
    """Resident set size of a process and all its descendants (Linux /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run_measured(cmd: list[str], env: dict, cap_bytes: int, timeout_s: float) -> dict:
    """Run `cmd`; wall time, peak tree RSS (sampled), the RESULT line, and how it ended."""
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    peak = 0
    status = {"killed": None}

    def watch() -> None:
        nonlocal peak
        while proc.poll() is None:
            rss = _tree_rss_bytes(proc.pid)
            peak = max(peak, rss)
            if rss > cap_bytes:
                status["killed"] = f"memory above {cap_bytes / 2**30:.1f} GiB"
                os.killpg(proc.pid, 9)
                return
            if time.perf_counter() - t0 > timeout_s:
                status["killed"] = f"over {timeout_s:.0f} s"
                os.killpg(proc.pid, 9)
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    watcher.join()
    wall = time.perf_counter() - t0
    result = next((json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")), None)
    return {"process_wall_s": wall, "peak_rss_mb": peak / 2**20, "exit_code": proc.returncode,
            "killed": status["killed"], "result": result, "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "stderr_tail": None if result else err[-2000:]}


def agreement(ours: dict, hta: dict) -> dict:
    keys = ("kernel_time_us", "idle_time_us", "compute_time_us", "non_compute_time_us")
    out = {k: {"ours": ours[k], "hta": hta[k], "abs_diff": abs(ours[k] - hta[k])} for k in keys}
    out["comp_comm_overlap_pctg"] = {"ours": round(ours["comp_comm_overlap_pctg"], 2),
                                     "hta": hta["comp_comm_overlap_pctg"],
                                     "abs_diff": abs(round(ours["comp_comm_overlap_pctg"], 2)
                                                     - hta["comp_comm_overlap_pctg"])}
    return out


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("numpy", "torch", "holistictraceanalysis", "pandas", "ijson"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal"))
    return {"cpu": cpu, "n_cpus": os.cpu_count(), "mem_gib": round(mem / 2**20, 1), "os": platform.platform(),
            "note": "shared development machine: other jobs ran at the same time (see loadavg per run)"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", default="20,200,1024", help="comma-separated trace sizes in MiB")
    ap.add_argument("--workdir", default=None, help="where the traces are written (default: a temp dir)")
    ap.add_argument("--mem-cap-gb", type=float, default=4.0, help="kill a run whose memory passes this")
    ap.add_argument("--timeout-s", type=float, default=1500.0, help="kill a run that takes longer")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--out", default=None, help="result JSON (default benchmarks/results/trace-vs-hta_cpu_<date>)")
    args = ap.parse_args()

    from wavefront.workbench.trace.synth import write_large_trace

    sizes = [int(s) for s in args.sizes_mb.split(",")]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="wf-trace-bench-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cap = int(args.mem_cap_gb * 2**30)
    today = dt.date.today().strftime("%Y%m%d")
    out_path = Path(args.out or ROOT / "benchmarks" / "results" / f"trace-vs-hta_cpu_{today}.json")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    doc = {"schema": "wavefront.bench.trace-vs-hta/1", "date": dt.datetime.now().isoformat(timespec="seconds"),
           "git_sha": sha, "machine": _machine(), "versions": _versions(), "mem_cap_gb": args.mem_cap_gb,
           "label": "CPU measurement of CPU software (trace analysis); no GPU is involved", "runs": []}
    for size in sizes:
        d = workdir / f"s{size}"
        d.mkdir(parents=True, exist_ok=True)
        path = d / "rank0.json"
        if not path.exists() or path.stat().st_size < size * 2**20 * 0.99:
            print(f"[{size} MiB] writing {path}", flush=True)
            write_large_trace(path, size * 2**20, seed=size)
        run = {"size_mib": size, "file_bytes": path.stat().st_size}
        print(f"[{size} MiB] ours", flush=True)
        run["ours"] = run_measured([sys.executable, "-c", OURS, str(path)], env, cap, args.timeout_s)
        if run["ours"]["result"]:  # the child's own high-water mark catches what 0.1 s sampling can miss
            run["ours"]["peak_rss_mb"] = max(run["ours"]["peak_rss_mb"], run["ours"]["result"]["ru_maxrss_mb"])
        if not args.skip_hta:
            for backend in ("json", "ijson_batch_and_compress"):
                print(f"[{size} MiB] hta {backend}", flush=True)
                run[f"hta_{backend}"] = run_measured([sys.executable, "-c", HTA, str(d), backend], env, cap,
                                                     args.timeout_s)
            ours_res = run["ours"]["result"]
            for backend in ("json", "ijson_batch_and_compress"):
                hta_res = run[f"hta_{backend}"]["result"]
                if ours_res and hta_res:
                    run[f"agreement_{backend}"] = agreement(ours_res["hta_rounded"], hta_res)
                    run[f"time_ratio_{backend}"] = run[f"hta_{backend}"]["process_wall_s"] / run["ours"][
                        "process_wall_s"]
        doc["runs"].append(run)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(doc, indent=2) + "\n")  # partial results survive a later failure
        summary = {k: (v.get("process_wall_s"), v.get("peak_rss_mb"), v.get("killed"))
                   for k, v in run.items() if isinstance(v, dict) and "process_wall_s" in v}
        print(f"[{size} MiB] (wall s, peak MiB, killed): {summary}", flush=True)
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
