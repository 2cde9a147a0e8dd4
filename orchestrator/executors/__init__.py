"""Where a job runs: the seam below `dfo eval` and `dfo watch` (``base.Executor``), its two places (``ssh``: an SSH
host's detached jobs; ``slurm``: a Slurm cluster's arrays and resident job) and the one place that picks a place
from the inventory (``registry``)."""
