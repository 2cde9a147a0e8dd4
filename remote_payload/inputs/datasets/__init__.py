"""Benchmark datasets as eval inputs (``--dataset NAME[:split][@N]``, ``--suite zlab``): one adapter module per
dataset, the rows' sources (``rows.py``), z-lab's sample selection (``selection.py``) and the prompts a run
evaluates (``load.py``)."""
