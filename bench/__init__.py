"""ringflow's benchmarks: each module measures one speed or memory target as ratios of runs made side by side
on the same machine, and writes bench/results/<name>.md and .json with the command that made them.

Run one from the repository root as a module of this package, e.g.

    .venv/bin/python -m bench.throughput --steps 1600
    .venv/bin/python -m bench.health_overhead --out health_overhead-try --results-dir /tmp/bench-results

(`make bench` runs them all; `--results-dir` keeps a trial run out of bench/results/). A bench that starts
ranks or children runs them as `python -m bench.<name>` too, with the repository root on their PYTHONPATH
(common.importable).

What the modules share: common.py (the jobs' environment, the small model and its random shards, spread and
quartile formatting, the machine, a throwaway Airflow home, the route to the modules shared with tests/),
results_file.py (where results go), rank_script.py (a rank started exactly as ringflow starts one, running a
bench module) and checkpoint_gate.py (checkpoints on in some blocks of a job and off in others).
"""
