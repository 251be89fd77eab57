"""The seed library: skills from the literature, loaded into an empty skills table on first use.

The skills live in ``seed_skills.yaml`` next to this file (sections ``interventions``,
``analyzers``, ``procedures``); :func:`seed_skills` validates them into :class:`Skill` records.
"""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path

from evotrainer.recipe import load_yaml
from evotrainer.skills_db.models import Skill, SkillError

SEED_FILE = Path(__file__).with_name("seed_skills.yaml")
_SECTIONS = {"interventions": "intervention", "analyzers": "analyzer", "procedures": "procedure"}


@lru_cache(maxsize=1)
def _load() -> tuple[Skill, ...]:
    data = load_yaml(SEED_FILE.read_text(), str(SEED_FILE)) or {}
    skills: list[Skill] = []
    for section, kind in _SECTIONS.items():
        for entry in data.get(section, []):
            skills.append(Skill(kind=kind, **entry))
    ids = [s.id for s in skills]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise SkillError(f"{SEED_FILE}: duplicate skill ids {dupes}")
    return tuple(skills)


def seed_skills() -> list[Skill]:
    """The seed skills, validated (fresh copies; ``source`` names the paper or report).

    Raises:
        SkillError / pydantic.ValidationError: the seed file is malformed (a packaging bug).
    """
    now = time.time()
    return [s.model_copy(update={"created_at": now, "updated_at": now}, deep=True) for s in _load()]
