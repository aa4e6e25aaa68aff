"""trt-bridge: get quantized ONNX models onto TensorRT as real INT8 engines.

Heavy dependencies (onnxruntime, tensorrt, polygraphy) are imported lazily, so
``import trt_bridge`` and ``trt-bridge --help`` stay fast.
"""

__version__ = "0.1.0"
