"""What the benchmarks measure of a process tree: its peak memory."""

from __future__ import annotations

import threading

import psutil


class PeakMemory:
    """Peak summed RSS of a process and all its descendants, sampled every ``period`` s."""

    def __init__(self, pid: int, period: float = 0.2):
        self.root, self.period, self.peak = psutil.Process(pid), period, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._done.wait(self.period)

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return self.peak / 2**30
