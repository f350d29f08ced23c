"""Sampler state and its exact byte serialisation.

``to_bytes``/``from_bytes`` round-trip bit for bit (raw little-endian tensor bytes plus a
JSON header whose floats are written with ``repr``), so a worker that reloads a state
continues with exactly the numbers an uninterrupted run produces.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np
import torch

MAGIC = b"CUSPSGAIS1\n"


@dataclass(frozen=True)
class SGAISState:
    """theta [M, D] float64 particles (unconstrained); log_weights [M] float64, normalised;
    log_evidence: log p(y_1..n) estimate; n: observations seen; chunks: chunks seen;
    rng: torch.Generator state (uint8); cv_theta [D] / cv_grad [D]: control-variate reference
    point and the sum of per-observation gradients over the reservoir there (empty when
    unused); cv_n: n at the last reference refresh."""

    theta: torch.Tensor
    log_weights: torch.Tensor
    log_evidence: float
    n: int
    chunks: int
    rng: torch.Tensor
    cv_theta: torch.Tensor
    cv_grad: torch.Tensor
    cv_n: int = 0

    @property
    def particles(self) -> int:
        return int(self.theta.shape[0])

    @property
    def dim(self) -> int:
        return int(self.theta.shape[1])

    def ess(self) -> float:
        from service.sgais.weights import ess

        return ess(self.log_weights.numpy())

    def to_bytes(self) -> bytes:
        tensors = {
            "theta": self.theta, "log_weights": self.log_weights, "rng": self.rng,
            "cv_theta": self.cv_theta, "cv_grad": self.cv_grad,
        }
        header = {
            "log_evidence": repr(float(self.log_evidence)), "n": int(self.n), "chunks": int(self.chunks),
            "cv_n": int(self.cv_n), "tensors": [],
        }
        blobs = []
        for name, t in tensors.items():
            arr = t.detach().contiguous().numpy()
            header["tensors"].append([name, str(arr.dtype), list(arr.shape)])
            blobs.append(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
        head = json.dumps(header, separators=(",", ":")).encode()
        return MAGIC + struct.pack("<I", len(head)) + head + b"".join(blobs)

    @classmethod
    def from_bytes(cls, raw: bytes) -> "SGAISState":
        if not raw.startswith(MAGIC):
            raise ValueError("not a cusp SGAIS state")
        off = len(MAGIC)
        (hlen,) = struct.unpack_from("<I", raw, off)
        off += 4
        header = json.loads(raw[off : off + hlen])
        off += hlen
        tensors = {}
        for name, dtype, shape in header["tensors"]:
            dt = np.dtype(dtype).newbyteorder("<")
            count = int(np.prod(shape)) if shape else 1
            arr = np.frombuffer(raw, dtype=dt, count=count, offset=off).reshape(shape)
            off += count * dt.itemsize
            tensors[name] = torch.from_numpy(arr.astype(np.dtype(dtype), copy=True))
        if off != len(raw):
            raise ValueError("trailing bytes after SGAIS state")
        return cls(
            log_evidence=float(header["log_evidence"]), n=header["n"], chunks=header["chunks"],
            cv_n=header["cv_n"], **tensors,
        )
