"""The child process :func:`trt_bridge.tensorrt.parse.parse_isolated` runs TensorRT's ONNX parser in
(``python -m trt_bridge.tensorrt.parse_child REQUEST``), so that a parser that kills its process (TensorRT-RTX
1.7.1 dies by SIGFPE on a com.microsoft ``RotaryEmbedding`` with ``num_heads=0`` on a 3-D input) takes only the
child with it.

REQUEST is JSON: ``path``, ``module`` (or null), ``progress`` and ``result`` (file paths). The child writes

- to ``progress``, unbuffered (each line one ``os.write``, so it survives the crash): first
  ``module<TAB>version``, then the node of each of the parser's own verbose lines "Static check for parsing node:
  NAME [OP]" and "Parsing node: NAME [OP]", as ``check<TAB>NAME<TAB>OP`` or ``parse<TAB>NAME<TAB>OP``. The last
  line names the node the parser was working on when the process died: no bisection, no second run;
- to ``result``, when the parser returns: JSON with ``ok``, ``layers``, ``errors`` (each error's text, node name,
  operator, code, description and node index: the raw fields :func:`trt_bridge.tensorrt.parse.parser_errors`
  reads), or ``exception`` and ``message`` when something raised before or around the parse.

This module imports TensorRT and nothing heavy (no onnx, numpy or onnxruntime): the child costs a Python start-up
and TensorRT's import (about 0.4 s here) on top of the parse itself. A model with trt-bridge's plugin nodes or
``--plugins`` files runs :mod:`.parse_child_plugins` instead, which registers them first (and imports onnx).
"""

from __future__ import annotations

import json
import os
import sys

from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.tensorrt import import_tensorrt
from trt_bridge.tensorrt.network import create_network

#: the parser's verbose lines that say which node it is at, → the tag written to the progress file
PROGRESS = {"Static check for parsing node: ": "check", "Parsing node: ": "parse"}


def progress_line(message: str) -> tuple[str, str, str] | None:
    """(tag, node, op) of one of the parser's "Parsing node: NAME [OP]" lines, else None."""
    for head, tag in PROGRESS.items():
        at = message.find(head)
        if at < 0:
            continue
        rest = message[at + len(head):].strip()
        name, _, op = rest.rpartition(" [")
        if not _ or not op.endswith("]"):
            return tag, rest, ""
        return tag, name, op[:-1]
    return None


def _logger(trt, fd: int):
    class ProgressLogger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            found = progress_line(msg) if severity == trt.ILogger.Severity.VERBOSE else None
            if found is not None:
                os.write(fd, ("\t".join(found).replace("\n", " ") + "\n").encode("utf-8", "backslashreplace"))

    return ProgressLogger()


def _error(e) -> dict:
    def call(method):  # TensorRT 8.6's ParserError has no node_name/node_operator
        return (getattr(e, method, None) or (lambda: ""))() or ""

    return {"text": str(e), "node_name": call("node_name"), "node_operator": call("node_operator"),
            "code": str(e.code()).rsplit(".", 1)[-1], "desc": e.desc(), "node": int(e.node())}


def run(request: dict, register=None) -> dict:
    """Parse ``request['path']``; ``register(trt, path)`` first registers the plugins it needs."""
    fd = os.open(request["progress"], os.O_WRONLY | os.O_APPEND)
    try:
        trt = import_tensorrt(request.get("module"))
        os.write(fd, f"{trt.__name__}\t{getattr(trt, '__version__', '?')}\n".encode())
        if register is not None:
            register(trt, request["path"])
        logger = _logger(trt, fd)
        builder = trt.Builder(logger)
        network = create_network(trt, builder)
        parser = trt.OnnxParser(network, logger)
        ok = parser.parse_from_file(request["path"])
        errors = [_error(parser.get_error(i)) for i in range(parser.num_errors)]
        return {"ok": bool(ok), "layers": network.num_layers, "errors": errors, "module": trt.__name__,
                "version": getattr(trt, "__version__", "?")}
    except MissingDependencyError as exc:
        return {"exception": "MissingDependencyError", "message": str(exc)}
    except TrtBridgeError as exc:  # a --plugins file that does not load
        return {"exception": type(exc).__name__, "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - e.g. datacenter TensorRT on a machine without a GPU: the parent says
        return {"exception": type(exc).__name__, "message": str(exc)}
    finally:
        os.close(fd)


def main(argv: list[str] | None = None, register=None) -> int:
    request = json.loads((sys.argv[1:] if argv is None else argv)[0])
    result = run(request, register)
    partial = request["result"] + ".part"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(partial, request["result"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
