"""Exact top-k for a batch of queries from one low-precision pass, proven by an error bound.

An exact search over n vectors is a scan of the whole matrix. In fp32 on one CPU core a
batch of s queries is compute-bound (issue 31: 1M x 576, 1 query 0.18 s, 3 queries 0.47 s),
so a RaLMSpec verification of s steps cost ~2.6 searches instead of the paper's ~1. Here the
scan runs over a low-precision copy — int8 rows through fbgemm (a quarter of the bytes; each
query as two 7-bit parts, its steps and their remainder on a 126x finer grid, in one product: no
int16 saturation on AVX2), or bf16 for AMX hosts — and every row whose
approximate score lies within the precision's **proven** error bound of the k-th best is a
candidate. Callers re-score the candidates with their canonical fp32 function, so the result
is the exact fp32 top-k (ids, scores, tie-breaks), whatever the precision or batch size.

The bound, for a row x with low-precision copy x̂ (r = ||x - x̂||) and query q with its
grid value q̂ (δ = ||q - q̂||), approximate product a of x̂·q̂:

    |x·q - a| <= ||x||·δ + r·||q̂|| + c_lp·(||x|| + r)·||q̂||         (c_lp: the kernel's own rounding)
    |canonical fp32 x·q - x·q| <= γ_d·||x||·||q||                     (any summation order)

and for squared L2 (canonical: the fp32 sum of squared fp32 differences, within (γ_d+3u)·D of
the true D) the same through D = ||x||² - 2x·q + ||q||². Each bound is a sum of per-row
statistics (||x||, r, ||x||²) times per-query coefficients, so a batch's bounds are one small
matrix product. A row is dropped only if its upper bound is below the k-th largest lower
bound: then k rows are strictly better, whatever the ties.

Example usage::

    scan = LowPrecisionScan(vectors, precision="int8")
    rows = scan.candidates(query_vectors, k=20, metric="ip")  # per query: sorted row ids ⊇ exact top-20
"""
from __future__ import annotations

import threading
import warnings

import numpy as np

PRECISIONS = ("int8", "bf16", "fp32")
BLOCK_ROWS = 65536  # rows per packed int8 weight / per matrix product
CHUNK = 64  # rows per running maximum (a cheap lower bound of the k-th best)
U32 = 2.0 ** -24  # unit roundoff of float32
INT8_LEVELS = 127  # weights in [-127, 127]
QUERY_LEVELS = 63  # queries in [-63, 63] + zero point 64: uint8 <= 127, so u8*s8 pairs fit int16
QUERY_ZERO_POINT = 64
SAFETY = 1.0 + 1e-4  # covers the rounding of the bound's own float32 arithmetic


def gamma(d: int) -> float:
    """Higham's γ_d: the relative error bound of a float32 sum of d products, any order."""
    return d * U32 / (1.0 - d * U32)


def _kernel_rounding(precision: str, d: int) -> float:
    """c_lp: |a - x̂·q̂| <= c_lp·||x̂||·||q̂|| for the kernel's own arithmetic."""
    if precision == "int8":  # exact int32 accumulation, then float32 scalings (weight, query)
        return 8 * U32
    if precision == "bf16":  # float32 accumulation, result rounded to bf16
        return 2.0 ** -8 + 1.01 * gamma(d)
    return 1.01 * gamma(d)  # float32 GEMM


class LowPrecisionScan:
    """A low-precision copy of a float32 matrix and the per-row statistics of its bound.

    ``matrix`` may be memory-mapped: it is read block by block once, here. Thread-safe.
    """

    def __init__(self, matrix: np.ndarray, precision: str = "int8", block_rows: int = BLOCK_ROWS):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        import torch  # noqa: F401  (the kernels)
        self.precision, self.block_rows = precision, block_rows
        self.n, self.dim = matrix.shape
        self.blocks: list = []
        stats = np.ones((self.n, 4), dtype=np.float64)  # ||x||, r, ||x||^2, 1 (rounded up below)
        for lo in range(0, self.n, block_rows):
            block = np.asarray(matrix[lo:lo + block_rows], dtype=np.float32)
            low, approx = self._quantise_rows(block)
            self.blocks.append(low)
            exact = block.astype(np.float64)
            stats[lo:lo + len(block), 0] = np.sqrt(np.einsum("ij,ij->i", exact, exact))
            resid = exact - approx
            stats[lo:lo + len(block), 1] = np.sqrt(np.einsum("ij,ij->i", resid, resid))
        stats[:, 2] = stats[:, 0] ** 2
        self.sq_norms = stats[:, 2].astype(np.float32)  # nearest float32: h's ||x||², within u
        # float32 copies rounded up: the bound only grows
        self.row_stats = (stats * (1 + 1e-6)).astype(np.float32)
        self.stat_max = self.row_stats.max(axis=0).astype(np.float64) if self.n else np.zeros(4)
        self._lock = threading.Lock()  # fbgemm packed weights are not documented re-entrant

    # -- the low-precision copy -------------------------------------------------------------
    def _quantise_rows(self, block: np.ndarray):
        """(kernel operand, its exact value as float64) for one block of rows."""
        import torch
        if self.precision == "fp32":
            return torch.from_numpy(np.array(block, dtype=np.float32)), block.astype(np.float64)
        if self.precision == "bf16":
            low = torch.from_numpy(np.array(block, dtype=np.float32)).to(torch.bfloat16)
            return low, low.to(torch.float64).numpy()
        peak = np.abs(block).max(axis=1)
        scale = np.where(peak > 0, peak / INT8_LEVELS, 1.0).astype(np.float32)
        q = np.clip(np.rint(block / scale[:, None]), -INT8_LEVELS, INT8_LEVELS).astype(np.int8)
        with warnings.catch_warnings():  # quantized tensors are deprecated, still in torch 2.13 (the pin)
            warnings.simplefilter("ignore", UserWarning)
            weight = torch._make_per_channel_quantized_tensor(
                torch.from_numpy(q), torch.from_numpy(scale.astype(np.float64)),
                torch.zeros(len(q), dtype=torch.long), 0)
        packed = torch.ops.quantized.linear_prepack(weight, None)
        return packed, q.astype(np.float64) * scale.astype(np.float64)[:, None]

    def _quantise_queries(self, queries: np.ndarray):
        """(kernel operand, grid values q̂ as float64, per-query output scales [queries, parts]
        or None, the norm the kernel's rounding scales with: Σ over parts of ||part||)."""
        import torch
        if self.precision == "fp32":
            q64 = queries.astype(np.float64)
            return torch.from_numpy(queries), q64, None, np.linalg.norm(q64, axis=1)
        if self.precision == "bf16":
            low = torch.from_numpy(queries).to(torch.bfloat16)
            q_hat = low.to(torch.float64).numpy()
            return low, q_hat, None, np.linalg.norm(q_hat, axis=1)
        # One grid per query (fbgemm quantises the whole input with one scale): integer steps in
        # [-63, 63] go in with scale 1, and each output row is scaled by its query's step. Two
        # parts: the steps, then the remainder on a grid 126x finer, as two rows of the same
        # product (the scan reads each weight once either way). A 7-bit query alone leaves
        # ||x||·||q - q̂|| as the largest term of the bound: on KNN-LM states (||x|| ~ 45, a few
        # outlier dimensions set the step) it admitted 30k-200k candidates of 5M.
        q64 = queries.astype(np.float64)
        peak = np.abs(q64).max(axis=1)
        coarse = np.where(peak > 0, peak / QUERY_LEVELS, 1.0).astype(np.float32).astype(np.float64)
        fine = (coarse / (2 * QUERY_LEVELS)).astype(np.float32).astype(np.float64)
        steps = np.clip(np.rint(q64 / coarse[:, None]), -QUERY_LEVELS, QUERY_LEVELS)
        rest = np.clip(np.rint((q64 - steps * coarse[:, None]) / fine[:, None]), -QUERY_LEVELS, QUERY_LEVELS)
        parts = np.stack([steps * coarse[:, None], rest * fine[:, None]])  # exact in float64
        operand = torch.from_numpy(np.concatenate([steps, rest]).astype(np.float32))
        scales = np.stack([coarse, fine], axis=1)
        return operand, parts.sum(axis=0), scales, np.linalg.norm(parts, axis=2).sum(axis=0)

    def _products(self, block, operand, q_scale):
        """The block's approximate x̂·q̂, as float32 [queries, rows]."""
        import torch
        if self.precision == "int8":
            out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
                operand, 1.0, QUERY_ZERO_POINT, block).numpy()
            nq = len(q_scale)  # rows: every query's steps, then every query's remainder
            scales = q_scale.astype(np.float32)
            return out[:nq] * scales[:, :1] + out[nq:] * scales[:, 1:]
        else:
            out = torch.matmul(operand, block.T).to(torch.float32)
        return out.numpy()

    # -- search ---------------------------------------------------------------------------------
    def candidates(self, queries: np.ndarray, k: int, metric: str = "ip") -> list[np.ndarray]:
        """Per query, sorted row ids that contain every row of the exact top-k under the
        canonical fp32 score (inner product, higher first; squared L2, lower first)."""
        if metric not in ("ip", "l2"):
            raise ValueError(f"metric must be ip or l2, got {metric!r}")
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        if queries.shape[1] != self.dim:
            raise ValueError(f"queries have dimension {queries.shape[1]}, the matrix {self.dim}")
        nq, k = len(queries), min(k, self.n)
        if nq == 0 or k <= 0:
            return [np.zeros(0, dtype=np.int64) for _ in range(nq)]
        operand, q_hat, q_scale, kernel_norm = self._quantise_queries(queries)
        coeffs, q_sq = self._coefficients(queries, q_hat, kernel_norm, metric)
        # pass 1: approximate "higher is better" values h and chunk maxima
        h = np.empty((nq, self.n), dtype=np.float32)
        with self._lock:
            for b, block in enumerate(self.blocks):
                lo = b * self.block_rows
                a = self._products(block, operand, q_scale)
                if metric == "ip":
                    h[:, lo:lo + a.shape[1]] = a
                else:  # -(||x||^2 - 2a + ||q||^2)
                    h[:, lo:lo + a.shape[1]] = 2.0 * a - self.sq_norms[lo:lo + a.shape[1]]
        if metric == "l2":
            h -= q_sq[:, None]
        starts = np.arange(0, self.n, CHUNK)
        chunk_max = np.maximum.reduceat(h, starts, axis=1)
        kk = min(k, chunk_max.shape[1])
        # k chunks reach their maximum: a lower bound of the k-th best approximate value
        floor = -np.partition(-chunk_max, kk - 1, axis=1)[:, kk - 1] if kk == k else h.min(axis=1)
        e_max = (self.stat_max @ coeffs) * SAFETY
        out = []
        for i in range(nq):
            rows = np.flatnonzero(h[i] >= floor[i] - 2.0 * e_max[i])  # every row whose upper bound can reach
            hv = h[i, rows].astype(np.float64)
            e = (self.row_stats[rows].astype(np.float64) @ coeffs[:, i]) * SAFETY
            lower = hv - e
            kth_lower = np.partition(lower, len(lower) - k)[len(lower) - k]
            out.append(rows[hv + e >= kth_lower].astype(np.int64))
        return out

    def _coefficients(self, queries: np.ndarray, q_hat: np.ndarray, kernel_norm: np.ndarray, metric: str):
        """[4, queries] coefficients of (||x||, r, ||x||², 1) in each query's error bound.
        ``kernel_norm`` (>= ||q̂||): what the kernel's rounding and a's magnitude scale with —
        the sum of the parts' norms when q̂ goes in as parts whose products are summed."""
        q64 = queries.astype(np.float64)
        q_norm = np.linalg.norm(q64, axis=1)
        qh_norm = np.linalg.norm(q_hat, axis=1)
        kn = kernel_norm
        delta = np.linalg.norm(q64 - q_hat, axis=1)
        c_lp = _kernel_rounding(self.precision, self.dim)
        g = gamma(self.dim)
        q_sq = (q_norm ** 2).astype(np.float32)
        # |x·q - a| <= ||x||·δ + r·||q̂|| + c_lp·(||x|| + r)·kn   (||x̂|| <= ||x|| + r)
        ip_x, ip_r = delta + c_lp * kn, qh_norm + c_lp * kn
        # + float32 rounding of a itself and of the sum of the parts' products (|a| <= (||x|| + r)·kn·(1 + c_lp))
        own = 3 * U32 * kn
        if metric == "ip":
            coeffs = np.stack([ip_x + g * q_norm + own, ip_r + own, np.zeros_like(q_norm), np.zeros_like(q_norm)])
            return coeffs, q_sq
        # L2: h = 2a - ||x||² - ||q||², |h + D| <= 2|x·q - a| + float32 rounding of h;
        # canonical D within (γ_d + 3u)·D <= (γ_d + 3u)(||x||² + ||q||² + 2||x||·||q||)
        gl = g + 3 * U32
        rnd = 4 * U32  # the three float32 operations forming h, relative to their magnitudes
        lin_x = 2 * (ip_x + own) + (gl + rnd) * 2 * q_norm + rnd * 2 * kn
        lin_r = 2 * (ip_r + own) + rnd * 2 * kn
        sq = np.full_like(q_norm, gl + rnd)
        const = (gl + rnd) * q_norm ** 2
        return np.stack([lin_x, lin_r, sq, const]), q_sq


class LazyScan:
    """A LowPrecisionScan built on first use (seconds per million rows), once per process.

    ``precision`` None means no scan: callers use their FAISS index instead."""

    def __init__(self, matrix: np.ndarray, precision: str | None):
        if precision is not None and precision not in PRECISIONS:
            raise ValueError(f"scan precision must be one of {PRECISIONS} or None, got {precision!r}")
        self.matrix, self.precision = matrix, precision
        self._scan: LowPrecisionScan | None = None
        self._lock = threading.Lock()

    def get(self) -> LowPrecisionScan:
        with self._lock:
            if self._scan is None:
                self._scan = LowPrecisionScan(self.matrix, self.precision)
            return self._scan
