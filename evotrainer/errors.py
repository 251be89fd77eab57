"""The one error base of EvoTrainer (docs/design.md, "Errors and the CLI exit path").

Every error the product raises on purpose (a bad recipe, a locked run folder, a sandbox that cannot
start, an unknown skill, a backend that failed...) is an :class:`EvoTrainerError`. Each subclass keeps
the builtin base it had before (``class RecipeError(EvoTrainerError, ValueError)``), so callers that
catch ``ValueError`` / ``RuntimeError`` / ``OSError`` still catch it.

The contract of a message: one line that names the field, file or value at fault and says the fix
(``recipe.n_samples_per_prompt=1: ... set 2 or more``). The CLI prints it as ``error: <message>``
and exits non-zero, with no traceback unless ``--debug`` (:mod:`evotrainer.cli_errors`).
"""

from __future__ import annotations

__all__ = ["EvoTrainerError"]


class EvoTrainerError(Exception):
    """Base of every known EvoTrainer error: its message names what is wrong and how to fix it."""
