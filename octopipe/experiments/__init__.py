"""Reproducible experiments driven by `python -m octopipe.run experiment=NAME`."""
