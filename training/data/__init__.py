"""Datasets: the catalog of sources, staging into a fingerprinted snapshot, the input pipeline."""
