"""mode=train: data and tokenizer, optimizer and learning-rate schedule, checkpoints, the loop.

`python -m octopipe.train` is the torchrun entry (`octopipe/train/__main__.py`)."""
