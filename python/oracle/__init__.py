"""The PyTorch-oracle capture of shardproof: per-operator programs and distributed programs,
captured from real PyTorch with their inputs and PyTorch's outputs."""
