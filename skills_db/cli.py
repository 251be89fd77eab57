"""``evotrainer skills``: list, search, show, add, history, restore the skills memory.

``--json`` on list, search and show prints skill objects with exactly the fields ``id``, ``kind``,
``name``, ``score`` (null outside search), ``addresses`` (finding kinds) and ``recipe_path``;
``show --json`` adds the full record under ``skill``. The memory folder is ``--dir``, else
``$EVOTRAINER_SKILLS_DIR``, else the XDG data dir.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from evotrainer.cli_errors import fail
from evotrainer.terminal import clip_key, clip_text, neutralise

skills_app = typer.Typer(help="The skills memory: interventions, analyzers and procedures that worked.",
                         no_args_is_help=True)
_STATE: dict[str, Any] = {"dir": None}


@skills_app.callback()
def _skills_root(
    skills_dir: Annotated[Path | None, typer.Option("--dir", help="Skills folder (default: $EVOTRAINER_SKILLS_DIR "
                                           "or the user data dir).")] = None,
) -> None:
    _STATE["dir"] = skills_dir


def _store() -> Any:
    from evotrainer.skills_db.store import SkillStore

    return SkillStore(_STATE["dir"])


@contextmanager
def _skill_errors() -> Iterator[None]:
    """A :class:`~evotrainer.skills_db.models.SkillError` raised in the block is the command's one-line error
    (:func:`~evotrainer.cli_errors.fail`, exit 1); a stored row the store skipped (``RuntimeWarning``: it does not
    validate) is one ``warning:`` line on stderr each, and the command goes on."""
    import warnings

    from evotrainer.skills_db.models import SkillError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            yield
        except SkillError as exc:
            fail(str(exc))
        finally:
            seen: set[str] = set()
            for w in caught:
                msg = neutralise(str(w.message))
                if not msg.startswith("skills memory: "):  # another's warning: shown as it would have been
                    warnings.showwarning(w.message, w.category, w.filename, w.lineno)
                elif msg not in seen:
                    seen.add(msg)
                    sys.stderr.write(f"warning: {msg.removeprefix('skills memory: ')}\n")


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _table(rows: list[dict[str, Any]], with_score: bool) -> None:
    """Print skills as a table readable at 80 columns.

    The id, kind and score stay whole on one line (``skills show`` needs the full id, also when the
    output is piped at 80 columns); the name, the finding kinds it addresses and the recipe path
    share one text column that folds over lines.
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("id", no_wrap=True)
    t.add_column("kind", no_wrap=True)
    if with_score:
        t.add_column("score", no_wrap=True, justify="right")
    t.add_column("name", overflow="fold", ratio=1)
    for r in rows:  # Text, never markup; control characters shown as \xNN (skills come from any MCP client)
        text = Text(neutralise(r["name"]))
        if r["addresses"]:
            text.append("\naddresses: " + neutralise(", ".join(r["addresses"])), style="dim")
        if r["recipe_path"]:
            text.append("\nchanges: " + neutralise(r["recipe_path"]), style="dim")
        t.add_row(Text(neutralise(r["id"])), Text(neutralise(r["kind"])),
                  *([f"{r['score']:.4f}"] if with_score else []), text)
    Console().print(t)


def _print_rows(rows: list[dict[str, Any]], as_json: bool, with_score: bool) -> None:
    """Skill summaries as a JSON list (``--json``) or as :func:`_table`."""
    if as_json:
        _print_json(rows)
    else:
        _table(rows, with_score=with_score)


# The filters and the output flag of `skills list` and `skills search`.
KindOpt = Annotated[str | None, typer.Option("--kind", help="intervention | analyzer | procedure")]
FindingOpt = Annotated[list[str] | None, typer.Option("--finding", help="Only skills addressing this finding kind "
                                                                        "(repeatable).")]
TagOpt = Annotated[list[str] | None, typer.Option("--tag", help="Only skills with this tag (repeatable).")]
JsonListOpt = Annotated[bool, typer.Option("--json", help="Print a JSON list.")]


@skills_app.command("list")
def list_cmd(
    kind: KindOpt = None,
    finding: FindingOpt = None,
    tag: TagOpt = None,
    as_json: JsonListOpt = False,
) -> None:
    """List skills (sorted by kind, id)."""
    from evotrainer.skills_db.models import skill_summary

    with _skill_errors():
        rows = [skill_summary(s) for s in _store().list(kind=kind, finding_kinds=finding, tags=tag)]
    _print_rows(rows, as_json, with_score=False)


@skills_app.command("search")
def search_cmd(
    query: Annotated[str, typer.Argument(help="Free text, e.g. a finding's explanation.")],
    kind: KindOpt = None,
    finding: FindingOpt = None,
    tag: TagOpt = None,
    mode: Annotated[str, typer.Option("--mode", help="hybrid (vector + full-text, RRF) | vector | fts")] = "hybrid",
    limit: Annotated[int, typer.Option("--limit", "-n", help="Number of results.")] = 10,
    as_json: JsonListOpt = False,
) -> None:
    """Search skills, best first (score: RRF for hybrid, 1 - cosine distance for vector, BM25 for fts)."""
    with _skill_errors():
        hits = _store().search(query, kind=kind, finding_kinds=finding, tags=tag, mode=mode, limit=limit)
    _print_rows([h.summary() for h in hits], as_json, with_score=True)


@skills_app.command("show")
def show_cmd(
    skill_id: Annotated[str, typer.Argument(help="Skill id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show one skill: description, change or code, source, track record per domain."""
    from evotrainer.skills_db.models import skill_summary

    with _skill_errors():
        s = _store().get(skill_id)
    if as_json:
        _print_json({**skill_summary(s), "skill": s.model_dump(mode="json")})
        return
    from rich.console import Console
    from rich.text import Text

    c = Console()

    def say(*parts: str | tuple[str, str]) -> None:  # Text, never markup; control characters shown as \xNN
        c.print(Text.assemble(*((neutralise(p[0]), p[1]) if isinstance(p, tuple) else neutralise(p) for p in parts)))

    say((s.id, "bold"), f" ({s.kind}) {s.name}")
    say(s.description)
    say(f"addresses: {', '.join(s.addresses) or '-'}   tags: {', '.join(s.tags) or '-'}")
    if s.recipe_path:
        say(f"change: {s.recipe_path} <- {json.dumps(s.value)}")
    if s.code:
        say(f"code: {s.code}")
    say(f"source: {s.source}")
    for domain, r in sorted(s.track_record.items()):
        say(f"  {domain}: tried {r.tried}, helped {r.helped}, hurt {r.hurt}")


def load_skill_file(path: Path) -> list[Any]:
    """Skills from a YAML or JSON file: one skill object, a list, or ``{skills: [...]}``.

    Raises:
        SkillError: the file is missing, unparsable, its aliases would expand it past
            :data:`~evotrainer.recipe.MAX_ALIAS_EXPANSION` characters, or a skill fails validation (message
            names the entry and field; a value of the wrong type for its ``recipe_path`` too).
    """
    import yaml
    from pydantic import ValidationError

    from evotrainer.recipe import (
        MAX_MESSAGE_CHARS,
        SHOWN_MAX,
        YAML_MAX_BYTES,
        AliasBoundError,
        IntTooLongError,
        _shown,
        load_yaml,
    )
    from evotrainer.skills_db.models import Skill, SkillError, check_recipe_path

    if not path.is_file():
        raise SkillError(f"{path}: no such file")
    if path.stat().st_size > YAML_MAX_BYTES:
        raise SkillError(f"{path}: {path.stat().st_size:,} bytes, past the {YAML_MAX_BYTES:,} a skills file may have; "
                         "split it into several files")
    try:  # YAML is a superset of JSON; aliases are bounded (review 8, H-R8: a 655-byte alias bomb)
        data = load_yaml(path.read_text(), str(path))
    except AliasBoundError as exc:
        raise SkillError(f"{path}: refused: {exc}") from None
    except IntTooLongError as exc:
        raise SkillError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise SkillError(f"{path}: not valid YAML/JSON: {exc}") from None
    except (ValueError, OverflowError, RecursionError) as exc:  # review 14 G-R14: a 5,000-digit integer
        raise SkillError(f"{path}: a value YAML cannot read ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}); numbers are at most 64-bit integers or floats") from None
    if isinstance(data, dict) and "skills" in data:
        data = data["skills"]
    entries = data if isinstance(data, list) else [data]
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise SkillError(f"{path}: entry {i} is not a mapping of skill fields")
        try:
            out.append(Skill.model_validate(entry))
        except ValidationError as err:
            # the first error only, the id and the message cut (Y-R16: a 200 KB id was echoed twice, 400 KB)
            first = err.errors(include_url=False)[0]
            loc = ".".join(clip_key(p) for p in first["loc"]) or "skill"
            msg = clip_text(first["msg"].removeprefix("Value error, "), MAX_MESSAGE_CHARS)
            sid = entry.get("id", "?")
            sid = clip_text(sid, SHOWN_MAX) if isinstance(sid, str) else _shown(sid)
            raise SkillError(f"{path}: entry {i} ({sid}): {loc}: {msg}") from None
        try:
            check_recipe_path(out[-1])
        except SkillError as err:
            raise SkillError(f"{path}: entry {i} ({clip_text(out[-1].id, SHOWN_MAX)}): {err}") from None
    return out


@skills_app.command("add")
def add_cmd(
    file: Annotated[Path, typer.Argument(help="YAML or JSON: one skill, a list, or {skills: [...]}.")],
    replace: Annotated[bool, typer.Option("--replace", help="Overwrite skills whose id exists.")] = False,
) -> None:
    """Add skills from a file (embedded on add; one new table version)."""
    with _skill_errors():
        skills = load_skill_file(file)
        ids = _store().add(skills, replace=replace)
    typer.echo(f"added {len(ids)} skill(s): {', '.join(ids)}")


@skills_app.command("history")
def history_cmd(
    table: Annotated[str, typer.Option("--table", help="skills | failed_cases | search_traces | version_summaries")] = "skills",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Versions of a memory table (every write is one); roll back with `skills restore VERSION`."""
    with _skill_errors():
        versions = _store().history(table)
    if as_json:
        _print_json(versions)
        return
    for v in versions:
        typer.echo(f"{v['version']:>5}  {v['timestamp']}  {v['rows']} rows")


@skills_app.command("restore")
def restore_cmd(
    version: Annotated[int, typer.Argument(help="Version number from `evotrainer skills history`.")],
    table: Annotated[str, typer.Option("--table", help="skills | failed_cases | search_traces | version_summaries")] = "skills",
) -> None:
    """Roll a memory table back to VERSION (written as a new version; nothing is lost)."""
    with _skill_errors():
        new = _store().restore(version, table)
    typer.echo(f"restored {table} to version {version} (now version {new})")


def register(app: typer.Typer) -> None:
    """Add ``evotrainer skills ...`` to the main app."""
    app.add_typer(skills_app, name="skills")
