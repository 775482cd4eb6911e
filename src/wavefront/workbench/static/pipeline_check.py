"""A checker for hand-made pipelines: the asynchronous copies, mbarriers and matrix-op groups of a kernel
that manages them itself (Gluon today), replayed on a model and checked event by event.

Nothing here runs a kernel. A *model* of a kernel is a Python function that walks one program of the kernel
in program order and reports each pipeline event to a :class:`Pipeline`: a copy issued into a ring stage, an
mbarrier wait, an asynchronous matrix op that reads stages, a wait on the matrix-op groups, a block-wide
barrier, a plain write of a stage. A model is built from the kernel's own schedule functions (the integer
helpers the kernel calls to pick the block, stage and phase; their Python bodies run here on ints), so it
cannot drift from the kernel's index arithmetic; only the order of the calls is written twice, and the
model's counts are checked against the compiled machine code (TMA loads before and inside the main loop).

What is checked (each a :class:`Violation` kind):

``wait-never-satisfied``
    an mbarrier wait whose phase no issued copy will complete: the program deadlocks there (the model stops).
``wait-wrong-phase``
    a wait that passes on an earlier phase (mbarrier parity: a wait on parity p passes as soon as the last
    completed phase has parity p), so the consumer may read the stage before its copy lands.
``read-wrong-block`` / ``read-not-ready``
    a matrix op reads a stage that holds another block than the one the model says it reads, or a stage whose
    copy was not waited for (or is being overwritten by a copy in flight).
``refill-while-read``
    a copy (or plain write) into a stage that a matrix-op group not yet retired by a wait may still read, or,
    with several warpgroups, one retired by this warpgroup's wait but with no block-wide barrier since (the
    other warpgroups' groups may still read it).
``refill-before-consumed``
    a second copy into a stage before the first was waited for: two phases pending on one barrier (parity
    cannot tell them apart) and the first block overwritten.
``copy-past-end``
    a copy of a block wholly past the tensor's rows (TMA would fill zeros and still count the bytes: wasted
    traffic, and a sign of an index error). A copy of the last, partial block is clipped by TMA (rows past the
    end arrive as zeros); it is counted in :attr:`Pipeline.clipped`, not a violation.
``copy-not-consumed``
    a copy that was never waited for and read by a matrix op before the program ended (wasted bandwidth, or a
    copy still in flight when its barrier is invalidated).
``mma-in-flight-at-exit``
    a matrix-op group never retired.

mbarrier phase semantics used: each stage's barrier completes one phase per copy (count 1 with expect-tx);
copies complete in issue order per barrier but at a time the program cannot know, so every check holds for
every timing: a wait is satisfied only if exactly one copy is pending on its barrier and the parity waited is
that copy's phase.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

VIOLATION_KINDS = ("wait-never-satisfied", "wait-wrong-phase", "read-wrong-block", "read-not-ready",
                   "refill-while-read", "refill-before-consumed", "copy-past-end", "copy-not-consumed",
                   "mma-in-flight-at-exit")


@dataclass(frozen=True)
class Violation:
    """One broken rule: its kind (see the module docstring), where in the program (the model's label, e.g.
    ``loop j=1``), the ring, stage and block involved, and a sentence."""

    kind: str
    at: str
    ring: str
    stage: int
    block: int | None
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.at}: {self.ring}[{self.stage}] block {self.block}: {self.detail}"


class Deadlock(Exception):
    """Raised by :meth:`Pipeline.wait` when the wait can never pass; :func:`run_model` catches it."""


@dataclass
class _Copy:
    block: int
    issued_at: str
    waited: bool = False
    read: bool = False


@dataclass
class _Stage:
    copies: list[_Copy] = field(default_factory=list)  # every copy into this stage, in issue order
    completed_waits: int = 0  # phases the program has waited for (= copies consumed by a wait)
    holds: int | None = None  # the block in the stage after the last satisfied wait


@dataclass
class _Ring:
    name: str
    n_stages: int
    n_rows: int | None
    block_rows: int | None
    stages: list[_Stage]


@dataclass
class _Group:
    reads: tuple[tuple[str, int], ...]
    at: str
    retired_epoch: int | None = None  # the wait that retired it, by program position


class Pipeline:
    """The state of one program's pipeline: rings of shared-memory stages (one mbarrier each), matrix-op groups
    in flight, block-wide barriers. A model calls the methods in program order; :attr:`violations` collects
    what breaks, and a wait that can never pass raises :class:`Deadlock`.

    n_warpgroups > 1: each warpgroup waits for its own matrix-op groups, so a stage read by a retired group is
    free for another warpgroup's copy only after a block-wide barrier that follows the retiring wait."""

    def __init__(self, n_warpgroups: int = 1) -> None:
        self.n_warpgroups = n_warpgroups
        self.rings: dict[str, _Ring] = {}
        self.groups: list[_Group] = []
        self.violations: list[Violation] = []
        self.clipped = 0  # copies of a partial last block (TMA zero-fills the rows past the end)
        self.issued = 0
        self._epoch = 0
        self._last_barrier = -1

    # -- declarations -----------------------------------------------------------------------------------
    def ring(self, name: str, n_stages: int, *, n_rows: int | None = None, block_rows: int | None = None) -> None:
        """A ring of n_stages buffers, each with its own mbarrier. n_rows/block_rows: the rows of the tensor the
        copies read and the rows per block (for the past-the-end checks); None: not checked."""
        if n_stages < 1:
            raise ValueError(f"ring {name!r}: n_stages must be >= 1, got {n_stages}")
        self.rings[name] = _Ring(name, n_stages, n_rows, block_rows, [_Stage() for _ in range(n_stages)])

    def _stage(self, ring: str, stage: int, at: str) -> _Stage:
        r = self.rings[ring]
        if not 0 <= stage < r.n_stages:
            raise ValueError(f"{at}: stage {stage} is outside ring {ring!r} of {r.n_stages} stages")
        return r.stages[stage]

    def _flag(self, kind: str, at: str, ring: str, stage: int, block: int | None, detail: str) -> None:
        self.violations.append(Violation(kind, at, ring, stage, block, detail))

    def _tick(self) -> int:
        self._epoch += 1
        return self._epoch

    # -- events -----------------------------------------------------------------------------------------
    def _check_free(self, ring: str, stage: int, block: int | None, at: str, what: str) -> None:
        for g in self.groups:
            if (ring, stage) not in g.reads or (g.retired_epoch is not None and g.retired_epoch < self._last_barrier):
                continue
            if g.retired_epoch is None:
                self._flag("refill-while-read", at, ring, stage, block,
                           f"{what} while the matrix op issued at {g.at} may still read the stage (not retired)")
            elif self.n_warpgroups > 1 and self._last_barrier < g.retired_epoch:
                self._flag("refill-while-read", at, ring, stage, block,
                           f"{what} after this warpgroup retired the matrix op issued at {g.at} but with no "
                           "block-wide barrier since: another warpgroup's may still read the stage")

    def issue(self, ring: str, stage: int, block: int, pred: bool = True, *, at: str) -> None:
        """An asynchronous copy of `block` into `stage` (expect-tx on the stage's barrier, then the copy);
        pred False: the kernel's predicate turned it off (nothing happens)."""
        if not pred:
            return
        self._tick()
        r, s = self.rings[ring], self._stage(ring, stage, at)
        self._check_free(ring, stage, block, at, f"copy of block {block}")
        if len(s.copies) > s.completed_waits:
            pending = s.copies[-1]
            self._flag("refill-before-consumed", at, ring, stage, block,
                       f"copy of block {block} while the copy of block {pending.block} ({pending.issued_at}) "
                       "was not waited for: two phases pending on one barrier")
        if r.n_rows is not None and r.block_rows is not None:
            if block < 0 or block * r.block_rows >= r.n_rows:
                self._flag("copy-past-end", at, ring, stage, block,
                           f"rows {block * r.block_rows}..{(block + 1) * r.block_rows - 1} are past the tensor's "
                           f"{r.n_rows} rows")
            elif (block + 1) * r.block_rows > r.n_rows:
                self.clipped += 1
        s.copies.append(_Copy(block, at))
        self.issued += 1

    def wait(self, ring: str, stage: int, phase: int, block: int, *, at: str) -> None:
        """An mbarrier wait on `stage`'s barrier for phase parity `phase`, after which the program reads `block`
        from the stage."""
        self._tick()
        s = self._stage(ring, stage, at)
        done = s.completed_waits  # phases completed and consumed so far; the next phase to complete is `done`
        pending = len(s.copies) - done
        if pending <= 0:
            if phase == done & 1:
                self._flag("wait-never-satisfied", at, ring, stage, block,
                           f"waits for phase parity {phase} (the barrier's phase {done}) but no copy into the "
                           f"stage is pending: block {block} was never issued")
                raise Deadlock(str(self.violations[-1]))
            self._flag("wait-wrong-phase", at, ring, stage, block,
                       f"waits for parity {phase}, which the barrier's last completed phase {done - 1} already has: "
                       "passes at once with no copy pending")
            return
        copy = s.copies[-1]
        if pending > 1:  # already flagged by issue() as refill-before-consumed; the stage holds the last copy
            for c in s.copies[done:]:
                c.waited = True
            s.completed_waits, s.holds = len(s.copies), copy.block
            return
        if phase != done & 1:
            self._flag("wait-wrong-phase", at, ring, stage, block,
                       f"waits for parity {phase} but the pending copy of block {copy.block} completes phase "
                       f"{done} (parity {done & 1}): passes before it lands")
        copy.waited = True
        s.completed_waits += 1
        s.holds = copy.block
        if copy.block != block:
            self._flag("read-wrong-block", at, ring, stage, block,
                       f"the wait is for block {block} but the copy it completes is of block {copy.block} "
                       f"({copy.issued_at})")

    def mma(self, reads: Iterable[tuple[str, int, int]], *, at: str) -> None:
        """An asynchronous matrix op (its own commit group) that reads (ring, stage, block) operands."""
        self._tick()
        keys = []
        for ring, stage, block in reads:
            s = self._stage(ring, stage, at)
            if len(s.copies) > s.completed_waits:
                self._flag("read-not-ready", at, ring, stage, block,
                           f"reads the stage while the copy of block {s.copies[-1].block} into it is in flight")
            elif s.holds is None:
                self._flag("read-not-ready", at, ring, stage, block, "reads a stage no wait has filled")
            elif s.holds != block:
                self._flag("read-wrong-block", at, ring, stage, block, f"the stage holds block {s.holds}")
            else:
                s.copies[-1].read = True
            keys.append((ring, stage))
        self.groups.append(_Group(tuple(keys), at))

    def mma_wait(self, depth: int, *, at: str) -> None:
        """Retire every matrix-op group but the `depth` most recent (wgmma.wait_group depth)."""
        epoch = self._tick()
        live = [g for g in self.groups if g.retired_epoch is None]
        for g in live[:max(len(live) - depth, 0)]:
            g.retired_epoch = epoch

    def barrier(self, *, at: str) -> None:
        """A block-wide barrier (bar.sync): every warpgroup is past its earlier waits."""
        self._last_barrier = self._tick()

    def write(self, ring: str, stage: int, *, at: str) -> None:
        """A plain (non-copy) write of a stage, e.g. an output tile stored through an input's buffer."""
        self._tick()
        self._check_free(ring, stage, None, at, "write")
        self._stage(ring, stage, at).holds = None

    def finish(self, *, at: str = "exit") -> None:
        """The end of the program: every copy consumed, every matrix-op group retired."""
        for r in self.rings.values():
            for i, s in enumerate(r.stages):
                for c in s.copies:
                    if not (c.waited and c.read):
                        why = "never waited for" if not c.waited else "waited for but never read"
                        self._flag("copy-not-consumed", c.issued_at, r.name, i, c.block, why)
        for g in self.groups:
            if g.retired_epoch is None:
                self._flag("mma-in-flight-at-exit", at, g.reads[0][0] if g.reads else "", g.reads[0][1]
                           if g.reads else 0, None, f"the matrix op issued at {g.at} is never retired")


@dataclass(frozen=True)
class ModelRun:
    """One program of one configuration: its parameters, the violations (empty: accepted) and counts."""

    params: dict
    violations: tuple[Violation, ...]
    deadlocked: bool
    issued: int
    clipped: int

    @property
    def ok(self) -> bool:
        return not self.violations


def run_model(model: Callable[..., None], n_warpgroups: int = 1, **params) -> ModelRun:
    """Run model(pipeline, **params) on a fresh :class:`Pipeline`, then its end-of-program checks (skipped after
    a deadlock: the program never gets there)."""
    p = Pipeline(n_warpgroups)
    deadlocked = False
    try:
        model(p, **params)
    except Deadlock:
        deadlocked = True
    else:
        p.finish()
    return ModelRun(dict(params), tuple(p.violations), deadlocked, p.issued, p.clipped)


@dataclass(frozen=True)
class GridReport:
    """A model over a grid of configurations: how many programs ran, and every one that broke a rule."""

    model: str
    runs: int
    failures: tuple[ModelRun, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict:
        return {"model": self.model, "runs": self.runs, "ok": self.ok,
                "failures": [{"params": f.params, "deadlocked": f.deadlocked,
                              "violations": [str(v) for v in f.violations]} for f in self.failures]}


def check_grid(name: str, model: Callable[..., None], grid: Iterable[dict], n_warpgroups: int = 1) -> GridReport:
    """Run the model over every configuration of the grid (dicts of keyword arguments)."""
    runs = [run_model(model, n_warpgroups, **params) for params in grid]
    return GridReport(name, len(runs), tuple(r for r in runs if not r.ok))


# ---------------------------------------------------------------------------------------------------
# Warp-specialized programs: several agents (a producer partition, consumer warpgroups) that talk only through
# mbarriers (ready / empty per stage), named barriers (bar.sync / bar.arrive) and the data in the stages.
#
# A model is a set of agents, each a generator of events in its program order (see :class:`WsEvent`); the
# simulator interleaves them one event at a time under a scheduling *policy* and lands each asynchronous copy
# at a time the policy picks, so one model is checked under several timings (the producer far ahead, copies
# landing as late as possible, the consumers first, seeded random orders). Rules, besides the single-program
# ones above (``refill-while-read``, ``read-wrong-block``, ``read-not-ready``, ``copy-past-end``,
# ``copy-not-consumed``, ``mma-in-flight-at-exit``, ``refill-before-consumed``):
#
# ``deadlock``
#     no agent can make progress and no copy is in flight, but some agent has not finished.
# ``barrier-overrun``
#     an agent arrives on a named barrier a second time before the barrier completed (undefined in hardware).
# ``barrier-unbalanced``
#     a named barrier with arrivals pending when every agent has finished.
# ``pingpong-order``
#     two GEMM bursts in a row by the same consumer (the named barriers should alternate them).
# ``release-while-read``
#     an arrive on a stage's *empty* barrier while this agent's matrix op reading the stage is not retired.

WS_VIOLATION_KINDS = ("deadlock", "barrier-overrun", "barrier-unbalanced", "pingpong-order", "release-while-read")
POLICIES = ("producer-first", "late-copies", "consumers-first", "random-1", "random-2")


@dataclass
class _MBar:
    count: int
    arrivals: int = 0
    completed: int = 0  # phases completed
    in_flight: list = field(default_factory=list)  # copies (ring, stage, block, at) whose bytes are pending
    releases: tuple[str, int] | None = None  # (ring, stage) this barrier says is free (an *empty* barrier)


@dataclass
class _NamedBar:
    arrived: set = field(default_factory=set)
    generation: int = 0


class WarpSpecialized:
    """The shared state of one program of a warp-specialized kernel, driven by :func:`run_ws_model`.

    Events (tuples an agent yields, in its program order):
    ``("copy", ring, stage, block, bar, row0, at)`` expect-tx on `bar` and a TMA copy of `block` (first row
    `row0` of the ring's tensor) into `stage`; ``("wait", bar, parity, at)``; ``("arrive", bar, at)``;
    ``("mma", reads, at)`` an asynchronous matrix op of this agent reading (ring, stage, block) operands;
    ``("mma_wait", depth, at)``; ``("bar_sync", id, at)``; ``("bar_arrive", id, at)``; ``("burst", at)`` the
    start of a GEMM burst (for the ping-pong order)."""

    def __init__(self) -> None:
        self.rings: dict[str, tuple[int, int | None]] = {}
        self.contents: dict[tuple[str, int], object] = {}
        self.reads_of: dict[tuple[str, int], set] = {}  # copies read: (ring, stage) -> blocks
        self.copies: list[tuple[str, int, object, str]] = []
        self.read_copies: set = set()
        self.mbars: dict[str, _MBar] = {}
        self.named: dict[int, _NamedBar] = {}
        self.groups: dict[str, list[list]] = {}  # agent -> [[reads, at, retired]]
        self.bursts: list[str] = []
        self.violations: list[Violation] = []
        self.issued = 0

    def ring(self, name: str, n_stages: int, *, n_rows: int | None = None) -> None:
        self.rings[name] = (n_stages, n_rows)

    def mbarrier(self, name: str, count: int, *, releases: tuple[str, int] | None = None) -> None:
        self.mbars[name] = _MBar(count, releases=releases)

    def _flag(self, kind: str, at: str, ring: str = "", stage: int = 0, block=None, detail: str = "") -> None:
        self.violations.append(Violation(kind, at, ring, stage, block, detail))

    def _live_readers(self, ring: str, stage: int) -> list[tuple[str, str]]:
        return [(agent, g[1]) for agent, gs in self.groups.items() for g in gs
                if not g[2] and any((r, s) == (ring, stage) for r, s, _ in g[0])]

    # -- whether an agent's next event can run now ------------------------------------------------------
    def ready(self, agent: str, ev: tuple, state: dict) -> bool:
        if ev[0] == "wait":
            b = self.mbars[ev[1]]
            return (b.completed & 1) != ev[2]  # try_wait.parity: the phase of that parity has completed
        if ev[0] == "bar_sync" and agent in state.get("syncing", {}):
            return self.named[ev[1]].generation > state["syncing"][agent]
        return True

    # -- running it --------------------------------------------------------------------------------------
    def run(self, agent: str, ev: tuple, state: dict) -> bool:
        """Apply one event; False when the agent stays on it (a bar.sync that has arrived and now waits)."""
        kind, at = ev[0], ev[-1]
        if kind == "copy":
            _, ring, stage, block, bar, row0, _ = ev
            n_stages, n_rows = self.rings[ring]
            if not 0 <= stage < n_stages:
                raise ValueError(f"{at}: stage {stage} is outside ring {ring!r} of {n_stages} stages")
            for who, where in self._live_readers(ring, stage):
                self._flag("refill-while-read", at, ring, stage, block,
                           f"copy while {who}'s matrix op issued at {where} may still read the stage")
            if any((c[0], c[1]) == (ring, stage) for b in self.mbars.values() for c in b.in_flight):
                self._flag("refill-before-consumed", at, ring, stage, block, "copy while another copy into "
                           "the stage is in flight")
            if n_rows is not None and row0 >= n_rows:
                self._flag("copy-past-end", at, ring, stage, block, f"first row {row0} is past the {n_rows} rows")
            b = self.mbars[bar]
            b.in_flight.append((ring, stage, block, at))
            self.contents[(ring, stage)] = None  # being overwritten
            self.copies.append((ring, stage, block, at))
            self.issued += 1
            self._arrive(bar)  # expect-tx arrives; the phase completes when the bytes land
        elif kind == "wait":
            pass  # ready() said the parity has passed; what it lets the agent read is checked at the read
        elif kind == "arrive":
            rel = self.mbars[ev[1]].releases
            if rel is not None:
                for who, where in self._live_readers(*rel):
                    if who == agent:
                        self._flag("release-while-read", at, rel[0], rel[1], None,
                                   f"marks the stage free while its matrix op issued at {where} is not retired")
            self._arrive(ev[1])
        elif kind == "mma":
            for ring, stage, block in ev[1]:
                held = self.contents.get((ring, stage), "empty")
                if held is None:
                    self._flag("read-not-ready", at, ring, stage, block, "reads the stage while a copy into it is "
                               "in flight")
                elif held != block:
                    self._flag("read-wrong-block", at, ring, stage, block, f"the stage holds {held}")
                else:
                    self.read_copies.add((ring, stage, block))
            self.groups.setdefault(agent, []).append([tuple(ev[1]), at, False])
        elif kind == "mma_wait":
            live = [g for g in self.groups.get(agent, []) if not g[2]]
            for g in live[:max(len(live) - ev[1], 0)]:
                g[2] = True
        elif kind in ("bar_sync", "bar_arrive"):
            nb = self.named.setdefault(ev[1], _NamedBar())
            if kind == "bar_sync" and agent in state.setdefault("syncing", {}):
                del state["syncing"][agent]  # the barrier completed: go on
                return True
            if agent in nb.arrived:
                self._flag("barrier-overrun", at, f"bar{ev[1]}", 0, None, f"{agent} arrives again before the "
                           "barrier completed")
            nb.arrived.add(agent)
            gen = nb.generation
            if len(nb.arrived) == 2:  # 256 threads: two warpgroups
                nb.arrived, nb.generation = set(), nb.generation + 1
            if kind == "bar_sync" and nb.generation == gen:
                state["syncing"][agent] = gen
                return False
        elif kind == "burst":
            if self.bursts and self.bursts[-1] == agent:
                self._flag("pingpong-order", at, "", 0, None, f"{agent} issues two GEMM bursts in a row")
            self.bursts.append(agent)
        else:
            raise ValueError(f"unknown event {kind!r}")
        return True

    def _arrive(self, bar: str) -> None:
        b = self.mbars[bar]
        b.arrivals += 1
        self._maybe_complete(b)

    def _maybe_complete(self, b: _MBar) -> None:
        if b.arrivals >= b.count and not b.in_flight:
            b.arrivals -= b.count
            b.completed += 1

    def land(self, bar: str) -> None:
        """The oldest copy in flight on `bar` lands: its stage holds the block, the barrier may complete."""
        b = self.mbars[bar]
        ring, stage, block, _ = b.in_flight.pop(0)
        self.contents[(ring, stage)] = block
        self._maybe_complete(b)

    def finish(self, at: str = "exit") -> None:
        for ring, stage, block, where in self.copies:
            if (ring, stage, block) not in self.read_copies:
                self._flag("copy-not-consumed", where, ring, stage, block, "never read by a matrix op")
        for agent, gs in self.groups.items():
            for reads, where, retired in gs:
                if not retired:
                    self._flag("mma-in-flight-at-exit", at, reads[0][0] if reads else "", reads[0][1] if reads
                               else 0, None, f"{agent}'s matrix op issued at {where} is never retired")
        for bid, nb in self.named.items():
            if nb.arrived:
                self._flag("barrier-unbalanced", at, f"bar{bid}", 0, None,
                           f"arrivals of {sorted(nb.arrived)} pending at exit")


def _pick(policy: str, options: list[tuple[str, str]], rng) -> tuple[str, str]:
    """options: ("agent", name) or ("land", bar), in agent order (producer first) then landings."""
    agents = [o for o in options if o[0] == "agent"]
    lands = [o for o in options if o[0] == "land"]
    if policy == "producer-first":
        return (agents[:1] if agents and agents[0][1] == "producer" else lands[:1] or agents[:1])[0]
    if policy == "late-copies":
        return (agents or lands)[0]
    if policy == "consumers-first":
        consumers = [o for o in agents if o[1] != "producer"]
        return (consumers or lands or agents)[0]
    return options[rng.randrange(len(options))]


def run_ws_model(model: Callable[..., dict], policy: str = "producer-first", **params) -> ModelRun:
    """Run a warp-specialized model: ``model(ws, **params)`` declares rings and barriers on `ws` and returns
    {agent name: event generator}; the agents run interleaved under `policy` (see :data:`POLICIES`)."""
    ws = WarpSpecialized()
    agents = model(ws, **params)
    rng = random.Random(policy)
    pending: dict[str, tuple | None] = {name: next(gen, None) for name, gen in agents.items()}
    state: dict = {}
    deadlocked = False
    for _ in range(10_000_000):
        options: list[tuple[str, str]] = [("agent", n) for n, ev in pending.items()
                                             if ev is not None and ws.ready(n, ev, state)]
        options += [("land", b) for b, mb in ws.mbars.items() if mb.in_flight]
        if not options:
            stuck = {n: ev for n, ev in pending.items() if ev is not None}
            if stuck:
                deadlocked = True
                for n, ev in stuck.items():
                    ws._flag("deadlock", ev[-1], "", 0, None, f"{n} waits forever on {ev[:-1]}")
            break
        what, name = _pick(policy, options, rng)
        if what == "land":
            ws.land(name)
            continue
        if ws.run(name, pending[name], state):
            pending[name] = next(agents[name], None)
    if not deadlocked:
        ws.finish()
    return ModelRun(dict(params, policy=policy), tuple(ws.violations), deadlocked, ws.issued, 0)


def check_ws_grid(name: str, model: Callable[..., dict], grid: Iterable[dict],
                  policies: Iterable[str] = POLICIES) -> GridReport:
    """A warp-specialized model over every configuration of the grid and every scheduling policy."""
    policies = tuple(policies)
    runs = [run_ws_model(model, policy, **params) for params in grid for policy in policies]
    return GridReport(name, len(runs), tuple(r for r in runs if not r.ok))
