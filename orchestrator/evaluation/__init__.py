"""`dfo eval` and `dfo runs`: plan, run, merge, report and compare evaluations of drafters."""
