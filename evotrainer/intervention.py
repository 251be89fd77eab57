"""Interventions: single-factor changes of a recipe (docs/design.md §2).

An :class:`Intervention` changes exactly one recipe path from ``old`` to ``new``. A child version
differs from its parent by one intervention; a merged version by the composition of sibling
interventions (:func:`merge`), which must touch distinct paths.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evotrainer.errors import EvoTrainerError
from evotrainer.recipe import Recipe, RecipeError, current_value, diff_recipes, set_path
from evotrainer.terminal import clip_text

Category = Literal["reward", "data", "rollout", "optimizer", "tool_use"]
CATEGORIES: tuple[str, ...] = ("reward", "data", "rollout", "optimizer", "tool_use")
DESCRIBE_VALUE_CHARS = 200
"""Characters of each value's ``repr`` in :meth:`Intervention.describe`'s one line (review 13 I-R13: interventions
with ~1 MB values made one ``list_versions`` page a 100 MB reply and, at ``limit=400``, 800 MB and a 6.7 s stall of
every other call)."""


class InterventionError(EvoTrainerError, ValueError):
    """An intervention is malformed, does not apply to a recipe, or conflicts with another."""


class ExpectedEffect(BaseModel):
    """The metric the intervention should move, and in which direction."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    metric: str = Field(..., description="Metric name, e.g. 'eval/avg@k' or 'reward/frac_zero_std'.")
    direction: Literal["up", "down"] = Field(..., description="Expected direction of change.")


class Intervention(BaseModel):
    """One recipe path changed: ``path`` goes from ``old`` to ``new``.

    Build one with :meth:`between` (from two recipes) or directly. ``source`` says where the idea
    came from: a skill id (``skill:<id>``), an agent role, or ``user``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    path: str = Field(..., description="Dotted recipe path, e.g. 'eps_clip_high' or 'reward.format.weight'.")
    old: Any = Field(None, description="Value in the parent recipe (None: the path did not exist).")
    new: Any = Field(..., description="Value in the child recipe.")
    category: Category = Field(..., description="reward | data | rollout | optimizer | tool_use")
    hypothesis: str = Field("", description="Why this should help.")
    expected_effect: ExpectedEffect | None = Field(None, description="Metric and direction expected to move.")
    source: str = Field("user", description="skill:<id>, an agent role, or 'user'.")

    @classmethod
    def between(cls, parent: Recipe, child: Recipe, **meta: Any) -> Intervention:
        """The intervention that turns ``parent`` into ``child``.

        Raises:
            InterventionError: the recipes differ in zero or in several paths.
        """
        diff = diff_recipes(parent, child)
        if len(diff) != 1:
            paths = ", ".join(p for p, _, _ in diff) or "none"
            raise InterventionError(
                f"an intervention changes exactly one recipe path; these recipes differ in {len(diff)} "
                f"({paths}): split it into single-factor interventions"
            )
        path, old, new = diff[0]
        meta.setdefault("category", category_of(path))
        return cls(path=path, old=old, new=new, **meta)

    def apply(self, recipe: Recipe) -> Recipe:
        """Return ``recipe`` with this change applied, validated.

        Raises:
            InterventionError: the recipe's current value is not ``old`` (a stale intervention), the
                change is a no-op, or the new value fails recipe validation.
        """
        try:
            current = current_value(recipe, self.path)
        except RecipeError:
            raise InterventionError(f"intervention path {self.path!r}: no such recipe field path") from None
        if _norm(current) != _norm(self.old):
            raise InterventionError(
                f"intervention on {self.path}: expected old value {self.old!r} but the recipe has "
                f"{current!r}; rebuild it from the current recipe"
            )
        if _norm(self.new) == _norm(self.old):
            raise InterventionError(
                f"intervention on {self.path}: new value equals old value {self.old!r}; it changes nothing"
            )
        try:
            child = set_path(recipe, self.path, self.new)
        except RecipeError as exc:
            raise InterventionError(f"intervention on {self.path}: {exc}") from None
        changed = diff_recipes(recipe, child)
        if [p for p, _, _ in changed] != [self.path]:
            raise InterventionError(
                f"intervention on {self.path} changes {len(changed)} leaf path(s) "
                f"({', '.join(p for p, _, _ in changed)}); point it at one leaf field"
            )
        return child

    def describe(self, max_value_chars: int = DESCRIBE_VALUE_CHARS) -> str:
        """One line: ``path: old -> new``, each value's ``repr`` cut to ``max_value_chars`` characters with a marker
        saying how much was cut (0: whole; the full values are the record's ``old`` / ``new``)."""
        return (f"{self.path}: {clip_text(repr(self.old), max_value_chars)} -> "
                f"{clip_text(repr(self.new), max_value_chars)}")

    def key(self) -> str:
        """Identity of the change (:func:`change_key`): two interventions with the same key are the same change."""
        return change_key(self.path, self.new)


def change_key(path: str, new: Any) -> str:
    """Identity of a single-factor change: ``path=<new value as canonical JSON>`` (``temperature=1.2``).

    The one notion of "the same change" for everyone who compares changes: the loop's already-tried set,
    find-or-create of a child, candidates' keys, search traces and the gate's merge sources.
    """
    return f"{path}={json.dumps(new, sort_keys=True)}"


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def category_of(path: str) -> str:
    """Default category of a recipe path (reward.* → reward, data.* → data, ...)."""
    head = path.split(".", 1)[0]
    if head == "reward":
        return "reward"
    if head == "data" or head in ("dynamic_filtering", "dynamic_filtering_range", "group_filter_top_p",
                                  "drop_zero_variance_groups"):
        return "data"
    if head == "tool_use":
        return "tool_use"
    if head in ("temperature", "top_p", "generate_max_len", "prompt_max_len", "n_samples_per_prompt",
                "rollout_batch_size", "max_refill_rounds"):
        return "rollout"
    return "optimizer"


def merge(a: Intervention | list[Intervention], b: Intervention | list[Intervention]) -> list[Intervention]:
    """Compose sibling interventions into the change list of a merged child.

    Returns the interventions in order (a first), to be applied one after the other to the common
    parent's recipe.

    Raises:
        InterventionError: two interventions touch the same path (a conflict), or the same path and
            one path nests in the other (``reward.format`` vs ``reward.format.weight``).
    """
    left = a if isinstance(a, list) else [a]
    right = b if isinstance(b, list) else [b]
    for x in left:
        for y in right:
            if x.path == y.path or x.path.startswith(y.path + ".") or y.path.startswith(x.path + "."):
                if x.path == y.path and _norm(x.new) == _norm(y.new):
                    raise InterventionError(
                        f"merge conflict on {x.path}: both siblings set it to {x.new!r}; they are the same "
                        "intervention, keep one"
                    )
                raise InterventionError(
                    f"merge conflict on {x.path}: one sibling sets {x.new!r}, the other "
                    f"{y.path}={y.new!r}; merge only interventions on independent paths"
                )
    return left + right


def apply_all(recipe: Recipe, interventions: list[Intervention]) -> Recipe:
    """Apply interventions in order (a merged child's recipe).

    Raises:
        InterventionError: any of them fails to apply.
    """
    for iv in interventions:
        recipe = iv.apply(recipe)
    return recipe
