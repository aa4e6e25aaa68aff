"""The packages: ``trt_bridge/`` and the repository's top-level ``plugins/`` folder, installed as
``trt_bridge.plugins`` (everything else is in pyproject.toml)."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["trt_bridge", "trt_bridge.*"]), "trt_bridge.plugins"],
      package_dir={"trt_bridge.plugins": "plugins"})
