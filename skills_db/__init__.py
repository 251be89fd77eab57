"""LanceDB memory: skills, failed cases, search traces, version summaries (docs/design.md §1).

``store.py`` (SkillStore: tables, hybrid retrieval, versions), ``models.py`` (records, value rules,
``intervention_from_skill``), ``embeddings.py`` (all-MiniLM-L6-v2 behind a path-free LanceDB
embedding function), ``seed.py`` + ``seed_skills.yaml`` (the seed library), ``cli.py``
(``evotrainer skills ...``).
"""
