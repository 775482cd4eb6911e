"""Collective argument checks for the sharded helpers: every rank of a group states the sizes and options of its
call, one small all-gather compares them, and on disagreement every rank raises the same ValueError (built from
the gathered table alone, so the message is identical on every rank) before any collective that would abort
inside the backend or return a plausible wrong result.

Cost: one all-gather of SLOTS int64 per rank, once per (op, group, local call signature): a call whose local
signature this process has already seen agree skips it. Ranks change their signatures together in a training
loop (the batch is the same on every rank of a tensor- or context-parallel group), so they all check again
together; a rank whose signature diverges *after* an agreed call finds the others skipping, which is today's
behaviour (an error inside the backend), not a new one.
"""

from __future__ import annotations

import weakref
import zlib

import torch
import torch.distributed as dist

SLOTS = 8  # fixed size: the all-gather itself can never disagree in shape
_AGREED: set[tuple] = set()
_WATCHED: dict[int, weakref.ref] = {}
_MAX_CACHED = 1024


def fingerprint(*values: object) -> int:
    """A stable int for values that must be equal on every rank but are not sizes (options, flags)."""
    return zlib.crc32(repr(values).encode())


def check_agreement(op: str, group, device: torch.device, fields: dict[str, int]) -> None:
    """Raise the same ValueError on every rank of `group` when any of `fields` (name -> int, at most SLOTS - 1)
    differs between ranks. Collective on a cache miss: every rank must call it at the same point."""
    if len(fields) >= SLOTS:
        raise ValueError(f"check_agreement: at most {SLOTS - 1} fields, got {len(fields)}")
    names = list(fields)
    local = [fingerprint(op, names)] + [int(fields[n]) for n in names]
    # Per group object (the current default group for None): a re-initialized default group is checked afresh.
    # Its entries go when it is freed (a weak reference: the cache never keeps a destroyed group's backend alive,
    # and a new group at a freed one's address finds nothing).
    pg = dist.group.WORLD if group is None else group
    key = (op, id(pg), tuple(local))
    if key in _AGREED:
        return
    mine = torch.zeros(SLOTS, dtype=torch.int64, device=device)
    mine[:len(local)] = torch.tensor(local, dtype=torch.int64)
    world = dist.get_world_size(group)
    table = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(table, mine, group=group)
    rows = [t.tolist() for t in table]  # one device-to-host copy per check, not per call
    if any(r[0] != rows[0][0] for r in rows):
        raise ValueError(f"{op}: the ranks of the group are not all calling {op} with the same arguments here "
                         f"(another collective call on some rank)")
    bad = [i for i in range(len(names)) if len({r[i + 1] for r in rows}) > 1]
    if bad:
        parts = [f"{names[i]} " + ", ".join(f"rank {rank}: {r[i + 1]}" for rank, r in enumerate(rows)) for i in bad]
        raise ValueError(f"{op}: every rank of the group must pass the same sizes and options; they differ in "
                         + "; ".join(parts))
    if len(_AGREED) >= _MAX_CACHED:
        _AGREED.clear()
    if id(pg) not in _WATCHED:
        _WATCHED[id(pg)] = weakref.ref(pg, lambda _, gid=id(pg): _forget(gid))
    _AGREED.add(key)


def _forget(gid: int) -> None:
    _WATCHED.pop(gid, None)
    for key in [k for k in _AGREED if k[1] == gid]:
        _AGREED.discard(key)
