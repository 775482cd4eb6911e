"""The per-family table type: default row, rows only where a measurement differs, reasons kept."""

from __future__ import annotations

import dataclasses

import pytest

from wavefront.kernels import (
    adamw,
    glu,
    grouped_config,
    linear_fp8,
    matmul_config,
    moe_permute,
    moe_router,
    quantize,
    rope,
    row_config,
)
from wavefront.kernels._tables import FAMILIES, Differs, FamilyTable, SingleStage
from wavefront.runtime import ARCHS


@dataclasses.dataclass(frozen=True)
class _Row:
    warps: int
    block: int = 1024


def test_families_are_every_arch_family():
    assert set(FAMILIES) == {a.family for a in ARCHS.values()}
    assert "cpu" in FAMILIES and len(FAMILIES) == len(set(FAMILIES))


def test_default_and_differing_rows_resolve():
    t = FamilyTable(_Row(8), "default reason", {"amd-cdna": Differs("wave64 measured", warps=4)})
    assert set(t) == set(FAMILIES)
    assert t["amd-cdna"] == _Row(4, 1024)
    assert all(t[f] == _Row(8) for f in FAMILIES if f != "amd-cdna")
    assert t.reason("amd-cdna") == "wave64 measured" and t.reason("nvidia") == "default reason"
    assert t.differs() == {"amd-cdna": "wave64 measured"}
    with pytest.raises(KeyError):
        t.reason("tpu")


def test_whole_row_for_non_dataclass_values():
    t = FamilyTable((1, 2), "tuple rows", {"cpu": Differs("interpreter", row=(3,))})
    assert t["cpu"] == (3,) and t["nvidia"] == (1, 2)
    with pytest.raises(TypeError, match="dataclass"):
        FamilyTable((1, 2), "tuple rows", {"cpu": Differs("interpreter", warps=1)})


@pytest.mark.parametrize("rows, match", [
    ({"amd-cdna": Differs("same value", warps=8)}, "equal the default"),
    ({"tpu": Differs("no such family", warps=4)}, "unknown families"),
])
def test_rows_that_say_nothing_are_rejected(rows, match):
    with pytest.raises(ValueError, match=match):
        FamilyTable(_Row(8), "default", rows)


def test_differs_needs_a_reason_and_one_kind_of_change():
    with pytest.raises(ValueError, match="reason"):
        Differs("  ", warps=4)
    with pytest.raises(ValueError, match="either"):
        Differs("why")
    with pytest.raises(ValueError, match="either"):
        Differs("why", row=_Row(1), warps=4)
    with pytest.raises(ValueError, match="reason"):
        FamilyTable(_Row(8), "")


def test_table_is_a_plain_mapping_for_launchers_and_tests():
    t = FamilyTable(_Row(8), "default")
    t["test"] = _Row(2)  # tests add a family for one check and remove it
    assert t["test"] == _Row(2) and t.reason("test") == "default"
    del t["test"]
    assert "test" not in t


def test_a_tile_entry_carries_the_reason_of_its_row():
    @dataclasses.dataclass(frozen=True)
    class Tile:
        warps: int
        reason: str

    t = FamilyTable(Tile(8, "default measured"), "default measured",
                    {"amd-cdna": Differs("wave64 measured", warps=4), "cpu": Differs("interpreter", row=Tile(1, ""))})
    assert t["amd-cdna"] == Tile(4, "wave64 measured") and t["cpu"] == Tile(1, "interpreter")
    with pytest.raises(ValueError, match="equal the default"):  # a new reason alone is no row of its own
        FamilyTable(Tile(8, "default"), "default", {"cpu": Differs("the same tile", row=Tile(8, "other"))})


def test_single_stage_options():
    @dataclasses.dataclass(frozen=True)
    class Cfg(SingleStage):
        BLOCK: int
        num_warps: int

    assert Cfg(BLOCK=64, num_warps=4).options() == {"num_warps": 4, "num_stages": 1}


@pytest.mark.parametrize("table", [row_config.ROW_TABLES, adamw.ADAMW_BLOCK, quantize.QUANTIZE_TABLES,
                                   moe_permute.PERMUTE_TABLES, rope.ROPE_TABLES, glu.GLU_TABLES,
                                   moe_router.ROUTER_TABLES, linear_fp8.FP8_GEMM_TABLES, linear_fp8.FP8_TMA_CONFIGS,
                                   *matmul_config.GEMM_TABLES.values(), *grouped_config.POINTER_TABLES.values(),
                                   *matmul_config.TMA_TABLES.values(), matmul_config.TMA_MIN_M,
                                   *grouped_config.TMA_TABLES.values()])
def test_kernel_tables_cover_every_family_and_say_why(table):
    assert isinstance(table, FamilyTable)
    families = matmul_config.TMA_FAMILIES if "hopper" in table else FAMILIES
    assert set(families) <= set(table)
    for family in families:
        assert table.reason(family).strip()
    # A family's own row differs from the default (FamilyTable enforces it at import; this pins the data).
    assert all(table[f] != table.default for f in table.differs())
