"""OctoPipe: plan, evaluate and run pipeline-parallel training of heterogeneous LLMs."""

__version__ = "0.1.0"
