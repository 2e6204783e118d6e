"""`distbench watch`: the fabric's health over time (issue 32). records: what a cycle measured
and what was judged of it; metrics: the Prometheus names and labels, in one place; judge: rolling
statistics, hysteresis and stragglers; textfile: the node_exporter textfile; health: Slurm's
and node-problem-detector's forms of a verdict."""
