"""Seeds side by side: the cells of one (method, fold) over several seeds meet at their training and train it as one
batched computation (`workbench.seed_batch`).

Each cell runs as usual (`workbench.run.run_request`), in a thread of its own, but the threads take turns: exactly
one runs at a time (a baton), so the process-wide state a run relies on — the global random generators, torch's
thread count, the log — is never shared by two cells at once. A cell that reaches a training stage `Lockstep.train`
can batch hands its ready `workbench.trainer.Trainer` in and passes the baton on; when every cell has either arrived
or finished, the arrived trainers are fitted together (`workbench.seed_batch.fit_side_by_side`), or, where they cannot
be batched, each fits alone in its turn, and the cells go on one after another, each with the random generators as it
left them. A cell therefore computes what it computes alone (the batched fit equals the lone fit: see its module).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from workbench import randomness

_current = threading.local()


class Lockstep:
    """Turns of the threads ``names`` (in that order) and their meeting at training."""

    def __init__(self, names: Sequence[str]):
        self.order = list(names)
        self.state = {name: "ready" for name in self.order}  # ready / arrived / finished
        self.holder: str | None = self.order[0] if self.order else None
        self.condition = threading.Condition()
        self.arrived: dict[str, tuple[Any, dict[str, Any]]] = {}
        self.results: dict[str, Any] = {}
        #: Why the last meeting's trainers fitted one at a time (None: they fitted side by side, or none met yet).
        self.fallback: str | None = None
        self.batched = 0

    def run(self, jobs: dict[str, Callable[[], Any]]) -> dict[str, Any]:
        """Run ``jobs`` (name -> job) as threads taking turns; their results (or the first error, raised)."""
        outcomes: dict[str, Any] = {}

        def work(name: str) -> None:
            _current.lockstep, _current.name = self, name
            self._wait_turn(name)
            try:
                outcomes[name] = ("ok", jobs[name]())
            except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
                outcomes[name] = ("error", error)
            finally:
                self._leave(name)

        threads = [threading.Thread(target=work, args=(name,), name=f"cell {name}") for name in self.order]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for name in self.order:
            if outcomes[name][0] == "error":
                raise outcomes[name][1]
        return {name: outcome[1] for name, outcome in outcomes.items()}

    def train(self, trainer: Any, resume: bool) -> list[dict[str, Any]]:
        """The history of fitting ``trainer`` (its model left with the kept weights): side by side with the other
        cells' trainers when they can be batched, else alone, in this thread's turn."""
        name = _current.name
        with self.condition:
            self.arrived[name] = (trainer, randomness.capture())
            self.state[name] = "arrived"
            self._pass_baton()
            while self.holder != name:
                self.condition.wait()
            randomness.restore(self.arrived.pop(name)[1])
            result = self.results.pop(name, None)
        if isinstance(result, BaseException):
            raise result
        return result if result is not None else trainer.fit(resume=resume)

    def _wait_turn(self, name: str) -> None:
        with self.condition:
            while self.holder != name:
                self.condition.wait()

    def _leave(self, name: str) -> None:
        with self.condition:
            self.state[name] = "finished"
            self._pass_baton()

    def _pass_baton(self) -> None:
        """Give the turn to the first ready thread; none left: fit the arrived trainers (together where they can be)
        and give the turn to the first of them."""
        ready = [name for name in self.order if self.state[name] == "ready"]
        if not ready and self.arrived:
            self._fit_arrived()
            ready = [name for name in self.order if self.state[name] == "ready"]
        self.holder = ready[0] if ready else None
        self.condition.notify_all()

    def _fit_arrived(self) -> None:
        from workbench.seed_batch import fit_side_by_side

        names = [name for name in self.order if name in self.arrived]
        trainers = [self.arrived[name][0] for name in names]
        self.fallback, self.batched = None, 0
        if len(trainers) > 1:
            try:
                histories = fit_side_by_side(trainers)
            except ValueError as why:  # cannot be batched (refused before anything changed): each fits alone
                self.fallback = str(why)
            except Exception as error:  # noqa: BLE001 - every cell that met raises it in its own thread
                self.results.update((name, error) for name in names)
            else:
                self.results.update(zip(names, histories))
                self.batched = len(trainers)
        else:
            self.fallback = "one seed at this meeting"
        for name in names:
            self.state[name] = "ready"


def current() -> Lockstep | None:
    """The lockstep this thread's cell runs in (None: a cell, or a run, of its own)."""
    return getattr(_current, "lockstep", None)
