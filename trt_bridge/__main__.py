import sys

from trt_bridge.cli import main

sys.exit(main())
