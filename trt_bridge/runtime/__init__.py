"""onnxruntime: the one session factory."""
