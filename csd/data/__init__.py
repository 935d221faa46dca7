"""Benchmark prompt sets read from files the user downloads (``experiments/download_data.sh``)."""
