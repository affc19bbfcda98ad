"""The benchmark scripts, run as modules from the repository root.

    python -m benchmarks.pairwise     # make bench
    python -m benchmarks.scaling
    python -m benchmarks.layouts
    python -m benchmarks.kernel

``benchmarks.harness`` holds what they share; ``benchmarks.peers`` the tools users would
use instead.  Run from the repository root, the root is on ``sys.path``, and the processes
dask and multiprocessing spawn inherit it, so they import ``benchmarks.peers`` too.
"""
