"""distbench: benchmarks for the communication distributed training runs on."""

__version__ = "0.1.0"
