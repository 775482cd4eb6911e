"""Read compiled kernels: resource usage, global load/store widths, spills, matrix instructions, and the
shape of the main loop (TMA, warp specialization, matrix-op wait depth, barriers, LDS access widths).

Pure text in, dataclasses out; the inputs are what ``triton.compile`` produces (PTX, AMDGCN) and what
NVIDIA's ``cuobjdump`` prints for a cubin (``--dump-resource-usage`` and ``-sass``).

Widths are in bits per thread per instruction: ``LDG.E.128`` / ``ld.global.v4.b32`` /
``global_load_dwordx4`` / ``buffer_load_b128`` are 128-bit (16-byte) vector accesses, the widest a thread
issues on these targets before Blackwell's 256-bit forms. Matrix instructions are counted by opcode:
HMMA/IMMA (mma.sync), HGMMA/QGMMA (wgmma), UTC*MMA (tcgen05) on NVIDIA; v_mfma/v_smfmac (CDNA) and
v_wmma/v_swmmac (RDNA) on AMD.

The **main loop** of a kernel is found on the machine code itself (SASS or AMDGCN): every backward branch
(a branch to an instruction at or before it) closes a loop whose body is the instructions from the target
to the branch. Among the loops whose body holds at least one matrix instruction, the innermost ones (no
other such loop inside) are candidates, and the main loop is the candidate with the most matrix
instructions (the first in program order on a tie). On NVIDIA a backward branch whose span holds the
kernel's ``EXIT`` closes no loop: it is the jump back from a slow path ptxas placed after the exit (an
mbarrier wait's retry). A kernel without matrix instructions in a loop has no main loop, and the
per-iteration fields (``mma_wait_depth``, ``loop_barriers``) are None.

**Barriers per row pass** (``row_pass_barriers``, kernels without matrix instructions: the row-wise and
pointwise kernels): the most block-wide barriers one pass over a row meets, read from the same loops: the
barriers in the body of each loop (a column-block loop, or a persistent kernel's row loop; an outer loop's
body counts its inner loops' barriers once) and those in the code outside every loop (a row held in
registers, one row per program); the largest of these counts. A row kernel's reductions are what put
barriers there (a cross-warp reduction: shared-memory exchange behind a barrier; a reused buffer: one more
before it is rewritten).
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
    tma_ops: int = 0  # NVIDIA TMA / bulk copies: UTMALDG, UTMASTG, UTMAREDG, UBLKCP (SASS)
    setmaxnreg: int = 0  # NVIDIA USETMAXREG (PTX setmaxnreg): warp-specialized register reallocation
    mma_wait_depth: int | None = None  # smallest N of WARPGROUP.DEPBAR.LE gsb0, N (wgmma.wait_group N) in the
    #                                    main loop; None when the main loop has no wgmma
    min_mma_n: int | None = None  # smallest N of any matrix instruction (wgmma mMnNkK, mma.sync n8, MFMA/WMMA
    #                               MxNxK); None without matrix instructions or when no shape is readable
    loop_barriers: int | None = None  # block-wide barriers (BAR.SYNC / BAR.RED / s_barrier) per main-loop
    #                                   iteration; None without a main loop
    row_pass_barriers: int | None = None  # block-wide barriers in one pass over a row (module docstring);
    #                                       None for kernels with matrix instructions
    narrow_lds_ops: int = 0  # AMD LDS accesses of 8 or 16 bits (ds_read_u8/i8/u16/i16, ds_write_b8/b16...)
    lds_read_widths: dict[int, int] = field(default_factory=dict)  # AMD: bits per lane -> LDS read instructions
    lds_write_widths: dict[int, int] = field(default_factory=dict)  # AMD: bits per lane -> LDS writes
    mfma_shapes: list[str] = field(default_factory=list)  # AMD matrix instruction shapes "MxNxK", sorted
    # Attention-forward design (NVIDIA; docs/inspect.md says how each is read):
    consumer_warpgroups: int | None = None  # warp-specialized (setmaxnreg): the block's warpgroups less the
    #                                         producer's; None without setmaxnreg
    pingpong: bool | None = None  # the main loop waits on one named barrier and arrives on another; None: no loop
    loop_mask_ops: int | None = None  # -INF selects and the compares feeding them in the main loop; None: no loop
    mma_overlap_depth: int | None = None  # largest wgmma.wait_group N in the main loop; None: no wgmma there

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
        d["lds_read_widths"] = {str(k): v for k, v in sorted(self.lds_read_widths.items())}
        d["lds_write_widths"] = {str(k): v for k, v in sorted(self.lds_write_widths.items())}
        d.update(widest_load_bits=self.widest_load_bits, widest_store_bits=self.widest_store_bits,
                 spills=self.spills, matrix_families=self.matrix_families)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> MachineCode:
        names = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in d.items() if k in names}
        kw["load_widths"] = {int(k): v for k, v in d.get("load_widths", {}).items()}
        kw["store_widths"] = {int(k): v for k, v in d.get("store_widths", {}).items()}
        kw["lds_read_widths"] = {int(k): v for k, v in d.get("lds_read_widths", {}).items()}
        kw["lds_write_widths"] = {int(k): v for k, v in d.get("lds_write_widths", {}).items()}
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


_SHAPE = re.compile(r"(\d+)x(\d+)x(\d+)")
# mma.sync shapes in SASS: HMMA.16816 is m16n8k16, HMMA.1688 m16n8k8, HMMA.884 m8n8k4, IMMA.16832 m16n8k32.
_MMA_SYNC_SHAPE = re.compile(r"^(16|8)(8)(\d+)$")


def matrix_shape(opcode: str) -> tuple[int, int, int] | None:
    """(M, N, K) of a matrix opcode when the opcode names it (HGMMA.64x128x16, HMMA.16816, v_mfma_f32_32x32x8
    ...); None for tcgen05 (UTC*MMA), whose shape lives in a runtime instruction descriptor."""
    m = _SHAPE.search(opcode)
    if m:
        return int(m[1]), int(m[2]), int(m[3])
    for part in opcode.split(".")[1:]:
        mm = _MMA_SYNC_SHAPE.match(part)
        if mm:
            return int(mm[1]), int(mm[2]), int(mm[3])
    return None


@dataclass(frozen=True)
class LoopStats:
    """The main loop (see the module docstring): its extent in instructions, matrix instructions,
    block-wide barriers and smallest matrix-op wait depth."""

    first: int
    last: int
    matrix: int
    barriers: int
    wait_depth: int | None


def main_loop(ops: list[str], targets: list[tuple[int, int]], is_matrix, is_barrier, wait_depth) -> LoopStats | None:
    """ops: opcodes in program order; targets: (branch index, target index) of every branch.
    is_matrix/is_barrier(i) -> bool and wait_depth(i) -> int | None look at instruction i."""
    loops = [(t, b) for b, t in targets if t <= b]
    loops = [(t, b) for t, b in loops if any(is_matrix(i) for i in range(t, b + 1))]
    inner = [(t, b) for t, b in loops if not any((t2, b2) != (t, b) and t <= t2 and b2 <= b for t2, b2 in loops)]
    if not inner:
        return None
    t, b = max(sorted(inner), key=lambda tb: sum(is_matrix(i) for i in range(tb[0], tb[1] + 1)))
    waits = [w for w in (wait_depth(i) for i in range(t, b + 1)) if w is not None]
    return LoopStats(t, b, sum(is_matrix(i) for i in range(t, b + 1)), sum(is_barrier(i) for i in range(t, b + 1)),
                     min(waits) if waits else None)


def row_pass_barriers(n_ops: int, targets: list[tuple[int, int]], is_barrier) -> int:
    """The most barriers in one loop body, or in the code outside every loop (see the module docstring).
    targets: (branch index, target index) of every branch; is_barrier(i) -> bool."""
    loops = [(t, b) for b, t in targets if t <= b]
    in_loop = set().union(*(range(t, b + 1) for t, b in loops)) if loops else set()
    counts = [sum(is_barrier(i) for i in range(t, b + 1)) for t, b in loops]
    counts.append(sum(is_barrier(i) for i in range(n_ops) if i not in in_loop))
    return max(counts)


def _min_n(matrix_ops: dict[str, int]) -> int | None:
    ns = [s[1] for s in (matrix_shape(op) for op in matrix_ops) if s]
    return min(ns) if ns else None


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


_SASS_LINE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)(.*)$")
_SASS_WIDTH = {"8": 8, "U8": 8, "S8": 8, "16": 16, "U16": 16, "S16": 16, "32": 32, "64": 64, "128": 128,
               "256": 256}
_SASS_TMA = ("UTMALDG", "UTMASTG", "UTMAREDG", "UBLKCP")
_SASS_BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")
# WARPGROUP.DEPBAR.LE gsb0, 0x1 is wgmma.wait_group 1: wait until at most 1 wgmma group is in flight.
_SASS_WGMMA_WAIT = re.compile(r"gsb\d+\s*,\s*(0x[0-9a-f]+|\d+)")


def _sass_width(opcode: str) -> int:
    for mod in opcode.split(".")[1:]:
        if mod in _SASS_WIDTH:
            return _SASS_WIDTH[mod]
    return 32


def _sass_is_barrier(opcode: str) -> bool:
    """A block-wide wait: BAR.SYNC (bar.sync / barrier.sync) or BAR.RED; BAR.ARV only arrives."""
    parts = opcode.split(".")
    return parts[0] == "BAR" and len(parts) > 1 and parts[1] in ("SYNC", "RED")


def parse_sass(text: str, code: MachineCode | None = None) -> MachineCode:
    """Global load/store widths, local-memory (spill) traffic, matrix instructions, TMA, setmaxnreg and the
    main loop from SASS."""
    code = code or MachineCode(regs=0)
    loads, stores, matrix = Counter(code.load_widths), Counter(code.store_widths), Counter(code.matrix_ops)
    ops, operands, address = _sass_listing(text)
    for opcode in ops:
        base = opcode.split(".")[0]
        if base in ("LDG", "LDGSTS"):
            loads[_sass_width(opcode)] += 1
        elif base == "STG":
            stores[_sass_width(opcode)] += 1
        elif base in (*_SASS_TMA, "UTMAPF"):
            code.bulk_copies += 1
            code.tma_ops += base in _SASS_TMA
        elif base == "USETMAXREG":
            code.setmaxnreg += 1
        elif base in ("ATOMG", "RED", "ATOM", "REDG"):
            code.atomics += 1
        elif base == "STL":
            code.spill_count += 1
        elif _NV_MATRIX.match(base):
            matrix[opcode] += 1
    if not ops:
        raise ValueError("no SASS instructions found (expected cuobjdump -sass output)")
    code.load_widths, code.store_widths, code.matrix_ops = dict(loads), dict(stores), dict(matrix)
    code.n_instructions = len(ops)
    code.min_mma_n = _min_n(code.matrix_ops)

    loop = _sass_main_loop(ops, operands, address)
    if not code.matrix_ops:
        code.row_pass_barriers = row_pass_barriers(len(ops), _sass_branches(ops, operands, address),
                                                   lambda i: _sass_is_barrier(ops[i]))
    if loop is not None:
        code.loop_barriers = loop.barriers
        has_wgmma = any(ops[i].split(".")[0].endswith("GMMA") for i in range(loop.first, loop.last + 1))
        code.mma_wait_depth = loop.wait_depth if has_wgmma else None
        code.pingpong, code.loop_mask_ops = _sass_pingpong(ops, operands, loop), _sass_mask_ops(ops, operands, loop)
        depths = [int(m[1], 0) for i in range(loop.first, loop.last + 1) if ops[i].startswith("WARPGROUP.DEPBAR")
                  for m in [_SASS_WGMMA_WAIT.search(operands[i])] if m]
        code.mma_overlap_depth = max(depths) if has_wgmma and depths else None
    return code


_SASS_BAR_ID = re.compile(r"^\s*(0x[0-9a-f]+|\d+)")
_SASS_PRED = re.compile(r"\bU?P[0-6]\b")


def _sass_pingpong(ops: list[str], operands: list[str], loop: LoopStats) -> bool:
    """A warpgroup waits for its turn on one named barrier (BAR.SYNC id) and hands the turn over on another
    (BAR.ARV id'), both ids > 0 (id 0 is the whole block's), inside the main loop."""
    syncs: set[int] = set()
    arrives: set[int] = set()
    for i in range(loop.first, loop.last + 1):
        parts = ops[i].split(".")
        m = _SASS_BAR_ID.match(operands[i])
        if parts[0] == "BAR" and len(parts) > 1 and m and int(m[1], 0) > 0:
            (arrives if parts[1] == "ARV" else syncs if parts[1] == "SYNC" else set()).add(int(m[1], 0))
    return any(a != b for a in syncs for b in arrives)


def _sass_mask_ops(ops: list[str], operands: list[str], loop: LoopStats) -> int:
    """Mask instructions in the main loop: every FSEL/SEL with a -INF operand (a score set to -inf) and the
    predicate writers (ISETP, PLOP3, FSETP) that feed their predicates, followed back through predicate
    operands to the loop's start."""
    marked: set[int] = set()
    todo = [i for i in range(loop.first, loop.last + 1) if ops[i].split(".")[0] in ("FSEL", "SEL")
            and "-INF" in operands[i]]
    marked.update(todo)
    while todo:
        i = todo.pop()
        srcs = _SASS_PRED.findall(operands[i].split(",", 1)[1] if ops[i].split(".")[0] != "FSEL" else
                                  operands[i].rsplit(",", 1)[-1])
        for pred in set(srcs) - {"PT"}:
            for d in range(i - 1, loop.first - 1, -1):  # the nearest earlier writer of the predicate
                if ops[d].split(".")[0] in ("ISETP", "PLOP3", "FSETP") and \
                        _SASS_PRED.findall(operands[d].split(",", 1)[0]) == [pred]:
                    if d not in marked:
                        marked.add(d)
                        todo.append(d)
                    break
    return len(marked)


def _sass_main_loop(ops: list[str], operands: list[str], address: dict[int, int]) -> LoopStats | None:
    """The main loop of a SASS listing (opcodes, operands, address -> index)."""
    branches = _sass_branches(ops, operands, address)

    def is_matrix(i: int) -> bool:
        return bool(_NV_MATRIX.match(ops[i].split(".")[0]))

    def wait_depth(i: int) -> int | None:
        if not ops[i].startswith("WARPGROUP.DEPBAR"):
            return None
        m = _SASS_WGMMA_WAIT.search(operands[i])
        return int(m[1], 0) if m else None

    return main_loop(ops, branches, is_matrix, lambda i: _sass_is_barrier(ops[i]), wait_depth)


def _sass_branches(ops: list[str], operands: list[str], address: dict[int, int]) -> list[tuple[int, int]]:
    """(branch index, target index) of every branch that can close a loop or skip code."""
    branches = []
    for i, (op, rest) in enumerate(zip(ops, operands, strict=True)):
        if op.split(".")[0] == "BRA":
            hits = _SASS_BRANCH_TARGET.findall(rest)
            if hits and int(hits[-1], 16) in address:
                branches.append((i, address[int(hits[-1], 16)]))

    # ptxas moves slow paths (an mbarrier wait's retry loop) past the kernel's EXIT and jumps back into the
    # body from there: such a backward branch closes no loop, and its span (most of the kernel) is not one.
    exits = [i for i, op in enumerate(ops) if op.split(".")[0] == "EXIT"]
    return [(b, t) for b, t in branches if not (t <= b and any(t <= e <= b for e in exits))]


def sass_tma_loads_by_loop(text: str) -> tuple[int, int, int]:
    """TMA loads (UTMALDG) before the main loop, inside it and after it, in program order: what a hand-made
    pipeline's model says the prologue and each iteration issue (slow paths placed after EXIT count as after)."""
    ops, operands, address = _sass_listing(text)
    loop = _sass_main_loop(ops, operands, address)
    loads = [i for i, op in enumerate(ops) if op.split(".")[0] == "UTMALDG"]
    if loop is None:
        return len(loads), 0, 0
    return (sum(i < loop.first for i in loads), sum(loop.first <= i <= loop.last for i in loads),
            sum(i > loop.last for i in loads))


def _sass_listing(text: str) -> tuple[list[str], list[str], dict[int, int]]:
    ops: list[str] = []
    operands: list[str] = []
    address: dict[int, int] = {}
    for line in text.splitlines():
        m = _SASS_LINE.match(line)
        if m:
            address[int(m[1], 16)] = len(ops)
            ops.append(m[2])
            operands.append(m[3].split("/*")[0])  # drop the trailing /* encoding */ comment
    return ops, operands, address


_PTX_MEM = re.compile(r"^\s*(?:@!?%p\d+\s+)?(ld|st)\.global((?:\.[\w:]+)*)\s")
_PTX_TYPE_BITS = re.compile(r"^[bsuf](\d+)$")
_PTX_MATRIX = re.compile(r"^\s*(?:@!?%p\d+\s+)?(mma\.sync|wgmma\.mma_async|tcgen05\.mma|cp\.async\.bulk\.tensor|"
                         r"cp\.async\.bulk|setmaxnreg|wgmma\.wait_group)\b")


def parse_ptx_widths(text: str) -> tuple[dict[int, int], dict[int, int], dict[str, int]]:
    """(load widths, store widths, instruction counts) from PTX: a cross-check on the SASS. The counts are of
    the matrix instructions (mma.sync, wgmma.mma_async, tcgen05.mma) and of cp.async.bulk(.tensor),
    setmaxnreg and wgmma.wait_group."""
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


_PTX_TCGEN05 = re.compile(r"tcgen05\.mma\.[\w:.]+\s+\[[^\]]*\],\s*[^,]+,\s*[^,]+,\s*([^,;\s]+)")
_PTX_MOV_IMM = re.compile(r"^\s*mov\.[bu]32\s+(%r\d+),\s*(-?\d+);")


def tcgen05_shapes(ptx: str) -> list[tuple[int, int]]:
    """(M, N) of every tcgen05.mma in PTX, read from its 32-bit instruction descriptor (PTX ISA, "Instruction
    descriptor": N >> 3 in bits 17-22, M >> 4 in bits 24-28) when it is an immediate or a register last
    set from one by mov. SASS does not show the shape of UTC*MMA."""
    shapes = []
    last_imm: dict[str, int] = {}
    for line in ptx.splitlines():
        mov = _PTX_MOV_IMM.match(line)
        if mov:
            last_imm[mov[1]] = int(mov[2]) & 0xFFFFFFFF
            continue
        m = _PTX_TCGEN05.search(line)
        if m:
            idesc = last_imm.get(m[1]) if m[1].startswith("%") else int(m[1], 0)
            if idesc is not None:
                shapes.append((((idesc >> 24) & 0x1F) << 4, ((idesc >> 17) & 0x3F) << 3))
    return shapes


def parse_nvidia(resource_text: str, sass_text: str, kernel_name: str | None = None, ptx_text: str = "") -> MachineCode:
    """Registers, local memory and static shared memory from the resource usage, the rest from SASS; the
    tcgen05 shapes (for ``min_mma_n``) from the PTX when given."""
    entries = parse_resource_usage(resource_text)
    entry = next((e for e in entries if e.function == kernel_name), entries[0])
    # ptxas places spilled registers in the stack frame (STACK); LOCAL is other per-thread local memory.
    code = MachineCode(regs=entry.regs, spill_bytes=entry.stack_bytes + entry.local_bytes,
                       static_shared_bytes=entry.shared_bytes)
    code = parse_sass(sass_text, code)
    ns = [n for _, n in tcgen05_shapes(ptx_text)] if ptx_text else []
    if ns:
        code.min_mma_n = min(ns + ([code.min_mma_n] if code.min_mma_n else []))
    code.consumer_warpgroups = ptx_consumer_warpgroups(ptx_text) if code.setmaxnreg else None
    return code


_PTX_NTID = re.compile(r"^\.(?:reqntid|maxntid)\s+(\d+)", re.M)
_PTX_SETMAXNREG = re.compile(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)")
PRODUCER_MAX_REGS = 64  # a partition that gives its registers back below this only issues copies


def ptx_consumer_warpgroups(ptx: str) -> int | None:
    """The warpgroups of a warp-specialized block that run the math: the block's threads (``.reqntid``) / 128,
    less one producer warpgroup when a ``setmaxnreg.dec`` lowers a partition below PRODUCER_MAX_REGS (Triton
    gives each partition whole warpgroups for setmaxnreg; the kernels here have at most one producer)."""
    m = _PTX_NTID.search(ptx)
    if not m:
        return None
    producer = any(kind == "dec" and int(n) < PRODUCER_MAX_REGS for kind, n in _PTX_SETMAXNREG.findall(ptx))
    return -(-int(m[1]) // 128) - producer


# ---------------------------------------------------------------------------------------------------
# AMD: AMDGCN assembly with its code-object metadata.

# Keys of the code object's YAML kernel map; the map's first key carries the list dash (`  - .agpr_count: 0`).
_AMD_META = {
    "regs": re.compile(r"^\s+(?:-\s+)?\.vgpr_count:\s+(\d+)", re.M),
    "sgprs": re.compile(r"^\s+(?:-\s+)?\.sgpr_count:\s+(\d+)", re.M),
    "agprs": re.compile(r"^\s+(?:-\s+)?\.agpr_count:\s+(\d+)", re.M),
    "vgpr_spills": re.compile(r"^\s+(?:-\s+)?\.vgpr_spill_count:\s+(\d+)", re.M),
    "sgpr_spills": re.compile(r"^\s+(?:-\s+)?\.sgpr_spill_count:\s+(\d+)", re.M),
    "lds": re.compile(r"^\s+(?:-\s+)?\.group_segment_fixed_size:\s+(\d+)", re.M),
    "scratch": re.compile(r"^\s+(?:-\s+)?\.private_segment_fixed_size:\s+(\d+)", re.M),
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


# LDS: ds_read*/ds_write* (CDNA, gfx9 names) and ds_load*/ds_store* (RDNA3 names). The 2-address forms
# (ds_read2_b32, ds_write2st64_b64) move two elements per lane.
_AMD_LDS = re.compile(r"^ds_(read|write|load|store)(2(?:st64)?)?_([a-z]?\d+)(?:_|$)")
_AMD_LABEL = re.compile(r"^(\.?[A-Za-z_$][\w.$]*):")
_AMD_BRANCH = re.compile(r"^\s+s_(?:cbranch_\w+|branch)\s+(\.?[A-Za-z_$][\w.$]*)")


def amd_lds_access(insn: str) -> tuple[str, int] | None:
    """("read" | "write", bits per lane) of an LDS instruction, None for any other (atomics, permutes, ...)."""
    m = _AMD_LDS.match(insn)
    if m is None:
        return None
    kind = "read" if m[1] in ("read", "load") else "write"
    bits = int(re.sub(r"^[a-z]", "", m[3]))
    return kind, bits * (2 if m[2] else 1)


def parse_amdgcn(text: str) -> MachineCode:
    """Resource usage from the code-object metadata, widths, LDS accesses, matrix instructions and the main
    loop from the code."""
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
    lds: dict[str, Counter] = {"read": Counter(), "write": Counter()}
    ops: list[str] = []
    labels: dict[str, int] = {}
    branch_to: list[tuple[int, str]] = []
    in_code = False
    for line in text.splitlines():
        if line.startswith(".Lfunc_end") or ".end_amdgpu_metadata" in line:
            in_code = False
        elif line.rstrip().endswith(":") and not line.startswith((" ", "\t", ".")):
            in_code = True  # a function label
        if not in_code:
            continue
        lab = _AMD_LABEL.match(line)
        if lab:
            labels[lab[1]] = len(ops)
            continue
        m = _AMD_INSN.match(line)
        if not m:
            continue
        insn = m[1]
        br = _AMD_BRANCH.match(line)
        if br:
            branch_to.append((len(ops), br[1]))
        ops.append(insn)
        mem = _AMD_MEM.match(insn)
        if mem:
            if mem[2] == "atomic":
                code.atomics += 1
            else:
                (loads if mem[2] == "load" else stores)[amd_access_bits(mem[3])] += 1
        elif _AMD_MATRIX.match(insn):
            matrix[insn] += 1
        else:
            access = amd_lds_access(insn)
            if access:
                lds[access[0]][access[1]] += 1
    if not ops:
        raise ValueError("no AMDGCN instructions found")
    code.load_widths, code.store_widths, code.matrix_ops = dict(loads), dict(stores), dict(matrix)
    code.lds_read_widths, code.lds_write_widths = dict(lds["read"]), dict(lds["write"])
    code.narrow_lds_ops = sum(n for w in lds.values() for bits, n in w.items() if bits < 32)
    code.n_instructions = len(ops)
    code.min_mma_n = _min_n(code.matrix_ops)
    code.mfma_shapes = sorted({"x".join(map(str, shape)) for shape in map(matrix_shape, code.matrix_ops) if shape})
    branches = [(i, labels[name]) for i, name in branch_to if name in labels]
    def is_barrier(i: int) -> bool:
        return ops[i] in ("s_barrier", "s_barrier_wait")

    loop = main_loop(ops, branches, lambda i: bool(_AMD_MATRIX.match(ops[i])), is_barrier, lambda i: None)
    if not code.matrix_ops:
        code.row_pass_barriers = row_pass_barriers(len(ops), branches, is_barrier)
    if loop is not None:
        code.loop_barriers = loop.barriers
    return code
