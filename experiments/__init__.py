"""Experiment scripts, each run as a module from the repository root: ``python -m experiments.<name> ...`` (the one
form the docs use; ``--help`` lists a script's options). A regular package, so that ``experiments`` is this folder
even where an installed distribution ships a top-level package of that name; ``bench_throughput`` imports
``bench_latency``, ``gpu_check`` imports both. Run by path, a script refuses in one line (:mod:`experiments._entry`).
"""
