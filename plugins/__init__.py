"""TensorRT plugins of trt-bridge (the repository's ``plugins/`` folder, installed as ``trt_bridge.plugins``)."""
