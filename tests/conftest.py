import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import SHARED_MODELS  # noqa: E402


def pytest_collection_modifyitems(config, items):
    has_gpu = os.environ.get("TRT_BRIDGE_GPU") == "1"
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU with TensorRT; set TRT_BRIDGE_GPU=1 on GPU runners")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)


@pytest.fixture
def shared_models() -> Path:
    if not SHARED_MODELS.is_dir():
        pytest.skip(f"the shared model corpus is not at {SHARED_MODELS}")
    return SHARED_MODELS
