""":mod:`.parse_child` for a model that needs plugins registered before it parses (trt-bridge's own plugin nodes, or
``--plugins`` files: ``python -m trt_bridge.tensorrt.parse_child_plugins REQUEST``, whose JSON also holds
``plugins``, the files). A module of its own because the plugin registry imports onnx, a second's start-up the
child of a model without plugins does not pay."""

from __future__ import annotations

import json
import sys

from trt_bridge.plugins.registry import register_for_model
from trt_bridge.tensorrt.parse_child import main

if __name__ == "__main__":
    plugins = tuple(json.loads(sys.argv[1]).get("plugins", ()))
    sys.exit(main(register=lambda trt, path: register_for_model(trt, path, plugins)))
