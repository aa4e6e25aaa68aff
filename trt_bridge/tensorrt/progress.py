"""A progress bar over an engine build, driven by TensorRT's progress monitor."""

from __future__ import annotations

import logging

log = logging.getLogger("trt_bridge.tensorrt")


def progress_monitor(trt):
    """A TensorRT progress monitor drawing a tqdm bar over the top-level phase ('Building engine'), the current
    inner phase as its postfix. Ctrl-C stops the build at the next step (TensorRT calls back from C++, where a
    KeyboardInterrupt cannot propagate)."""
    from tqdm import tqdm

    class Monitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)
            self.bar = None
            self.top = None
            self.interrupted = False

        def phase_start(self, phase_name, parent_phase, num_steps):
            try:
                if parent_phase is None and self.bar is None:
                    self.top = phase_name
                    self.bar = tqdm(total=num_steps, desc=phase_name, leave=False, dynamic_ncols=True, delay=0.5,
                                    bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
                elif self.bar is not None:
                    self.bar.set_postfix_str(phase_name)
                log.debug("TensorRT phase: %s (%d steps)", phase_name, num_steps)
            except KeyboardInterrupt:
                self.interrupted = True

        def step_complete(self, phase_name, step):
            try:
                if phase_name == self.top and self.bar is not None:
                    self.bar.update(step + 1 - self.bar.n)
            except KeyboardInterrupt:
                self.interrupted = True
            return not self.interrupted

        def phase_finish(self, phase_name):
            try:
                if phase_name == self.top:
                    self.close()
            except KeyboardInterrupt:
                self.interrupted = True

        def close(self):
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    return Monitor()
