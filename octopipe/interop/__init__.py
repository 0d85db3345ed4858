"""Plans for the stacks users train with: torch.distributed.pipelining, torchtitan, Megatron-LM
and DeepSpeed — their rules (`targets`), the planner held to them, and the files they read."""
