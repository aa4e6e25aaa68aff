"""Error-compensating INT4 weight rounding (GPTQ: Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for
Generative Pre-trained Transformers", arXiv:2210.17323), one of the roundings :mod:`trt_bridge.calibrate.awq` judges.

Rounding each weight to its nearest code (RTN) leaves every row's error where it falls. GPTQ rounds the rows of
``W`` ([K, N], K the reduction axis) one at a time and moves each row's error onto the rows not yet rounded, in the
proportions that cancel it best on the calibration inputs: with ``H = XᵀX`` (damped), row ``k``'s error ``e`` changes
row ``j > k`` by ``−e · U[k, j] / U[k, k]``, ``U`` the upper Cholesky factor of ``H⁻¹`` (``H⁻¹ = UᵀU``), so that
``||X·(W − Q(W))||²`` is (greedily) least::

    Before:  W ─ round each block of B rows to its own scale             (error: Σ ||X_b · (W_b − Q(W_b))||²)
    After:   for each block of B rows: its scale from the rows as updated so far (the same scale rule as RTN);
             each row rounded, its error spread over the rows after it; the block's errors moved on to the
             remaining blocks in one product

The codes and scales are of the same format and layout as plain rounding's (INT4 blocks along K), so lowering writes
them as it writes any INT4 weight; only which code each weight gets changes. Input channels never seen non-zero get
a unit diagonal (their rows round alone); a Gram matrix that stays singular after damping gives None (the caller
rounds plainly).
"""

from __future__ import annotations

import numpy as np

from trt_bridge.errors import InternalError
from trt_bridge.formats import FP4, INT4, QuantFormat, nvfp4_fitted, nvfp4_global, nvfp4_scales
from trt_bridge.lift.weights import block_codes, fp4_block_scales, quantize_blocks

#: the damping added to H's diagonal, as a share of its mean (GPTQ's 1 %)
DAMP = 0.01
#: how many times the damping is multiplied by 10 before a Gram matrix is given up as singular
RETRIES = 4


def inverse_factor(gram: np.ndarray) -> np.ndarray | None:
    """The upper Cholesky factor ``U`` of ``(H + λI)⁻¹`` (``UᵀU``), ``H`` = ``gram`` with unseen channels given a unit
    diagonal and ``λ`` = :data:`DAMP` of its mean diagonal; None when it stays singular."""
    h = np.array(gram, np.float64)
    dead = np.diag(h) <= 0
    h[dead, :] = 0.0
    h[:, dead] = 0.0
    h[dead, dead] = 1.0
    damp = DAMP * float(np.mean(np.diag(h)))
    for _ in range(RETRIES):
        try:
            lower = np.linalg.cholesky(h + damp * np.eye(len(h)))
            inverse = np.linalg.inv(lower)
            return np.linalg.cholesky(inverse.T @ inverse).T
        except np.linalg.LinAlgError:
            damp *= 10.0
    return None


def gptq_round(weight: np.ndarray, gram: np.ndarray, block: int, ftype=np.float32, fmt: QuantFormat = INT4
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """``fmt`` (INT4, or FP4 with NVFP4's two-level scales) codes [K, N] and block scales [K / block, N] of ``weight``
    [K, N] (blocks of ``block`` rows along K) rounded by GPTQ on ``gram`` (``XᵀX`` of its input, [K, K]); None when
    the Gram matrix is singular."""
    u = inverse_factor(gram)
    if u is None:
        return None
    w = np.array(weight, np.float64)
    k = w.shape[0]
    scale_of = _scale_rule(w, block, ftype, fmt)
    codes = np.empty(w.shape, fmt.dtype)
    scales = []
    for start in range(0, k, block):
        end = min(k, start + block)
        scale = scale_of(w[start:end])
        scales.append(scale)
        step = scale[0].astype(np.float64)
        errors = np.empty((end - start, w.shape[1]))
        for row in range(start, end):
            codes[row] = block_codes(w[row], step, fmt)
            error = (w[row] - codes[row].astype(np.float64) * step) / u[row, row]
            w[row + 1:end] -= np.outer(u[row, row + 1:end], error)
            errors[row - start] = error
        w[end:] -= u[start:end, end:].T @ errors
    return codes, np.concatenate(scales)


def _scale_rule(weight: np.ndarray, block: int, ftype, fmt: QuantFormat):
    """The scale plain rounding gives a block of rows ([rows, N] → [1, N]): INT4's searched scale; FP4's NVFP4 scale
    under the global scale of the whole ``weight`` as first given (one global scale for all its blocks, as lowering
    writes it)."""
    if fmt is INT4:
        return lambda rows: quantize_blocks(rows, 0, block, ftype, INT4)[1]
    if fmt is not FP4:
        raise InternalError(f"GPTQ rounds INT4 and FP4 weights, not {fmt.name}")
    g = nvfp4_global(nvfp4_scales(fp4_block_scales(weight, block)))  # as nvfp4_fitted takes it
    return lambda rows: nvfp4_fitted(rows[None], fp4_block_scales(rows, block), g)

