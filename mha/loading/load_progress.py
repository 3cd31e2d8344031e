"""A load's progress as one bar: `Stages` splits it into stages of given weights (a GGUF's config read into
the cache, its tensors read, its layers built, the cast and the finite check), each reporting `(i, n)` of
its own steps, and hands the caller's `progress(step, steps)` one rising count over the whole load.

The caller's callback is a plain callable (the service records it per model and streams it to the page);
it runs on the loading thread, between steps, and should return quickly. With no callback every stage's
reporter is None: a load nobody watches pays nothing."""

from __future__ import annotations

from collections.abc import Callable, Mapping

__all__ = ["Progress", "Stages", "report"]

Progress = Callable[[int, int], None]  # progress(step, steps): step of steps done


def report(progress: Progress | None, step: int, steps: int) -> None:
    """progress(step, steps) where there is a progress to report to."""
    if progress is not None:
        progress(step, steps)


class Stages:
    """`weights`: stage -> its share of the bar (whole numbers; the bar has their sum as its steps). A stage
    never run is simply passed over: the bar jumps its share."""

    def __init__(self, progress: Progress | None, weights: Mapping[str, int]) -> None:
        self._progress = progress
        self._starts: dict[str, tuple[int, int]] = {}  # stage -> (its first step, its weight)
        self.steps = 0
        self._lay_out(weights)
        self._done = -1  # the step last reported: never backwards, never the same twice
        self._heard: set[str] = set()  # the stages that reported

    def _lay_out(self, weights: Mapping[str, int]) -> None:
        start = 0
        self._starts.clear()
        for stage, weight in weights.items():
            self._starts[stage] = (start, weight)
            start += weight
        self.steps = start

    def stage(self, name: str) -> Progress | None:
        """report(i, n): i of the stage's n steps done (None without a progress to report to)."""
        if self._progress is None:
            return None

        def stage_report(i: int, n: int) -> None:
            self._heard.add(name)
            start, weight = self._starts[name]  # read at each report: drop_if_silent may move it
            self._report(start + weight * min(i, n) // max(n, 1))

        return stage_report

    def drop_if_silent(self, name: str) -> None:
        """Leave out stage `name` if it never reported (a GGUF's config found cached): the bar is the
        other stages'. Only while nothing is reported yet; later it would move the bar back."""
        if name in self._heard or self._done > 0:
            return
        weights = {stage: weight for stage, (_, weight) in self._starts.items() if stage != name}
        self._lay_out(weights)

    def finish(self) -> None:
        """The whole bar done."""
        self._report(self.steps)

    def _report(self, step: int) -> None:
        if self._progress is not None and step > self._done:
            self._done = step
            self._progress(step, self.steps)
