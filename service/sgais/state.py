"""Sampler state and its exact byte serialisation.

``to_bytes``/``from_bytes`` round-trip bit for bit (raw little-endian tensor bytes plus a
JSON header whose floats are written with ``repr``), so a worker that reloads a state
continues with exactly the numbers an uninterrupted run produces.
"""

from __future__ import annotations

import json
import math
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
    unused); cv_n: n at the last reference refresh; ref_post [P] / ref_log_evidence: the exact
    posterior's parameters and log-evidence kept beside the particles for a conjugate model run
    with SGAIS (empty / 0.0 otherwise), the reference its estimate is checked against;
    mode_gap / mode_limit: the last check of the particles against the model's dominant mode
    (``Model.mode_gap``, nats) and the gap beyond which they are stuck in a poor mode; prior_loss: the
    log-likelihood that check found the particles give up for their prior (``ModeFit.prior_loss``,
    nats; the ``prior_conflict`` warning beyond ``mode_limit``); jumps_left:
    chunks that still get mode jumps at every step, or (negative) chunks of a jump cooldown
    (``Sampler._jumps_left``; a state saved before jumps: 0); surprise_n: n after the chunk that
    last began a surprise's extra mode checks (``Sampler._check_modes``; 0: none).

    A model with a warm-up frame (``gmm:warmup=W``, ``Sampler.update``): frame [2, d] (centre and
    scale per column; empty until fixed), buffer [k, d] (the warm-up's raw rows while fewer than W
    have come; empty otherwise), warm (rows conditioned on and not scored: W for the stream's first
    regime, 0 for a restart, which keeps the frame it started with) and warm_log_z (the warm-up
    rows' own log-evidence in the frame's units, which ``log_evidence`` leaves out: the particles'
    fresh estimates of all the rows need it)."""

    theta: torch.Tensor
    log_weights: torch.Tensor
    log_evidence: float
    n: int
    chunks: int
    rng: torch.Tensor
    cv_theta: torch.Tensor
    cv_grad: torch.Tensor
    cv_n: int = 0
    ref_post: torch.Tensor = torch.zeros(0, dtype=torch.float64)
    ref_log_evidence: float = 0.0
    mode_gap: float = 0.0
    mode_limit: float = math.inf
    prior_loss: float = 0.0
    jumps_left: int = 0
    surprise_n: int = 0
    frame: torch.Tensor = torch.zeros(0, dtype=torch.float64)
    buffer: torch.Tensor = torch.zeros(0, dtype=torch.float64)
    warm: int = 0
    warm_log_z: float = 0.0

    @property
    def pending(self) -> int:
        """Rows seen but not yet in the history (a warm-up waiting for its frame): the reservoir holds
        a sample of the other ``n - pending``."""
        return int(self.buffer.shape[0]) if self.buffer.dim() == 2 else 0

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
            "cv_theta": self.cv_theta, "cv_grad": self.cv_grad, "ref_post": self.ref_post,
            # (a frame's tensors only where there is one: states without stay as they were written)
            **({"frame": self.frame} if self.frame.numel() else {}),
            **({"buffer": self.buffer} if self.buffer.numel() else {}),
        }
        header = {"log_evidence": repr(float(self.log_evidence)), "n": int(self.n), "chunks": int(self.chunks),
                  "cv_n": int(self.cv_n), "ref_log_evidence": repr(float(self.ref_log_evidence)),
                  "mode": [repr(float(self.mode_gap)), repr(float(self.mode_limit))], "jumps_left": int(self.jumps_left),
                  **({"surprise_n": int(self.surprise_n)} if self.surprise_n else {}),
                  **({"prior_loss": repr(float(self.prior_loss))} if self.prior_loss else {}),
                  **({"warm": [int(self.warm), repr(float(self.warm_log_z))]} if self.warm else {})}
        return encode(MAGIC, header, tensors)

    @classmethod
    def from_bytes(cls, raw: bytes) -> "SGAISState":
        header, tensors = decode(MAGIC, raw)
        return cls(
            log_evidence=float(header["log_evidence"]), n=header["n"], chunks=header["chunks"],
            cv_n=header["cv_n"], ref_log_evidence=float(header.get("ref_log_evidence", "0.0")),
            mode_gap=float(header.get("mode", ["0.0", "inf"])[0]), mode_limit=float(header.get("mode", ["0.0", "inf"])[1]),
            jumps_left=int(header.get("jumps_left", 0)), surprise_n=int(header.get("surprise_n", 0)),
            prior_loss=float(header.get("prior_loss", "0.0")),
            warm=int(header.get("warm", [0, "0.0"])[0]), warm_log_z=float(header.get("warm", [0, "0.0"])[1]),
            **tensors,
        )


def encode(magic: bytes, header: dict, tensors: dict[str, torch.Tensor]) -> bytes:
    """``magic``, a JSON header (floats as ``repr`` strings, so they round-trip) naming each
    tensor's dtype and shape, then the tensors' raw little-endian bytes in that order."""
    header = {**header, "tensors": []}
    blobs = []
    for name, t in tensors.items():
        arr = t.detach().contiguous().numpy()
        header["tensors"].append([name, str(arr.dtype), list(arr.shape)])
        blobs.append(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
    head = json.dumps(header, separators=(",", ":")).encode()
    return magic + struct.pack("<I", len(head)) + head + b"".join(blobs)


def decode(magic: bytes, raw: bytes) -> tuple[dict, dict[str, torch.Tensor]]:
    """``encode``'s inverse: (header, tensors)."""
    if not raw.startswith(magic):
        raise ValueError(f"not a {magic.decode().strip()} state")
    off = len(magic)
    (hlen,) = struct.unpack_from("<I", raw, off)
    off += 4
    header = json.loads(raw[off : off + hlen])
    off += hlen
    tensors = {}
    for name, dtype, shape in header.pop("tensors"):
        dt = np.dtype(dtype).newbyteorder("<")
        count = int(np.prod(shape)) if shape else 1
        arr = np.frombuffer(raw, dtype=dt, count=count, offset=off).reshape(shape)
        off += count * dt.itemsize
        tensors[name] = torch.from_numpy(arr.astype(np.dtype(dtype), copy=True))
    if off != len(raw):
        raise ValueError("trailing bytes after the state")
    return header, tensors


def load_state(raw: bytes):
    """A saved sampler state of either kind (``SGAISState`` or ``ExactState``), by its magic."""
    from service.sgais.exact import ExactState

    return ExactState.from_bytes(raw) if raw.startswith(ExactState.PREFIX) else SGAISState.from_bytes(raw)
