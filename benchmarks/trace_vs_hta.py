"""`wavefront trace analyze` against Holistic Trace Analysis (HTA 0.5.0) on the same synthetic multi-rank
Kineto traces, in one run, each measured as a whole process tree.

    PYTHONPATH=src python benchmarks/trace_vs_hta.py                       # 2 ranks x 200 MB and 2 x 1 GB
    PYTHONPATH=src python benchmarks/trace_vs_hta.py --sizes-mb 20         # quick
    PYTHONPATH=src python benchmarks/trace_vs_hta.py --hta-sizes-mb 200    # HTA only where it fits in memory
    PYTHONPATH=src python benchmarks/trace_vs_hta.py --hta-sizes-mb '' --repeat 3 \
        --hta-from benchmarks/results/trace-vs-hta_cpu_20261202.json       # HTA's earlier run of the same files

For each size it writes one trace per rank (``trace.testing.write_large_trace``: Kineto's layout, ns
timestamps, NCCL all-reduce overlapping compute, launches, memcpy; 2 ranks by default) into one
directory, then runs, each in its own process tree:

- ours: the CLI, ``python -m wavefront.cli.trace analyze DIR --json OUT`` (every analysis: breakdown,
  kernel tables, roofline, launch statistics, multi-rank), torch never imported, ranks in parallel;
- HTA: ``TraceAnalysis(trace_dir=DIR)`` (parses every rank) + ``get_temporal_breakdown`` +
  ``get_comm_comp_overlap``, with its default JSON parser.

Per run: wall seconds, CPU seconds (user + sys) of the whole process tree (``RUSAGE_CHILDREN`` around
the run: every worker process is counted once it is reaped), and the peak resident memory of the tree,
sampled every 0.1 s (a run above ``--mem-cap-gb`` is killed and recorded as such). Agreement compares
HTA's numbers with ``--hta-compatible``'s on each rank. These are CPU timings of CPU software on a
shared machine; the load average around each run is recorded beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HTA = """
import json, sys
from hta.common.trace_parser import set_default_trace_parsing_backend
from hta.configs.parser_config import ParserBackend
set_default_trace_parsing_backend(ParserBackend(sys.argv[2]))
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
tb = ta.get_temporal_breakdown(visualize=False).set_index("rank")
ov = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
out = {int(r): {"kernel_time_us": float(tb.loc[r, "kernel_time(us)"]),
                "idle_time_us": float(tb.loc[r, "idle_time(us)"]),
                "compute_time_us": float(tb.loc[r, "compute_time(us)"]),
                "non_compute_time_us": float(tb.loc[r, "non_compute_time(us)"]),
                "comp_comm_overlap_pctg": float(ov.loc[r, "comp_comm_overlap_pctg"])} for r in tb.index}
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
    """Run `cmd`; wall time, CPU time and peak RSS of its process tree, the RESULT line, how it ended."""
    load_before = os.getloadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
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
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = next((json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")), None)
    return {"process_wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak / 2**20, "exit_code": proc.returncode,
            "killed": status["killed"], "result": result, "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "stderr_tail": None if result else err[-2000:]}


def agreement(ours: dict, hta: dict) -> dict:
    """Per rank, HTA's figures against ours under HTA's definitions (--hta-compatible)."""
    out = {}
    for rank in ours["ranks"]:
        mine, theirs = rank["hta_equivalent"], hta.get(str(rank["rank"]))
        if not mine or not theirs:
            continue
        keys = ("kernel_time_us", "idle_time_us", "compute_time_us", "non_compute_time_us")
        row = {k: {"ours": mine[k], "hta": theirs[k], "abs_diff": abs(mine[k] - theirs[k])} for k in keys}
        pct = round(mine["comp_comm_overlap_pctg"], 2)
        row["comp_comm_overlap_pctg"] = {"ours": pct, "hta": theirs["comp_comm_overlap_pctg"],
                                         "abs_diff": abs(pct - theirs["comp_comm_overlap_pctg"])}
        out[str(rank["rank"])] = row
    return out


def _write_ranks(d: Path, size: int, n_ranks: int) -> list[Path]:
    """One trace per rank, written in parallel processes (each file about ``size`` MiB)."""
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / f"rank{r}.json" for r in range(n_ranks)]
    todo = [r for r, p in enumerate(paths) if not p.exists() or p.stat().st_size < size * 2**20 * 0.99]
    procs = []
    for r in todo:
        print(f"[{size} MiB] writing {paths[r]}", flush=True)
        code = (f"from wavefront.workbench.trace.testing import write_large_trace as w; import os; "
                f"w({str(paths[r]) + '.part'!r}, {size * 2**20}, seed={size + r}, rank={r}, world_size={n_ranks}); "
                f"os.replace({str(paths[r]) + '.part'!r}, {str(paths[r])!r})")
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT / "src"))))
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("writing the traces failed")
    return paths


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("numpy", "msgspec", "holistictraceanalysis", "pandas", "ijson"):
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


def _ours(d: Path, env: dict, cap: int, timeout_s: float) -> dict:
    out = d / "ours.json"
    cmd = [sys.executable, "-m", "wavefront.cli.trace", "analyze", str(d), "--hta-compatible", "--json", str(out)]
    run = run_measured(cmd, env, cap, timeout_s)
    if out.exists() and run["exit_code"] == 0:
        doc = json.loads(out.read_text())
        run["result"] = {"n_ranks": len(doc["ranks"]), "n_events": [r["n_events"] for r in doc["ranks"]],
                         "n_steps": [len(r["steps"]) for r in doc["ranks"]],
                         "sums_exact": all(abs(sum(s[f"{c}_us"] for c in ("compute", "comm_overlapped", "comm_exposed",
                                                                         "memory", "idle_host_bound", "idle_other"))
                                               - s["dur_us"]) < 1e-6 for r in doc["ranks"] for s in r["steps"]),
                         "analysis_wall_s": doc["analysis_wall_s"], "doc": doc}
    return run


def _quote_hta(run: dict, earlier_path: Path) -> None:
    """HTA's figures for the same files from an earlier results file, when its files had the same sizes."""
    earlier = json.loads(earlier_path.read_text())
    for old in earlier["runs"]:
        if old.get("hta") and old["size_mib_per_rank"] == run["size_mib_per_rank"] \
                and old["file_bytes"] == run["file_bytes"]:
            run["hta_earlier_run"] = {"from": str(earlier_path.relative_to(ROOT) if earlier_path.is_absolute()
                                                  and ROOT in earlier_path.parents else earlier_path),
                                      "date": earlier["date"], "git_sha": earlier["git_sha"],
                                      "versions": earlier["versions"], **{k: old["hta"][k] for k in
                                                                          ("process_wall_s", "cpu_s", "peak_rss_mb",
                                                                           "loadavg_before", "loadavg_after")}}
            if run["ours"].get("cpu_s"):
                run["cpu_ratio_hta_earlier_over_ours"] = old["hta"]["cpu_s"] / run["ours"]["cpu_s"]
            return


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", default="200,1024", help="comma-separated trace sizes per rank in MiB")
    ap.add_argument("--hta-sizes-mb", default="200", help="the sizes HTA runs on ('' for none)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of ours per size (on a shared machine CPU seconds vary with the load): each is "
                         "recorded, the median CPU run is the headline")
    ap.add_argument("--workdir", default=None, help="where the traces are written (default: a temp dir)")
    ap.add_argument("--mem-cap-gb", type=float, default=4.0, help="kill a run whose memory passes this")
    ap.add_argument("--timeout-s", type=float, default=1500.0, help="kill a run that takes longer")
    ap.add_argument("--hta-from", default=None,
                    help="an earlier results file: its HTA run of a size is quoted (marked so) where HTA is not run "
                         "now; the generator is deterministic, so same size and seeds give the same files")
    ap.add_argument("--out", default=None, help="result JSON (default benchmarks/results/trace-vs-hta_cpu_<date>)")
    args = ap.parse_args()

    sizes = [int(s) for s in args.sizes_mb.split(",")]
    hta_sizes = {int(s) for s in args.hta_sizes_mb.split(",") if s}
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="wf-trace-bench-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cap = int(args.mem_cap_gb * 2**30)
    today = dt.date.today().strftime("%Y%m%d")
    out_path = Path(args.out or ROOT / "benchmarks" / "results" / f"trace-vs-hta_cpu_{today}.json")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    doc = {"schema": "wavefront.bench.trace-vs-hta/2", "date": dt.datetime.now().isoformat(timespec="seconds"),
           "git_sha": sha, "machine": _machine(), "versions": _versions(), "mem_cap_gb": args.mem_cap_gb,
           "label": "CPU measurement of CPU software (trace analysis); no GPU is involved", "runs": []}
    for size in sizes:
        d = workdir / f"s{size}x{args.ranks}"
        paths = _write_ranks(d, size, args.ranks)
        run: dict = {"size_mib_per_rank": size, "n_ranks": args.ranks, "file_bytes": [p.stat().st_size for p in paths]}
        print(f"[{size} MiB x {args.ranks}] ours", flush=True)
        repeats = [_ours(d, env, cap, args.timeout_s) for _ in range(max(1, args.repeat))]
        run["ours"] = sorted(repeats, key=lambda r: r["cpu_s"])[(len(repeats) - 1) // 2]  # the (lower) median
        if len(repeats) > 1:
            run["ours_repeats"] = [{k: r[k] for k in ("process_wall_s", "cpu_s", "peak_rss_mb", "exit_code",
                                                      "loadavg_before", "loadavg_after")} for r in repeats]
        if size in hta_sizes:
            print(f"[{size} MiB x {args.ranks}] hta", flush=True)
            run["hta"] = run_measured([sys.executable, "-c", HTA, str(d), "json"], env, cap, args.timeout_s)
            ours_res, hta_res = run["ours"]["result"], run["hta"]["result"]
            if ours_res and hta_res:
                run["agreement"] = agreement(ours_res["doc"], hta_res)
                run["cpu_ratio_hta_over_ours"] = run["hta"]["cpu_s"] / run["ours"]["cpu_s"]
                run["wall_ratio_hta_over_ours"] = run["hta"]["process_wall_s"] / run["ours"]["process_wall_s"]
        elif args.hta_from:
            _quote_hta(run, Path(args.hta_from))
        if run["ours"].get("result"):
            run["ours"]["result"].pop("doc")
        doc["runs"].append(run)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(doc, indent=2) + "\n")  # partial results survive a later failure
        summary = {k: (round(v["process_wall_s"], 1), round(v["cpu_s"], 1), round(v["peak_rss_mb"]), v["killed"])
                   for k, v in run.items() if k in ("ours", "hta") and isinstance(v, dict)}
        print(f"[{size} MiB x {args.ranks}] (wall s, cpu s, peak MiB, killed): {summary}", flush=True)
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
