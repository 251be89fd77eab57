"""The training-backend protocol (docs/interfaces.md): train a version, evaluate a version.

A backend trains a version of a run for N GRPO steps from its parent's checkpoint (the base model
for the root), writing step metrics, rollouts, TensorBoard scalars and a checkpoint into the
workspace, and evaluates a version with k samples per held-out problem. ``get_backend(name)``
returns one: ``local`` (embedded torch trainer, :mod:`evotrainer.rl_backend.local`) or
``openrlhf`` (:mod:`evotrainer.rl_backend.openrlhf_backend`, when present).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

ProgressFn = Callable[[dict[str, Any]], None]
StopFn = Callable[[], bool]


class TrainResult(BaseModel):
    """Outcome of :meth:`Backend.train`."""

    version_id: str
    steps_done: int = Field(..., description="Steps completed for this version in total (resumed ones included).")
    steps_requested: int
    checkpoint: str | None = Field(None, description="Checkpoint folder of the version.")
    metrics_summary: dict[str, Any] = Field(default_factory=dict, description="As stored in the version.")
    resumed_from_step: int | None = Field(None, description="Last step restored from a step checkpoint, if any.")
    stopped_early: bool = Field(False, description="should_stop() returned True before the last step.")
    wall_s: float = Field(0.0, description="Seconds spent in this call.")


class EvalResult(BaseModel):
    """Outcome of :meth:`Backend.evaluate` (held-out, k samples per problem)."""

    version_id: str
    eval_name: str
    k: int
    avg_at_k: float = Field(..., description="Mean correctness over all k samples of all problems (Avg@k).")
    pass_at_k: float = Field(..., description="Unbiased pass@k (Chen et al. 2021), mean over problems.")
    pass_at_1: float
    n_problems: int
    checkpoint: str | None = Field(None, description="Weights evaluated (None: the base model).")
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The ``eval_summary`` dict of docs/interfaces.md."""
        return {"k": self.k, "avg@k": self.avg_at_k, "pass@k": self.pass_at_k, "pass@1": self.pass_at_1,
                "n_problems": self.n_problems, "eval_name": self.eval_name}


@runtime_checkable
class Backend(Protocol):
    """What the servers and the CLI call; see docs/interfaces.md for the exact side effects."""

    name: str

    def train(self, ws: Any, version_id: str, steps: int, progress: ProgressFn | None = None,
              should_stop: StopFn | None = None) -> TrainResult:
        """Train ``version_id`` for ``steps`` GRPO steps (status training → trained, failed on error)."""
        ...

    def evaluate(self, ws: Any, version_id: str, k: int | None = None, eval_name: str = "heldout",
                 progress: ProgressFn | None = None) -> EvalResult:
        """Evaluate ``version_id`` with k samples per held-out problem."""
        ...


class BackendError(RuntimeError):
    """A backend cannot run this request (unknown backend, untrained parent, ...); the message says the fix."""


BACKENDS = ("local", "openrlhf")


def get_backend(name: str = "local", **kwargs: Any) -> Backend:
    """A backend by name.

    Raises:
        BackendError: unknown name, or the backend's module is not installed.
    """
    if name == "local":
        from evotrainer.rl_backend.local import LocalBackend

        return LocalBackend(**kwargs)
    if name == "openrlhf":
        try:
            from evotrainer.rl_backend.openrlhf_backend import OpenRLHFBackend
        except ImportError as exc:
            raise BackendError(f"backend 'openrlhf' is not available here ({exc}); use backend 'local'") from None
        return OpenRLHFBackend(**kwargs)
    raise BackendError(f"backend={name!r}: allowed: {', '.join(BACKENDS)}")
