"""Cluster in a box: torch.distributed hybrid-parallel training on CPU with real fault injection."""
