"""The benchmark scripts, run as modules from the repository root.

    python -m benchmarks.pairwise       # make bench: the CPU run, floors and peers
    python -m benchmarks.pairwise_gpu   # the same run plus the GPU rows (.ci/gpu-check)
    python -m benchmarks.dask_gpu       # persisted dask_cudf at 1M-50M rows, 2 workers/GPU
    python -m benchmarks.memory         # peak memory of pairwise on one partition
    python -m benchmarks.scaling        # time per pair against N and D
    python -m benchmarks.kernel         # the kernels against the streaming floors
    python -m benchmarks.layouts        # read speed of Parquet layouts
    python -m benchmarks.from_pandas    # pandas frames of tensors into dask
    python -m benchmarks.search         # exact search against faiss and others
    python -m benchmarks.clustered      # clustered neighbours and dedup, with recall
    python -m benchmarks.kernel_build   # the Triton kernels compiled for a GPU, no GPU needed

``benchmarks.harness`` holds what they share (its docstring shows how to write a new
script); ``benchmarks.peers`` the tools users would use instead; ``benchmarks.gpu_host``
and ``benchmarks.gpu_read`` rows of ``pairwise_gpu``; ``benchmarks.search_cases`` the
cases of ``search``.  Run from the repository root, the root is on ``sys.path``, and the
processes dask and multiprocessing spawn inherit it, so they import ``benchmarks.peers``
too.
"""
