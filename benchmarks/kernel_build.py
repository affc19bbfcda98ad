"""The Triton kernels built for a CUDA GPU on a machine without one, as dask_cosim
launches them: what the compiled code holds, before a GPU run times it.

    python -m benchmarks.kernel_build                 # sm_90 (H100, H200)
    python -m benchmarks.kernel_build --arch 80       # sm_80 (A100)

Each launch variant (the search kernel per low-precision kind, threshold or top-k, D; the
pairwise kernel per dtype) is captured from the real call on CPU tensors (the kernel is
not run), specialised as Triton's JIT would specialise those arguments, and compiled by
Triton's own compiler and the ptxas it ships.  Per variant the table shows registers
per thread, bytes spilled to local memory, shared memory, and for the search kernel:
whether the product runs on tensor cores (wgmma on sm_90, mma on sm_80) and the
instructions of the inner product's loop and of the common path of a tile's epilogue
(from the loop's end to the branch a tile takes only when a pair may pass), with the
local-memory accesses and barriers of each.

These are properties of the code, not timings: fewer epilogue instructions and no
local memory in the loop are what a GPU run's timings should then confirm
(``benchmarks/search_gpu.py``).  Needs triton with its NVIDIA backend (the Linux x86_64
wheels ship it); ``--out DIR`` writes ``DIR/<name>.json``.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import click
import torch

from benchmarks import harness as h

Launch = tuple[Any, tuple[Any, ...], dict[str, Any]]


class _Recorder:
    """Stands in for a ``@triton.jit`` function: ``kernel[grid](*args, **kw)`` records the
    call instead of launching it."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.calls: list[Launch] = []

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kw: self.calls.append((self.fn, args, kw))


@contextmanager
def recording(module: Any, name: str) -> Iterator[_Recorder]:
    """Within the block, ``module.name`` (a Triton kernel) records its launches."""
    recorder = _Recorder(getattr(module, name))
    with mock.patch.object(module, name, recorder):
        yield recorder


def compile_launch(launch: Launch, arch: int) -> Any:
    """The kernel Triton's JIT would compile for ``launch``'s arguments on an sm_``arch``
    GPU (the same specialisation of integers and pointer alignment), compiled here."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn, args, kw = launch
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kw)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, kw, bound, specialization, options
    )
    return triton.compile(
        ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__
    )


def _tool(name: str) -> str:
    from triton import knobs

    return getattr(knobs.nvidia, name).path


def resources(kernel: Any, arch: int) -> dict[str, Any]:
    """Registers, spilled bytes (ptxas -v) and shared memory of a compiled kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp, "k.ptx")
        ptx.write_text(kernel.asm["ptx"])
        ptxas = _tool("ptxas_blackwell" if arch >= 90 else "ptxas")
        run = subprocess.run(
            [ptxas, "-v", f"--gpu-name=sm_{arch}{'a' if arch == 90 else ''}", str(ptx),
             "-o", str(Path(tmp, "k.cubin"))],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    regs = re.search(r"Used (\d+) registers", run.stderr)
    spill = re.search(r"(\d+) bytes spill stores", run.stderr)
    return {
        "registers": int(regs.group(1)) if regs else None,
        "spill_bytes": int(spill.group(1)) if spill else 0,
        "shared_bytes": int(kernel.metadata.shared),
    }


def sass(kernel: Any) -> list[tuple[int, str]]:
    """(address, instruction) of the compiled kernel's machine code."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp, "k.cubin")
        cubin.write_bytes(kernel.asm["cubin"])
        text = subprocess.run(
            [_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True, check=True
        ).stdout
    out = []
    for line in text.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2)))
    return out


def _counts(ops: list[str]) -> dict[str, int]:
    def n(pattern: str) -> int:
        return sum(1 for o in ops if re.search(pattern, o))

    return {
        "instructions": len(ops),
        "local_memory": n(r"\b(LDL|STL)\b"),
        "barriers": n(r"\bBAR\.SYNC\b"),
    }


def search_structure(code: list[tuple[int, str]]) -> dict[str, Any]:
    """The inner product's loop (the innermost backward branch around the first tensor
    core instruction) and the common path of the epilogue that follows it: up to the
    branch that jumps over the candidates' reservation (the first 64-bit atomic add),
    which a tile takes when no pair of it may pass (top-k: the floor's raise included)."""
    addrs = [a for a, _ in code]
    ops = [o for _, o in code]
    mma = [i for i, o in enumerate(ops) if re.search(r"\b(HGMMA|HMMA)\.", o)]
    if not mma:
        return {"tensor_cores": False}

    def branch(i: int) -> int | None:
        m = re.search(r"\bBRA (0x[0-9a-f]+)", ops[i])
        return int(m.group(1), 16) if m else None

    end = next(
        (i for i in range(mma[-1], len(ops)) if (branch(i) or 1 << 62) <= addrs[mma[0]]), None
    )
    if end is None:
        return {"tensor_cores": True}
    start = addrs.index(branch(end))
    atom = next(
        (i for i in range(end, len(ops)) if re.search(r"ATOMG\.E\.ADD\.64", ops[i])), len(ops) - 1
    )
    skip = next(
        (i for i in range(end + 1, atom)
         if ops[i].startswith("@") and (branch(i) or 0) > addrs[atom]),
        atom,
    )  # fmt: skip
    return {
        "tensor_cores": True,
        "loop": _counts(ops[start : end + 1]) | {"mma": sum(1 for i in mma if i <= end)},
        "epilogue": _counts(ops[end + 1 : skip + 1]),
    }


# --------------------------------------------------------------------------- variants


def search_launch(kind: str, dim: int, k: int = 0, mode: str | None = None) -> Launch:
    """The search kernel's launch for rows of ``dim`` values searched at ``kind``, top-k
    (``k`` > 0) or threshold, with the blocks it takes on a GPU."""
    from dask_cosim import _search_triton as st
    from dask_cosim import search_kernels as sk
    from dask_cosim import search_precision as sp

    torch.manual_seed(0)
    n = 256
    x = torch.randn(n, dim, dtype=torch.float16 if kind == "float16" else torch.float32)
    p = sk.prepare(x, None, eps=1e-8)
    low = sp.lower(p.raw, p.inv, p.scale, p.valid, kind)
    config = st.with_splits(st.config_for(kind, k), 16)
    bar = torch.full((n,), float("-inf") if k else 0.9)
    with recording(st, "_search_tiles") as rec:
        st.search_candidates(low, low, bar, k=k, mode=mode, config=config)
    return rec.calls[0]


def pairwise_launch(dtype: torch.dtype, dim: int) -> Launch:
    """The pairwise kernel's launch for (N, ``dim``) rows of ``dtype``."""
    from dask_cosim import _kernels_triton as kt

    a = torch.randn(512, dim).to(dtype)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    out, redo = torch.empty(512, dtype=acc), torch.empty(512, dtype=torch.int8)
    with recording(kt, "_rows") as rec:
        kt.rows_cosine(a, a, acc, 1e-8, 1e-30, 1e30, out, redo)
    return rec.calls[0]


def variants() -> list[tuple[str, dict[str, Any], Callable[[], Launch]]]:
    """(kernel, parameters, launch) of every variant the table shows."""
    out: list[tuple[str, dict[str, Any], Callable[[], Launch]]] = []
    for kind in ("float16", "bfloat16", "tf32"):
        for dim in (768, 300):
            for k, mode in ((0, None), (0, "upper"), (10, None), (100, "exclude_self")):
                params = {"kind": kind, "dim": dim, "k": k, "mode": mode}
                out.append(
                    (
                        "search",
                        params,
                        lambda p=params: search_launch(p["kind"], p["dim"], p["k"], p["mode"]),
                    )
                )
    for dtype in (torch.float16, torch.float32):
        params = {"dtype": str(dtype).removeprefix("torch."), "dim": 300}
        out.append(("pairwise", params, lambda d=dtype: pairwise_launch(d, 300)))
    return out


def build(arch: int, log: Callable[[str], None] = print) -> list[h.Record]:
    """Every variant compiled for sm_``arch``, with what its code holds."""
    rows: list[h.Record] = []
    for name, params, launch in variants():
        kernel = compile_launch(launch(), arch)
        row: h.Record = {"kernel": name, **params, **resources(kernel, arch)}
        if name == "search":
            row |= search_structure(sass(kernel))
        log(f"{name} {params}: {row.get('registers')} registers, {row['spill_bytes']} B spilled")
        rows.append(row)
    return rows


def _part(part: str, field: str) -> Callable[[h.Record], Any]:
    return lambda r: (r.get(part) or {}).get(field)


TABLE = [
    h.Column("kernel", "kernel", align="<"),
    h.Column("kind", lambda r: r.get("kind") or r.get("dtype"), align="<"),
    h.Column("D", "dim", "d"),
    h.Column("k", lambda r: r.get("k"), "d"),
    h.Column("mode", lambda r: r.get("mode"), align="<"),
    h.Column("regs", "registers", "d"),
    h.Column("spill B", "spill_bytes", "d"),
    h.Column("shared KiB", lambda r: r["shared_bytes"] / 1024, ".0f"),
    h.Column("tensor cores", lambda r: r.get("tensor_cores"), align="<"),
    h.Column("loop instr", _part("loop", "instructions"), "d"),
    h.Column("loop local", _part("loop", "local_memory"), "d"),
    h.Column("epilogue instr", _part("epilogue", "instructions"), "d"),
    h.Column("epilogue local", _part("epilogue", "local_memory"), "d"),
    h.Column("epilogue bar", _part("epilogue", "barriers"), "d"),
]


@click.command()
@click.option("--arch", default=90, show_default=True, help="Compute capability x 10 (90: H100).")
@h.results_options()
def main(arch: int, output: h.Output) -> None:
    """The Triton kernels compiled for a CUDA GPU here, without one: what the code holds."""
    import triton

    def run(log: h.Log) -> h.Record:
        return {
            "params": {"arch": arch, "triton": triton.__version__},
            "variants": build(arch, log),
        }

    def report(record: h.Record) -> None:
        h.print_table(
            TABLE, record["variants"], f"Triton {triton.__version__} kernels for sm_{arch}"
        )

    h.execute_benchmark(h.Config(output, output.name or f"kernel-build-sm{arch}", run, report))


if __name__ == "__main__":
    main()
