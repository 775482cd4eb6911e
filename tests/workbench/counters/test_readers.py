"""The counter readers on fixtures written from the vendors' documented formats (docs/counters.md says which
versions; none comes from a real run yet): values in base units, content detection, and every bad input."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from wavefront.workbench.counters.load import load
from wavefront.workbench.counters.model import CountersLoadError, short_name

DATA = Path(__file__).resolve().parents[2] / "data" / "counters"
NCU_A = DATA / "ncu_raw_h100_a.csv"
V3 = DATA / "rocprofv3_counter_collection_mi300x.csv"
PERF = DATA / "pmc_perf_mi300x.csv"


def test_ncu_raw_csv_in_base_units():
    p = load(NCU_A)
    assert p.tool == "ncu" and p.device == "NVIDIA H100 80GB HBM3" and len(p.launches) == 7
    fwd, bwd, attn = p.launches[0], p.launches[5], p.launches[6]
    assert (fwd.kernel, fwd.grid, fwd.n_blocks, fwd.threads_per_block) == ("_norm_fwd_kernel", (32768, 1, 1), 32768,
                                                                           256)
    assert fwd.duration_ns == pytest.approx(181.3e3)  # usecond
    assert fwd.dram_bytes == pytest.approx((268.48 + 268.44) * 1e6)  # Mbyte is decimal
    assert fwd.l2_bytes == pytest.approx(537.14e6) and fwd.l1_bytes == pytest.approx(805.31e6)
    assert fwd.shared_bytes == 1060  # 1.06 Kbyte/block dynamic + 0 byte/block static
    assert fwd.registers == 34 and fwd.achieved_occupancy == pytest.approx(0.713)
    assert fwd.vector_flops == 2 * 134_217_728 + 268_435_456  # 2 x ffma + fmul, thousands separators dropped
    assert fwd.tensor_flops == 0
    assert list(fwd.stalls) == ["long_scoreboard", "wait", "barrier", "math_pipe_throttle"]
    assert fwd.stall_unit == "cycles per issued instruction"
    assert bwd.vector_flops == 2 * 402_653_184 + 134_217_728 + 268_435_456
    assert attn.tensor_flops == 2_147_483_648 * 512  # ncu's tensor roofline factor
    assert attn.flops == attn.tensor_flops + 268_435_456


def test_ncu_units_row_is_respected(tmp_path):
    text = NCU_A.read_text().replace('"usecond"', '"msecond"', 1).replace('"Mbyte","Mbyte"', '"Gbyte","Mbyte"', 1)
    f = tmp_path / "units.csv"
    f.write_text(text)
    la = load(f).launches[0]
    assert la.duration_ns == pytest.approx(181.3e6)
    assert la.dram_bytes == pytest.approx(268.48e9 + 268.44e6)


def test_ncu_not_measured_is_none_never_zero(tmp_path):
    lines = NCU_A.read_text().splitlines()
    header = lines[1].split(",")
    col = header.index('"lts__t_bytes.sum"')
    rows = [ln.split('","') for ln in lines[3:-1]]
    for r in rows:
        r[col] = "n/a"
    f = tmp_path / "na.csv"
    f.write_text("\n".join(lines[1:3] + ['","'.join(r) for r in rows]) + "\n")
    p = load(f)
    assert all(la.l2_bytes is None for la in p.launches)
    assert any(n.startswith("L2 bytes: not measured") for n in p.notes)


def test_rocprofv3_counter_collection():
    p = load(V3)
    assert p.tool == "rocprofv3" and p.device is None and [la.launch_id for la in p.launches] == [1, 2]
    la = p.launches[0]
    assert la.kernel == "_norm_fwd_kernel" and la.n_blocks == 32768 and la.threads_per_block == 256
    assert la.duration_ns == 121480 and la.registers == 40 and la.shared_bytes == 16
    assert la.dram_bytes == 64 * 4195000 + 64 * 4194304  # 64-byte reads, 64-byte writes
    assert la.l2_bytes == 64 * (8390000 + 4194304) and la.l1_bytes == 64 * 12584000
    assert la.vector_flops == 64 * (2 * 2097152 + 4194304) and la.tensor_flops is None
    assert la.metrics["mean_waves_per_cu_x_cus"] == pytest.approx(1838592000 / 252000)
    assert any(n.startswith("tensor/MFMA FLOPs: not measured") for n in p.notes)


def test_rocprof_compute_pmc_perf():
    p = load(PERF)
    assert p.tool == "rocprof-compute" and len(p.launches) == 2
    attn = p.launches[1]
    assert attn.tensor_flops == 512 * 2147483648
    assert attn.lds_bytes == 128 * (134217728 - 4194304)
    assert attn.registers == 256  # arch VGPRs + AGPRs
    assert attn.n_blocks == 32 * 128 and attn.duration_ns == 1216000
    assert p.launches[0].dram_bytes == load(V3).launches[0].dram_bytes  # one formula for both AMD readers


def test_the_content_decides_not_the_name(tmp_path):
    f = tmp_path / "profile.json"
    f.write_bytes(NCU_A.read_bytes())
    assert load(f).tool == "ncu"


def test_demangled_names():
    assert short_name("void at::native::vectorized_elementwise_kernel<4, Foo<float>>(int, Foo<float>)") == \
        "vectorized_elementwise_kernel"
    assert short_name("_norm_bwd_kernel#2") == "_norm_bwd_kernel"
    assert short_name("_attn_fwd_kernel") == "_attn_fwd_kernel"
    assert short_name("_norm_fwd_kernel.kd") == "_norm_fwd_kernel"


def test_ncu_launch_columns_added_by_another_version_are_not_metrics(tmp_path):
    text = NCU_A.read_text().replace('"Device","CC",', '"Device","CC","Function Attributes",')
    lines = text.splitlines()
    lines[2] = lines[2].replace('"","",', '"","","",', 1)  # its units cell
    lines[3:-1] = [ln.replace('"0","9.0",', '"0","9.0","cache-config",', 1) for ln in lines[3:-1]]
    f = tmp_path / "more.csv"
    f.write_text("\n".join(lines) + "\n")
    assert load(f).launches[0].dram_bytes == load(NCU_A).launches[0].dram_bytes


def _write(tmp_path, text: str | bytes, name: str = "p.csv") -> Path:
    f = tmp_path / name
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    return f


BAD = {
    "empty": ("", "empty file"),
    "json": ('{"schema": "wavefront.trace.analyze/2"}', "a JSON document"),
    "foreign csv": ("a,b,c\n1,2,3\n", "unrecognised columns (a, b, c)"),
    "ncu header only": (NCU_A.read_text().splitlines()[1] + "\n", "no kernel rows"),
    "ncu without duration": (NCU_A.read_text().replace("gpu__time_duration.sum", "gpu__time_other.sum"),
                             "without the gpu__time_duration.sum column"),
    "ncu truncated": ("\n".join(NCU_A.read_text().splitlines()[:4])[:-40] + "\n", "a truncated file?"),
    "ncu no units row": ("\n".join(NCU_A.read_text().splitlines()[1:2] + NCU_A.read_text().splitlines()[3:5]),
                         "not ncu's units row"),
    "ncu foreign unit": (NCU_A.read_text().replace('"Mbyte","Mbyte"', '"furlong","Mbyte"', 1),
                         "dram__bytes_read.sum in unit 'furlong'"),
    "ncu not a number": (NCU_A.read_text().replace('"181.30"', '"fast"'), "expected a number, got 'fast'"),
    "rocprofv3 truncated": (V3.read_text()[: len(V3.read_text()) // 2].rsplit(",", 3)[0] + "\n", "truncated"),
    "rocprofv3 reversed time": (V3.read_text().replace("1733390000001121480", "1733389999999000000"),
                                "missing or reversed"),
    "pmc_perf header only": (PERF.read_text().splitlines()[0] + "\n", "no dispatch rows"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_the_file_and_what_was_expected(tmp_path, case):
    text, expected = BAD[case]
    f = _write(tmp_path, text)
    with pytest.raises(CountersLoadError) as err:
        load(f)
    assert str(f) in str(err.value) and expected in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(CountersLoadError, match="cannot read"):
        load(tmp_path / "absent.csv")


def test_binary_report_without_ncu_report_says_how_to_export(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ncu_report", None)  # not importable
    f = _write(tmp_path, b"\x00\x01NVIDIA\x00binary", "k.ncu-rep")
    with pytest.raises(CountersLoadError) as err:
        load(f)
    assert "ncu_report" in str(err.value) and f"ncu --import {f} --csv --page raw" in str(err.value)


class _Metric:
    def __init__(self, value, unit):
        self.value, self.u = value, unit

    def as_double(self):
        if isinstance(self.value, str):
            raise ValueError("string metric")
        return self.value

    def unit(self):
        return self.u


def _fake_ncu_report(metrics: dict) -> types.ModuleType:
    """A stand-in with the shape of NVIDIA's ncu_report API (load_report -> ranges -> actions -> metrics): it
    checks our walk over that API, not the real module, which ships only with Nsight Compute."""
    action = types.SimpleNamespace(name=lambda: "_norm_fwd_kernel", metric_names=lambda: list(metrics),
                                   metric_by_name=lambda n: _Metric(*metrics[n]))
    rng = types.SimpleNamespace(num_actions=lambda: 1, action_by_idx=lambda i: action)
    ctx = types.SimpleNamespace(num_ranges=lambda: 1, range_by_idx=lambda i: rng)
    return types.SimpleNamespace(load_report=lambda path: ctx)  # type: ignore[return-value]


def test_binary_report_through_ncu_report(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ncu_report", _fake_ncu_report({
        "gpu__time_duration.sum": (181.3, "usecond"), "dram__bytes.sum": (536.92, "Mbyte"),
        "launch__grid_size": (32768, ""), "launch__block_size": (256, ""), "device__attribute_display_name":
        ("NVIDIA H100", "")}))
    p = load(_write(tmp_path, b"\x00binary", "k.ncu-rep"))
    la = p.launches[0]
    assert la.duration_ns == pytest.approx(181300) and la.dram_bytes == pytest.approx(536.92e6)
    assert la.n_blocks == 32768 and la.threads_per_block == 256


def test_binary_report_without_duration(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ncu_report", _fake_ncu_report({"dram__bytes.sum": (1.0, "byte")}))
    with pytest.raises(CountersLoadError, match="has no gpu__time_duration.sum"):
        load(_write(tmp_path, b"\x00binary", "k.ncu-rep"))
