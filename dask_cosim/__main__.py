from dask_cosim.cli import main

main(prog_name="python -m dask_cosim")
