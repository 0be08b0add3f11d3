"""The benchmark behind scripts/bench.py, one job per module.

* ``data``      data sets: hf_xet-written stores of three kinds, a safetensors
                model, a parquet table, synthetic stores for mount time
* ``mounts``    the daemons measured: xetfs (this tree's or a baseline's) and
                the ceiling FS; their CPU time and counters
* ``baseline``  --baseline REF: xetfs at another commit in a temporary venv
* ``rounds``    running tasks in interleaved rounds; the memory primer and
                CPU accounting around a measurement
* ``rows``      rows (one declared key each), per-round values and ratios
* ``report``    tables as text and JSON; rows asked for without a figure
* ``sections``  the things measured, one module per group of sections
* ``parts``     the parts-alone loop (run as its own process)
* ``cli``       options, the run, the header of the report
"""
