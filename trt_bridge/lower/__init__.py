"""Lowering: the canonical form to TensorRT-ready Q/DQ, and fp16/bf16 for the layers left in float."""
