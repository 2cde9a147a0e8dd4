"""Slurm clusters: array jobs on a login node's cluster (docs/clusters.md)."""
