"""Read compiled kernels: resource usage, global load/store widths, spills, matrix instructions.

Pure text in, dataclasses out; the inputs are what ``triton.compile`` produces (PTX, AMDGCN) and what
NVIDIA's ``cuobjdump`` prints for a cubin (``--dump-resource-usage`` and ``-sass``).

Widths are in bits per thread per instruction: ``LDG.E.128`` / ``ld.global.v4.b32`` /
``global_load_dwordx4`` / ``buffer_load_b128`` are 128-bit (16-byte) vector accesses, the widest a thread
issues on these targets before Blackwell's 256-bit forms. Matrix instructions are counted by opcode:
HMMA/IMMA (mma.sync), HGMMA/QGMMA (wgmma), UTC*MMA (tcgen05) on NVIDIA; v_mfma/v_smfmac (CDNA) and
v_wmma/v_swmmac (RDNA) on AMD.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class MachineCode:
    """What one compiled kernel uses and issues on one target."""

    regs: int  # NVIDIA: registers per thread; AMD: VGPRs per lane (.vgpr_count, AGPRs included on CDNA)
    sgprs: int | None = None  # AMD scalar registers per wave
    agprs: int | None = None  # AMD CDNA accumulation registers
    spill_bytes: int = 0  # NVIDIA stack frame + local memory / AMD scratch, bytes per thread
    spill_count: int = 0  # NVIDIA STL instructions; AMD .vgpr_spill_count + .sgpr_spill_count
    static_shared_bytes: int = 0  # NVIDIA cubin SHARED; AMD .group_segment_fixed_size
    load_widths: dict[int, int] = field(default_factory=dict)  # bits -> instructions (global loads)
    store_widths: dict[int, int] = field(default_factory=dict)  # bits -> instructions (global stores)
    bulk_copies: int = 0  # TMA / bulk tensor copies (no per-thread width)
    atomics: int = 0
    matrix_ops: dict[str, int] = field(default_factory=dict)  # opcode -> count
    n_instructions: int = 0

    @property
    def widest_load_bits(self) -> int:
        return max(self.load_widths, default=0)

    @property
    def widest_store_bits(self) -> int:
        return max(self.store_widths, default=0)

    @property
    def narrowest_load_bits(self) -> int:
        return min(self.load_widths, default=0)

    @property
    def narrowest_store_bits(self) -> int:
        return min(self.store_widths, default=0)

    @property
    def spills(self) -> bool:
        return self.spill_bytes > 0 or self.spill_count > 0

    @property
    def matrix_families(self) -> list[str]:
        """Matrix instruction families present: mma, wgmma, tcgen05, mfma, wmma."""
        return sorted({matrix_family(op) for op in self.matrix_ops})

    def as_dict(self) -> dict:
        d = asdict(self)
        d["load_widths"] = {str(k): v for k, v in sorted(self.load_widths.items())}
        d["store_widths"] = {str(k): v for k, v in sorted(self.store_widths.items())}
        d.update(widest_load_bits=self.widest_load_bits, widest_store_bits=self.widest_store_bits,
                 spills=self.spills, matrix_families=self.matrix_families)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> MachineCode:
        names = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in d.items() if k in names}
        kw["load_widths"] = {int(k): v for k, v in d.get("load_widths", {}).items()}
        kw["store_widths"] = {int(k): v for k, v in d.get("store_widths", {}).items()}
        return cls(**kw)


# ---------------------------------------------------------------------------------------------------
# Matrix instructions.

_NV_MATRIX = re.compile(r"^(?:[HIDBQO]MMA|[HIQBO]GMMA|UTC[A-Z]*MMA)$")
_AMD_MATRIX = re.compile(r"^v_(?:mfma|smfmac|wmma|swmmac)_")


def matrix_family(opcode: str) -> str:
    """The family of a matrix opcode (SASS or AMDGCN): mma, wgmma, tcgen05, mfma or wmma."""
    op = opcode.lower()
    if op.startswith(("v_mfma", "v_smfmac")):
        return "mfma"
    if op.startswith(("v_wmma", "v_swmmac")):
        return "wmma"
    base = opcode.split(".")[0].upper()
    if base.startswith("UTC"):
        return "tcgen05"
    if base.endswith("GMMA"):
        return "wgmma"
    return "mma"


# ---------------------------------------------------------------------------------------------------
# NVIDIA: cuobjdump --dump-resource-usage, SASS, PTX.

_RESOURCE = re.compile(r"Function\s+(\S+):\s*\n\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


@dataclass(frozen=True)
class CubinResources:
    function: str
    regs: int
    stack_bytes: int
    shared_bytes: int
    local_bytes: int


def parse_resource_usage(text: str) -> list[CubinResources]:
    """Every function in ``cuobjdump --dump-resource-usage`` output."""
    found = [CubinResources(m[1], int(m[2]), int(m[3]), int(m[4]), int(m[5])) for m in _RESOURCE.finditer(text)]
    if not found:
        raise ValueError("no 'Function ...: REG:.. STACK:.. SHARED:.. LOCAL:..' entry in the resource usage text")
    return found


_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")
_SASS_WIDTH = {"8": 8, "U8": 8, "S8": 8, "16": 16, "U16": 16, "S16": 16, "32": 32, "64": 64, "128": 128,
               "256": 256}


def _sass_width(opcode: str) -> int:
    for mod in opcode.split(".")[1:]:
        if mod in _SASS_WIDTH:
            return _SASS_WIDTH[mod]
    return 32


def parse_sass(text: str, code: MachineCode | None = None) -> MachineCode:
    """Global load/store widths, local-memory (spill) traffic and matrix instructions from SASS."""
    code = code or MachineCode(regs=0)
    loads, stores, matrix = Counter(code.load_widths), Counter(code.store_widths), Counter(code.matrix_ops)
    n = 0
    for line in text.splitlines():
        m = _SASS_LINE.match(line)
        if not m:
            continue
        n += 1
        opcode = m[1]
        base = opcode.split(".")[0]
        if base in ("LDG", "LDGSTS"):
            loads[_sass_width(opcode)] += 1
        elif base == "STG":
            stores[_sass_width(opcode)] += 1
        elif base in ("UTMALDG", "UTMASTG", "UBLKCP", "UTMAPF"):
            code.bulk_copies += 1
        elif base in ("ATOMG", "RED", "ATOM", "REDG"):
            code.atomics += 1
        elif base == "STL":
            code.spill_count += 1
        elif _NV_MATRIX.match(base):
            matrix[opcode] += 1
    if n == 0:
        raise ValueError("no SASS instructions found (expected cuobjdump -sass output)")
    code.load_widths, code.store_widths, code.matrix_ops = dict(loads), dict(stores), dict(matrix)
    code.n_instructions = n
    return code


_PTX_MEM = re.compile(r"^\s*(?:@!?%p\d+\s+)?(ld|st)\.global((?:\.[\w:]+)*)\s")
_PTX_TYPE_BITS = re.compile(r"^[bsuf](\d+)$")
_PTX_MATRIX = re.compile(r"^\s*(?:@!?%p\d+\s+)?(mma\.sync|wgmma\.mma_async|tcgen05\.mma)\b")


def parse_ptx_widths(text: str) -> tuple[dict[int, int], dict[int, int], dict[str, int]]:
    """(load widths, store widths, matrix instruction counts) from PTX: a cross-check on the SASS."""
    loads: Counter = Counter()
    stores: Counter = Counter()
    matrix: Counter = Counter()
    for line in text.splitlines():
        m = _PTX_MEM.match(line)
        if m:
            vec, bits = 1, 0
            for mod in m[2].split(".")[1:]:
                if mod in ("v2", "v4", "v8"):
                    vec = int(mod[1:])
                elif _PTX_TYPE_BITS.match(mod):
                    bits = int(mod[1:])
            if bits:
                (loads if m[1] == "ld" else stores)[vec * bits] += 1
            continue
        mm = _PTX_MATRIX.match(line)
        if mm:
            matrix[mm[1]] += 1
    return dict(loads), dict(stores), dict(matrix)


def parse_nvidia(resource_text: str, sass_text: str, kernel_name: str | None = None) -> MachineCode:
    """Registers, local memory and static shared memory from the resource usage, the rest from SASS."""
    entries = parse_resource_usage(resource_text)
    entry = next((e for e in entries if e.function == kernel_name), entries[0])
    # ptxas places spilled registers in the stack frame (STACK); LOCAL is other per-thread local memory.
    code = MachineCode(regs=entry.regs, spill_bytes=entry.stack_bytes + entry.local_bytes,
                       static_shared_bytes=entry.shared_bytes)
    return parse_sass(sass_text, code)


# ---------------------------------------------------------------------------------------------------
# AMD: AMDGCN assembly with its code-object metadata.

_AMD_META = {
    "regs": re.compile(r"^\s+\.vgpr_count:\s+(\d+)", re.M),
    "sgprs": re.compile(r"^\s+\.sgpr_count:\s+(\d+)", re.M),
    "agprs": re.compile(r"^\s+\.agpr_count:\s+(\d+)", re.M),
    "vgpr_spills": re.compile(r"^\s+\.vgpr_spill_count:\s+(\d+)", re.M),
    "sgpr_spills": re.compile(r"^\s+\.sgpr_spill_count:\s+(\d+)", re.M),
    "lds": re.compile(r"^\s+\.group_segment_fixed_size:\s+(\d+)", re.M),
    "scratch": re.compile(r"^\s+\.private_segment_fixed_size:\s+(\d+)", re.M),
}
_AMD_INSN = re.compile(r"^\s+([a-z][a-z0-9_]*)\b")
_AMD_MEM = re.compile(r"^(global|buffer|flat)_(load|store|atomic)_(\w+)$")


def amd_access_bits(suffix: str) -> int:
    """Bits moved per lane by a load/store suffix: dwordx4 -> 128, b128 -> 128, ushort/u16/d16 -> 16..."""
    s = suffix.removeprefix("lds_").removeprefix("format_")
    m = re.fullmatch(r"dwordx(\d)", s)
    if m:
        return 32 * int(m[1])
    if s == "dword":
        return 32
    m = re.fullmatch(r"(?:d16_(?:hi_)?)?[bui](\d+)", s)
    if m:
        return int(m[1])
    if "short" in s:
        return 16
    if "byte" in s:
        return 8
    raise ValueError(f"unrecognised AMD memory instruction suffix {suffix!r}")


def parse_amdgcn(text: str) -> MachineCode:
    """Resource usage from the code-object metadata, widths and matrix instructions from the code."""
    meta = {}
    for key, rx in _AMD_META.items():
        m = rx.search(text)
        if m is None and key in ("regs", "sgprs"):
            raise ValueError(f"no .{'vgpr' if key == 'regs' else 'sgpr'}_count in the AMDGCN metadata")
        meta[key] = int(m[1]) if m else 0
    code = MachineCode(regs=meta["regs"], sgprs=meta["sgprs"], agprs=meta["agprs"], spill_bytes=meta["scratch"],
                       spill_count=meta["vgpr_spills"] + meta["sgpr_spills"], static_shared_bytes=meta["lds"])
    loads: Counter = Counter()
    stores: Counter = Counter()
    matrix: Counter = Counter()
    n = 0
    in_code = False
    for line in text.splitlines():
        if line.startswith(".Lfunc_end") or ".end_amdgpu_metadata" in line:
            in_code = False
        elif line.rstrip().endswith(":") and not line.startswith((" ", "\t", ".")):
            in_code = True  # a function label
        if not in_code:
            continue
        m = _AMD_INSN.match(line)
        if not m:
            continue
        insn = m[1]
        n += 1
        mem = _AMD_MEM.match(insn)
        if mem:
            if mem[2] == "atomic":
                code.atomics += 1
            else:
                (loads if mem[2] == "load" else stores)[amd_access_bits(mem[3])] += 1
        elif _AMD_MATRIX.match(insn):
            matrix[insn] += 1
    if n == 0:
        raise ValueError("no AMDGCN instructions found")
    code.load_widths, code.store_widths, code.matrix_ops = dict(loads), dict(stores), dict(matrix)
    code.n_instructions = n
    return code
