"""Numerics of a low-precision first pass: its copies, its error bound, its products.

Pure torch, any device, no config.  An exact search decides every pair on float64 scores
(:mod:`dask_cosim.search_kernels`); a first pass in float16, bfloat16 or TF32 with float32
accumulation only has to find the *candidates*, and this module says how far its scores
can be from the float64 ones (docs/search-precision.md derives it).

Per side, :func:`lower` makes once, in float64 chunks:

- the copy ``low`` = round(sigma x), its rows padded with zeros to a multiple of 16
  values: sigma is a power of two per row that puts the row's largest value in
  [2^14, 2^15), so no finite input overflows or underflows float16 (a float16 or
  bfloat16 input keeps its exact values);
- ``weight`` w = fl32(1 / (sigma max(|x|, eps))); the low-precision score is
  s_hat = fl32(fl32(x_hat . y_hat) w_x w_y), the product accumulated in float32;
- three numbers per row, measured in float64 and rounded up to float32, with
  u = x / max(|x|, eps) the float64 unit row and v = x_hat w its copy:
  ``err`` = |v - u|, ``rho`` = |v|, ``nu`` = |u| (1; less for rows shorter than eps;
  0 for zero and invalid rows).

For every pair, |s_hat - cos| <= E = err_x rho_y + nu_x err_y + kappa rho_x rho_y + tau
(:func:`pair_bound`), with kappa = gamma_n(2^-23) (:func:`kappa`, the accumulation) and
tau = 2^-20 (the float32 operations of the comparison itself, and the float64 re-score).
The bound does not depend on torch's reduced-precision settings: on CUDA the products
run in the Triton kernel (float32 accumulators, no split-K); :func:`low_scores` (the CPU
path, used for testing) upcasts the copies to float32, where products of float16 or
bfloat16 values are exact, and multiplies in float64 when torch allows float32 products
to be less than IEEE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "FLOAT32_MATMUL",
    "KINDS",
    "PRECISIONS",
    "TAU",
    "U_ACC",
    "LowRows",
    "down32",
    "float32_matmul",
    "kappa",
    "kind_for",
    "low_scores",
    "lower",
    "pair_bound",
    "up32",
    "worst_case",
]

PRECISIONS = ("exact", "fp32", "fast")
KINDS = {"float16": torch.float16, "bfloat16": torch.bfloat16, "tf32": torch.float32}
# Unit roundoff of the float32 accumulation: tensor cores may truncate (round toward zero)
# where IEEE rounds to nearest, so 2^-23, not 2^-24.
U_ACC = 2.0**-23
# Absolute slack of the bound: the float32 arithmetic of the comparison itself (each of
# its few operations errs by at most 2^-24 of a value below 4) and the float64 re-score
# (D 2^-53) together stay under 2^-22.
TAU = 2.0**-20
# Each row's largest value lands in [2^14, 2^15): far from float16's overflow (65504) and
# 2^38 above its smallest subnormal.
_TOP_EXPONENT = 15
# The copy's rows are padded with zeros to a multiple of this many values: Triton moves
# 16 bytes a load only where a row's width (and start) is known to be a multiple of 16,
# and zeros add nothing to any product.
_ROW_MULTIPLE = 16
# Low 13 bits of a float32 significand: what TF32 drops.
_TF32_DROP = 0x1FFF


@dataclass
class LowRows:
    """One side's low-precision copy and the per-row numbers of the bound.

    ``low`` (N, W) float16 / bfloat16, or float32 holding TF32 values (``kind``): each
    row's D values then zeros up to W, the next multiple of 16;
    ``weight``, ``rho``, ``err``, ``nu`` and ``coef`` (= err + kappa rho, the factor the bound
    multiplies by the other row's rho) are (N,) float32; ``valid`` (N,) bool.  Invalid
    rows have a zero copy and zero numbers.
    """

    low: torch.Tensor
    weight: torch.Tensor
    rho: torch.Tensor
    err: torch.Tensor
    nu: torch.Tensor
    coef: torch.Tensor
    valid: torch.Tensor
    kind: str

    def __len__(self) -> int:
        return int(self.low.shape[0])

    @property
    def dim(self) -> int:
        """W: the copy's row width, zero padding included."""
        return int(self.low.shape[1])

    def rows(self, start: int, stop: int) -> LowRows:
        """Rows ``start:stop``, as views."""
        return self.take(slice(start, stop))

    def take(self, rows: torch.Tensor | slice) -> LowRows:
        """The rows at positions ``rows`` (int64, or a slice), in that order."""
        return LowRows(
            self.low[rows],
            self.weight[rows],
            self.rho[rows],
            self.err[rows],
            self.nu[rows],
            self.coef[rows],
            self.valid[rows],
            self.kind,
        )


def kind_for(dtype: torch.dtype, kind: str | None = None) -> str:
    """The copy's kind: ``kind`` when given; else the input's own 16-bit type (its copy
    is then exact), else float16 (the smaller rounding of the two 16-bit types)."""
    if kind is not None:
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}; use one of {sorted(KINDS)}")
        return kind
    return "bfloat16" if dtype == torch.bfloat16 else "float16"


def kappa(dim: int) -> float:
    """kappa: the accumulation term's factor, gamma_n(2^-23) = n u / (1 - n u) with
    n = D + ceil(D / 4) + 3.  Sequential IEEE summation needs n = D (Higham, section 3.1);
    tensor cores add blocks of b >= 4 products to the accumulator at once, aligned to
    the largest term and truncated, which costs up to b + 1 roundings per block (Fasi et
    al. 2021; Blanchard et al. 2020): D (1 + 1/4) for the whole product, plus the last
    partial block and the two float32 multiplications by the row weights."""
    n = dim + math.ceil(dim / 4) + 3
    return n * U_ACC / (1.0 - n * U_ACC)


def worst_case(dim: int, kind: str, *, truncating_copy: bool = False) -> float:
    """E for two unit rows whose copies err by a full half unit in each value (a whole
    unit with ``truncating_copy``, as hardware that truncates fp32 to TF32 would)."""
    bits = {"float16": 11, "bfloat16": 8, "tf32": 11}[kind]  # significand bits
    u = 2.0 ** -(bits - 1 if truncating_copy else bits)
    err = u + 2.0**-24  # the copy, and the float32 weight's rounding
    rho = 1.0 + err
    return err * rho + 1.0 * err + kappa(dim) * rho * rho + TAU


def up32(x: torch.Tensor) -> torch.Tensor:
    """float64 ``x`` as float32, rounded up (the nearest float32 >= x)."""
    y = x.to(torch.float32)
    above = torch.full_like(y, math.inf)
    return torch.where(y.to(x.dtype) < x, torch.nextafter(y, above), y)


def down32(x: torch.Tensor) -> torch.Tensor:
    """float64 ``x`` as float32, rounded down (the nearest float32 <= x)."""
    y = x.to(torch.float32)
    below = torch.full_like(y, -math.inf)
    return torch.where(y.to(x.dtype) > x, torch.nextafter(y, below), y)


def _to_kind(y: torch.Tensor, kind: str) -> torch.Tensor:
    if kind != "tf32":
        return y.to(KINDS[kind])
    # Round to nearest on the bit pattern, so that the tensor cores see values they
    # represent exactly, whether their own conversion rounds or truncates.
    bits = y.to(torch.float32).view(torch.int32)
    bits = (bits + (_TF32_DROP + 1) // 2) & ~_TF32_DROP
    return bits.view(torch.float32)


def _pow2(x: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """x 2^exponent (float64), exact barring underflow: in two halves, as 2^exponent
    alone may not be a float64 (the smallest subnormals need 2^1088)."""
    half = torch.div(exponent, 2, rounding_mode="floor")
    return torch.ldexp(torch.ldexp(x, half[:, None]), (exponent - half)[:, None])


def lower(
    raw: torch.Tensor,
    inv: torch.Tensor,
    scale: torch.Tensor,
    valid: torch.Tensor,
    kind: str | None = None,
    *,
    chunk_bytes: int = 64 * 2**20,
) -> LowRows:
    """The low-precision copy of (N, D) rows and its numbers (see the module docstring).

    ``raw``, ``inv``, ``scale`` and ``valid`` as in
    :class:`~dask_cosim.search_kernels.Prepared`: the float64 unit row is
    ``(raw * inv) * scale``, exactly as the exact re-score computes it.  ``kind``:
    "float16", "bfloat16" or "tf32" (default: :func:`kind_for`).  Works in float64
    chunks of at most about ``chunk_bytes``.

    A float16 ``raw`` with unit column stride and D a multiple of 16 is its own float16
    copy (sigma = 1, no memory): products of float16 values are exact in float32
    (subnormals included) and D of them, at most 65504^2 each, cannot overflow its sums.
    Its invalid rows keep whatever they hold; the kernels never use them.
    """
    kind = kind_for(raw.dtype, kind)
    n, d = raw.shape
    f64, dev = torch.float64, raw.device
    width = -(-d // _ROW_MULTIPLE) * _ROW_MULTIPLE
    reuse = (
        kind == "float16" and raw.dtype == torch.float16 and width == d
        and (n < 2 or raw.stride(1) == 1)
    )  # fmt: skip
    low = raw if reuse else torch.zeros((n, width), dtype=KINDS[kind], device=dev)
    weight, rho, err, nu = (torch.zeros(n, dtype=torch.float32, device=dev) for _ in range(4))
    step = max(1, chunk_bytes // max(1, 40 * d))
    for s in range(0, n, step):
        e = min(n, s + step)
        ok = valid[s:e]
        x = torch.where(ok[:, None], raw[s:e].to(f64), torch.zeros((), dtype=f64, device=dev))
        u = (x * inv[s:e, None]) * scale[s:e, None]
        top = x.abs().amax(dim=1) if d else torch.zeros(e - s, dtype=f64, device=dev)
        _, top_exp = torch.frexp(top)  # top = f 2^top_exp, f in [0.5, 1)
        shift = _TOP_EXPONENT - top_exp.to(torch.int64)
        if reuse:
            shift.zero_()
            copy = x
        else:
            copy = _to_kind(_pow2(x, shift), kind)
            low[s:e, :d] = copy
        # w = (inv scale) / sigma: inv 2^top_exp is in (1, 2], so no step overflows.
        w64 = _pow2((inv[s:e] * scale[s:e])[:, None], -shift).squeeze(1)
        w = torch.where(ok & torch.isfinite(w64), w64, torch.zeros_like(w64)).to(torch.float32)
        v = copy.to(f64) * w.to(f64)[:, None]
        weight[s:e] = w
        rho[s:e] = up32(torch.linalg.vector_norm(v, dim=1))
        err[s:e] = up32(torch.linalg.vector_norm(v - u, dim=1))
        nu[s:e] = up32(torch.linalg.vector_norm(u, dim=1))
    coef = up32(err.to(f64) + kappa(d) * rho.to(f64))
    return LowRows(low, weight, rho, err, nu, coef, valid.clone(), kind)


def pair_bound(a: LowRows, i: torch.Tensor, b: LowRows, j: torch.Tensor) -> torch.Tensor:
    """E (float64) for the pairs (a[i[t]], b[j[t]]): |s_hat - cos| <= E."""
    f64 = torch.float64
    return a.coef[i].to(f64) * b.rho[j].to(f64) + a.nu[i].to(f64) * b.err[j].to(f64) + TAU


def bound_matrix(a: LowRows, b: LowRows) -> torch.Tensor:
    """E (float32) for every pair, as the kernel computes it."""
    return a.coef[:, None] * b.rho[None, :] + a.nu[:, None] * b.err[None, :] + TAU


# What torch may round float32 matrix products' inputs to, least rounding first.
FLOAT32_MATMUL = ("ieee", "tf32", "bf16")
_LEGACY_MATMUL = {"highest": "ieee", "high": "tf32", "medium": "bf16"}


def float32_matmul(device_type: str) -> str:
    """How torch's float32 matrix products on ``device_type`` ("cuda", else the CPU's
    oneDNN) treat their inputs as torch is set now: one of :data:`FLOAT32_MATMUL`, the
    most rounding any of its settings allows.

    torch 2.9 added per-backend ``fp32_precision`` settings ("none" inherits: the
    operation's, then the backend's, then ``torch.backends.fp32_precision``), and
    ``torch.get_float32_matmul_precision`` raises once they disagree with it: both are
    read, that one only where it answers, so torch before 2.9 and either way of setting
    it give the same answer."""
    backend = torch.backends.cuda if device_type == "cuda" else torch.backends.mkldnn
    kinds = []
    for owner in (getattr(backend, "matmul", None), backend, torch.backends):
        setting = getattr(owner, "fp32_precision", None)
        if setting in FLOAT32_MATMUL:
            kinds.append(setting)
            break
    try:
        kinds.append(_LEGACY_MATMUL.get(torch.get_float32_matmul_precision(), "bf16"))
    except RuntimeError:  # the per-backend settings were set: they are the truth
        pass
    return max(kinds, key=FLOAT32_MATMUL.index, default="ieee")


def _ieee_float32(device: torch.device) -> bool:
    """Whether float32 products on ``device`` are IEEE (not TF32 or bfloat16 inside)."""
    return float32_matmul(device.type) == "ieee"


def low_scores(a: LowRows, b: LowRows) -> torch.Tensor:
    """s_hat (float32) for every pair of rows of ``a`` and ``b``, with the kernel's
    arithmetic: exact products of the copies, float32 sums (float64 where torch would
    not keep float32 products IEEE), then the two weights in float32."""
    acc = torch.float32 if _ieee_float32(a.low.device) else torch.float64
    p = torch.mm(a.low.to(acc), b.low.to(acc).T).to(torch.float32)
    return p * a.weight[:, None] * b.weight[None, :]
