"""Calibration: feed sources, streaming observers, and the onnxruntime runner."""

from trt_bridge.calibrate.feed_sources import open_feeds
from trt_bridge.calibrate.feeds import FeedSource, InputSpec, model_inputs, validate_feed
from trt_bridge.calibrate.observers import CalibMethod, RangeObserver
from trt_bridge.calibrate.session import CalibrationResult, calibrate

__all__ = [
    "CalibMethod", "CalibrationResult", "FeedSource", "InputSpec", "RangeObserver", "calibrate",
    "model_inputs", "open_feeds", "validate_feed",
]
