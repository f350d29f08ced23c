"""Reservoir sample of a stream's history (Vitter's Algorithm R), bounded by ``capacity`` rows.

The engine only reads a reservoir while it processes a chunk (mini-batches are drawn from
the *earlier* observations) and returns the slot writes the chunk causes; the owner
applies them afterwards (``Reservoir.apply``), and the service writes only those slots to
Redis. After n items every item is in the reservoir with probability min(1, capacity/n).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ReservoirWrites:
    """Rows to store: ``slots [k]`` (int64, distinct) and ``rows [k, F]``."""

    slots: torch.Tensor
    rows: torch.Tensor

    def __len__(self) -> int:
        return int(self.slots.numel())


def algorithm_r(generator: torch.Generator, n_before: int, rows: torch.Tensor, capacity: int) -> ReservoirWrites:
    """Slot writes for appending ``rows [B, F]`` after ``n_before`` items (later rows win a shared slot).

    Item t (1-based) goes to slot t - 1 while the reservoir has room, afterwards to slot
    floor(u t) for one uniform u, which is a slot iff it is below the capacity."""
    b = rows.shape[0]
    room = min(b, max(0, capacity - n_before))  # the first `room` rows fill free slots in order
    slots = np.arange(n_before, n_before + b, dtype=np.int64)
    src = np.arange(b)
    if room < b:
        t = np.arange(n_before + room + 1, n_before + b + 1, dtype=np.float64)
        u = torch.rand(b - room, generator=generator, dtype=torch.float64).numpy()
        slots[room:] = np.floor(u * t).astype(np.int64)
        src = np.flatnonzero(slots < capacity)
        slots = slots[src]
        # last write wins: unique over the reversed order keeps each slot's latest row
        _, first_rev = np.unique(slots[::-1], return_index=True)
        pick = (len(slots) - 1 - first_rev)[::-1]
        pick.sort()
        src, slots = src[pick], slots[pick]
    return ReservoirWrites(torch.from_numpy(slots), rows[torch.from_numpy(src)])


class Reservoir:
    """Mutable store of up to ``capacity`` featurized rows ``[size, width]`` (grows by doubling)."""

    def __init__(self, capacity: int, width: int, data: torch.Tensor | None = None):
        self.capacity = int(capacity)
        self.width = int(width)
        self.size = 0 if data is None else int(data.shape[0])
        init = max(self.size, min(self.capacity, 1024))
        self._buf = torch.empty(init, self.width, dtype=torch.float64)
        if data is not None:
            if data.shape[1:] != (self.width,) or self.size > self.capacity:
                raise ValueError(f"reservoir data of shape {tuple(data.shape)} does not fit [<= {capacity}, {width}]")
            self._buf[: self.size] = data

    @property
    def data(self) -> torch.Tensor:
        """The filled rows ``[size, width]`` (a view; do not mutate)."""
        return self._buf[: self.size]

    def apply(self, writes: ReservoirWrites) -> None:
        if len(writes) == 0:
            return
        top = int(writes.slots.max()) + 1
        if top > self._buf.shape[0]:
            new = torch.empty(min(self.capacity, max(top, 2 * self._buf.shape[0])), self.width, dtype=torch.float64)
            new[: self.size] = self._buf[: self.size]
            self._buf = new
        self._buf[writes.slots] = writes.rows
        self.size = max(self.size, top)

    @property
    def nbytes(self) -> int:
        """Memory it holds (its buffer, which grows by doubling up to the capacity)."""
        return self._buf.element_size() * self._buf.nelement()

    def copy(self) -> "Reservoir":
        return Reservoir(self.capacity, self.width, self.data.clone())

    def to_bytes(self) -> bytes:
        return self.data.contiguous().numpy().tobytes()

    @classmethod
    def from_bytes(cls, capacity: int, width: int, raw: bytes) -> "Reservoir":
        arr = np.frombuffer(raw, dtype=np.float64).reshape(-1, width)
        return cls(capacity, width, torch.from_numpy(arr.copy()))
