"""Asynchronous pipeline training: PipeDream, PipeDream-2BW and vertical sync as tables with
weight versions (`tables`), their staleness (`staleness`), block-partitioned objectives
(`objectives`), the optimizers PD, RPD, LocalSGD and synchronous SGD (`optimizers`), and the
runtime's weight stash (`runtime`)."""
