"""Commands that read results back instead of measuring: no launcher, no worker, no torch.
They register their own Typer commands (positional run directories), beside the benchmark
commands of distbench.commands."""
