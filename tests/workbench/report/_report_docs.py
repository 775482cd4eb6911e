"""Inspect and traffic documents shaped like the tools' --json output (synthetic values, test fixtures)."""

from __future__ import annotations

TARGETS = ["sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx1100"]


def inspect_document() -> dict:
    """An inspect document shaped like `wavefront inspect --json` (synthetic values)."""
    rows = []
    for op, kernel in (("rms_norm", "_norm_fwd_kernel"), ("softmax", "_softmax_kernel"), ("linear", "_gemm_kernel")):
        for mode in ("fwd", "bwd"):
            for case in ("llama3-8b_hidden", "wide_65536"):
                for i, target in enumerate(TARGETS):
                    amd = target.startswith("gfx")
                    rows.append(
                        {
                            "key": f"{op}/{mode}/{case}/{kernel}@{target}",
                            "op": op,
                            "mode": mode,
                            "case": case,
                            "dtype": "bf16",
                            "kernel": kernel,
                            "target": target,
                            "grid": [432],
                            "ok": True,
                            "error": None,
                            "num_warps": 8,
                            "regs": 32 + 8 * i,
                            "spill_bytes": 16 if case == "wide_65536" and target == "gfx1100" else 0,
                            "widest_load_bits": 64 if target == "gfx90a" else 128,
                            "matrix_ops": {"mfma" if amd else "mma": 24} if op == "linear" else {},
                            "matrix_families": (["mfma"] if amd else ["mma"]) if op == "linear" else [],
                            "occupancy": round(1.0 - 0.125 * i, 3),
                            "occupancy_limiter": "registers",
                            "signature": {"x_ptr": "*bf16", "n_cols": "i32"},
                            "load_widths": {"128": 4},
                        }
                    )
    rows[-1] = rows[-1] | {"ok": False, "error": "out of resources", "occupancy": None}
    return {
        "schema": "wavefront.inspect/1",
        "dtype": "bf16",
        "targets": TARGETS,
        "n_rows": len(rows),
        "n_failed": 1,
        "rows": rows,
    }


def traffic_document() -> dict:
    """A traffic document shaped like `wavefront traffic --json` (synthetic values)."""
    rows = []
    for op, ratio, eager in (("rms_norm", 1.49, 8.7), ("softmax", 1.0, 3.0), ("linear", 1.1, 1.6)):
        for mode in ("fwd", "bwd"):
            for case in ("llama3-8b_hidden", "wide_65536"):
                mn = 1_057_024 * (2 if mode == "bwd" else 1)
                rows.append(
                    {
                        "key": f"{op}/{mode}/{case}",
                        "op": op,
                        "mode": mode,
                        "case": case,
                        "dtype": "bf16",
                        "dims": {"n_rows": 64, "n_cols": 4096},
                        "kernels": [{"kernel": f"_{op}_kernel", "grid": [64], "loaded_bytes": mn, "stored_bytes": mn}],
                        "kernel_bytes": int(mn * ratio),
                        "unique_bytes": mn,
                        "host_bytes": 0,
                        "bytes_moved": int(mn * ratio),
                        "min_bytes": mn,
                        "eager_bytes": int(mn * eager),
                        "ratio_min": ratio,
                        "ratio_eager": eager / ratio,
                        "marginal_ratio": ratio,
                        "error": None,
                        "wall_s": 1.0,
                    }
                )
    return {
        "schema": "wavefront.traffic/1",
        "dtype": "bf16",
        "note": "bytes counted by the Triton interpreter on CPU",
        "n_rows": len(rows),
        "n_failed": 0,
        "rows": rows,
    }
