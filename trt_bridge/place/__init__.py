"""Placement: which tensors get Q/DQ in the output (TensorRT's fusion rules, or the source's choices)."""
