"""CLI user experience: --version, whole-config validation with "did you mean", tables at 80 columns."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys


def cli(*args, cwd=None, columns: int = 200):
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


def test_version_matches_the_installed_distribution():
    r = cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"evotrainer {importlib.metadata.version('evotrainer')}\n"
    assert r.stdout == "evotrainer 0.1.0\n"  # pyproject.toml's version


# --- recipe validate: whole run configs, reward params, required data fields, did you mean ----------
def _validate(tmp_path, text: str, name: str = "c.yaml"):
    f = tmp_path / name
    f.write_text(text)
    return cli("recipe", "validate", str(f), cwd=tmp_path, columns=80)


def test_run_config_budget_errors_fail(tmp_path):
    r = _validate(tmp_path, "budget:\n  max_versions: 0\n  stepz: 3\nrecipe:\n  n_samples_per_prompt: 4\n")
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "error: config.budget.max_versions=0: Input should be greater than or equal to 1; set a value >= 1",
        "config.budget.stepz: unknown field; allowed: max_versions, steps_per_version, wall_clock_minutes, "
        "branches_per_round, probe_steps, exploit_fraction, exploit_check_k, max_tokens",
    ]


def test_run_config_valid_line_is_whole_at_80_columns(tmp_path):
    r = _validate(tmp_path, "mode: static\nbudget: {max_versions: 3, steps_per_version: 2}\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"{tmp_path / 'c.yaml'}: valid run config (mode static, 3 versions x 2 steps; "
                        "recipe: 1 reward components, task arithmetic)\n")


def test_typo_says_did_you_mean_instead_of_listing_fields(tmp_path):
    r = _validate(tmp_path, "recipe:\n  actor_learning_rte: 1.0e-6\n  model: {lora: {rnak: 8}}\n")
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        # no allowed name is close to "rnak" (difflib ratio < 0.6), so the five allowed ones are listed
        "error: config.recipe.model.lora.rnak: unknown field; allowed: enabled, r, alpha, dropout, target_modules",
        "config.recipe.actor_learning_rte: unknown field; did you mean 'actor_learning_rate'?",
    ]


def test_reward_params_are_checked_per_component(tmp_path):
    r = _validate(tmp_path, "reward:\n  correctness: {weight: 1.0, params: {x: 1}}\n"
                            "  overlong: {weight: 0.5, params: {buffer: 4}}\n", "r.yaml")
    assert r.returncode == 1
    # the reward validator stops at the first bad param; a plain recipe file is prefixed "recipe."
    assert r.stderr.splitlines() == [
        "error: recipe.reward.correctness.params.x=1: unknown parameter; 'correctness' takes no params, remove it",
    ]
    r = _validate(tmp_path, "reward:\n  overlong: {params: {buffer: 4}}\n", "r.yaml")
    assert r.stderr.splitlines() == [
        "error: recipe.reward.overlong.params.buffer=4: unknown parameter of 'overlong'; did you mean 'buffer_len'?"]
    r = _validate(tmp_path, "reward:\n  correctness: {}\n  repetition: {weight: -0.1, params: {n: '4'}}\n", "r.yaml")
    assert r.stderr.splitlines() == ["error: recipe.reward.repetition.params.n='4': need an integer, e.g. n: 4"]
    r = _validate(tmp_path, "reward:\n  swe_tests: {params: {mode: any}}\n", "r.yaml")
    assert r.stderr.splitlines() == [
        "error: recipe.reward.swe_tests.params.mode='any': allowed values: 'all' or 'fraction'"]
    r = _validate(tmp_path, "reward:\n  overlong: {params: {max_len: 64, buffer_len: 16, penalty_factor: 1}}\n",
                  "r.yaml")
    assert r.returncode == 0, r.stderr  # an int is accepted where a number (float) is read


def test_required_and_missing_data_path(tmp_path):
    r = _validate(tmp_path, "recipe:\n  data: {task: jsonl}\n")
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "error: config.recipe.data.path=None: task 'jsonl' reads its problems from a file; set data.path to "
        'a JSONL file of {"prompt": ..., "answer": ...} lines']
    r = _validate(tmp_path, "data: {task: gsm8k, path: nope.parquet}\n", "r.yaml")
    assert r.stderr.splitlines() == [
        f"error: recipe.data.path='nope.parquet': no such file or folder (from {tmp_path}); "
        "fix the path or run from the folder it is relative to"]
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    r = _validate(tmp_path, "data: {task: jsonl, path: d.jsonl}\n", "r.yaml")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{tmp_path / 'r.yaml'}: valid recipe (1 reward components, task jsonl)\n"


# --- diagnose --fail-on limited to some versions ------------------------------------------------------
def _two_version_run(tmp_path):
    """v0 (pruned): entropy 0.8 -> ~0.01 over 40 steps (entropy_collapse, warn); v1 (kept): flat 0.8."""
    import math

    from evotrainer import metrics as M
    from evotrainer.intervention import Intervention
    from evotrainer.recipe import Recipe
    from evotrainer.workspace import Workspace

    run = tmp_path / "run"
    with Workspace(run, writer=True) as ws:
        v0 = ws.lineage.create_root(Recipe())
        v1 = ws.lineage.branch(v0.id, Intervention(path="temperature", old=1.0, new=0.8, category="rollout"))
        for step in range(40):
            ws.lineage.log_metrics(v0.id, step, {M.POLICY_ENTROPY: 0.8 * math.exp(-step / 6) + 0.01,
                                                 M.REWARD_MEAN: 0.3 + 0.005 * step, M.POLICY_GRAD_NORM: 0.3})
            ws.lineage.log_metrics(v1.id, step, {M.POLICY_ENTROPY: 0.8, M.REWARD_MEAN: 0.3 + 0.005 * step,
                                                 M.POLICY_GRAD_NORM: 0.3})
        ws.lineage.update_version(v1.id, eval_summary={"avg@k": 0.5, "k": 8})
        ws.lineage.decide(v1.id, "keep", "gain", author="test")
        ws.lineage.decide(v0.id, "prune", "collapsed", author="test")
    return run


def test_fail_on_judges_only_the_chosen_versions(tmp_path):
    run = _two_version_run(tmp_path)
    base = ("diagnose", str(run), "--no-plots", "--fail-on", "warn")
    r = cli(*base)
    assert r.returncode == 2, r.stdout + r.stderr  # v0's entropy_collapse stands
    assert "entropy_collapse" in r.stdout
    # exit 2 names the finding behind it on stderr (a new user saw the code and a table, and had to guess which)
    assert r.stderr == ("diagnose --fail-on warn: exit 2: 1 finding(s) at warn or worse: "
                        "entropy_collapse (warn, v0, steps 0..39)\n")
    for gate in (("--kept",), ("--best",), ("--version", "v1")):
        r = cli(*base, *gate)
        assert r.returncode == 0, (gate, r.stdout, r.stderr)
        assert "entropy_collapse" in r.stdout  # still reported, just not judged
    assert cli(*base, "--version", "v0").returncode == 2
    r = cli(*base, "--version", "v9")
    assert r.returncode == 1  # 2 is the gate's code; a bad option is 1
    assert r.stderr == f"error: --version v9: not in {run}; known versions: v0, v1\n"


def test_kept_needs_a_lineage(tmp_path):
    log = tmp_path / "m.jsonl"
    log.write_text("".join(f'{{"step": {i}, "reward/mean": 0.1}}\n' for i in range(3)))
    r = cli("diagnose", str(log), "--no-plots", "--fail-on", "warn", "--kept")
    assert r.returncode == 1
    assert r.stderr == (f"error: --kept / --best need an EvoTrainer run folder (lineage.db); {log} has no lineage: "
                        "use --version\n")
    r = cli("diagnose", str(log), "--no-plots", "--fail-on", "often")
    assert r.returncode == 2 and "--fail-on 'often': use none, warn or blocking" in r.stderr  # a usage error, no traceback
    assert "Traceback" not in r.stderr and "rerun with --debug" not in r.stderr


def test_version_kept_best_without_fail_on_are_refused(tmp_path):
    # they narrow only what --fail-on judges: `diagnose RUN --best` printed every finding and exited 0
    log = tmp_path / "m.jsonl"
    log.write_text("".join(f'{{"step": {i}, "reward/mean": 0.1}}\n' for i in range(3)))
    r = cli("diagnose", str(log), "--no-plots", "--best")
    assert r.returncode == 1
    assert r.stderr == ("error: --best only narrow what --fail-on judges (every finding is printed either way): "
                        "add --fail-on warn or --fail-on blocking\n")
    r = cli("diagnose", str(log), "--no-plots", "--version", "m", "--kept")
    assert r.returncode == 1 and r.stderr.startswith("error: --version / --kept only narrow what --fail-on judges")


# --- tables at 80 columns ----------------------------------------------------------------------------
def _scored_run(tmp_path):
    """v0 with a no-RL row (4 samples: 1 of 4 right, Avg = 0.25) and a child v1 with a long change."""
    from evotrainer.intervention import Intervention
    from evotrainer.recipe import Recipe
    from evotrainer.workspace import Workspace

    run = tmp_path / "run"
    with Workspace(run, writer=True) as ws:
        root = ws.lineage.create_root(Recipe())
        ws.lineage.kv_set(f"loop/eval/{root.id}/no_rl", {"avg@k": 0.25, "k": 2})
        ws.lineage.log_eval_samples(root.id, "no_rl", [("p0", 0, 1.0, ""), ("p0", 1, 0.0, ""),
                                                       ("p1", 0, 0.0, ""), ("p1", 1, 0.0, "")])
        ivs = [Intervention(path="reward.overlong.weight", old=None, new=1.0, category="reward"),
               Intervention(path="generate_max_len", old=64, new=128, category="rollout")]
        child = ws.lineage.branch(root.id, ivs)
        ws.lineage.log_eval_samples(child.id, "heldout", [("p0", 0, 1.0, ""), ("p1", 0, 0.0, "")])
        ws.lineage.update_version(child.id, eval_summary={"avg@k": 0.5, "k": 1, "eval_name": "heldout"},
                                  metrics_summary={"reward/mean": 0.4375})
    return run


def test_report_table_keeps_numbers_whole_at_80_columns(tmp_path):
    run = _scored_run(tmp_path)
    r = cli("report", str(run), columns=80)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    # bootstrap CIs of [1, 0, 0, 0] per-prompt means and [1, 0]: the numbers are never cut ("[0.250, 0")
    # each number and its CI on unbroken lines; only the change column folds (and is no longer cut mid-word)
    assert lines[1:8] == [
        "                                                                           Avg@k",
        "version status   change                                                 [95% CI]",
        "────────────────────────────────────────────────────────────────────────────────",
        "no-RL            base model, no RL                                         0.250",
        "                                                                  [0.000, 0.500]",
        "v1      proposed reward.overlong.weight: None -> 1.0;                      0.500",
        "                 generate_max_len: 64 -> 128                      [0.000, 1.000]",
    ]


def test_live_lineage_table_folds_text_and_keeps_numbers(tmp_path):
    from rich.console import Console

    from evotrainer.agents.cli import lineage_table
    from evotrainer.workspace import Workspace

    run = _scored_run(tmp_path)
    console = Console(width=60, record=True, file=open(tmp_path / "out.txt", "w"))  # noqa: SIM115
    with Workspace.open(run) as ws:
        console.print(lineage_table(ws))
    text = console.export_text()
    assert "…" not in text and all(len(line) <= 60 for line in text.splitlines())
    assert "0.438" in text and "0.500" in text  # reward/mean 0.4375 rounds half-even to 0.438 (":.3f")
    assert "128" in text  # the end of the change is folded onto a line, not cut at 60 characters


def test_piped_skills_list_prints_full_ids_at_80_columns(tmp_path):
    import json

    env_dir = ("--dir", str(tmp_path / "skills"))
    rows = json.loads(cli("skills", *env_dir, "list", "--finding", "entropy_collapse", "--json").stdout)
    assert len(rows) >= 3
    r = cli("skills", *env_dir, "list", "--finding", "entropy_collapse", columns=80)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "…" not in r.stdout and all(len(line) <= 80 for line in lines)
    # each skill's first line opens with its whole id, then its whole kind
    for row in rows:
        line = next(ln for ln in lines if ln.split()[:1] == [row["id"]])
        assert line.split()[1] == row["kind"]


# --- mcp-config / serve: a --run that is not a run folder, a backup before --install -----------------
def test_serve_and_mcp_config_warn_when_run_is_not_a_run_folder(tmp_path):
    missing = tmp_path / "nope"
    warning = (f"warning: --run {missing} does not exist: the run tools will fail until it holds a run; create one "
               f"with `evotrainer init {missing}` (or `evotrainer run`), or pass --run DIR of an existing run\n")
    r = subprocess.run([sys.executable, "-m", "evotrainer.cli", "serve", "logs", "--run", str(missing)],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and r.stderr == warning and r.stdout == ""  # stdin closed: the stdio server ends
    r = cli("mcp-config", "--run", str(missing))
    assert r.returncode == 0 and r.stderr == warning
    (tmp_path / "empty").mkdir()
    r = cli("mcp-config", "--run", str(tmp_path / "empty"))
    assert r.stderr.startswith(f"warning: --run {tmp_path / 'empty'} is not a run folder (no lineage.db): ")
    assert cli("init", str(tmp_path / "run")).returncode == 0
    assert cli("mcp-config", "--run", str(tmp_path / "run")).stderr == ""
    assert cli("mcp-config", "--run", str(missing), "--server", "skills").stderr == ""  # skills needs no run


def test_mcp_config_install_writes_a_backup_first(tmp_path):
    import json

    cfg = tmp_path / "claude_desktop_config.json"
    original = json.dumps({"mcpServers": {"other": {"command": "x"}}, "theme": "dark"})
    cfg.write_text(original)
    assert cli("init", str(tmp_path / "run")).returncode == 0
    r = cli("mcp-config", "--install", "--config-path", str(cfg), "--run", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    backups = sorted(tmp_path.glob("claude_desktop_config.json.*.bak"))
    assert len(backups) == 1 and backups[0].read_text() == original
    assert r.stdout.splitlines() == [f"backup of the previous config: {backups[0]}",
                                     f"installed mcpServers.evotrainer into {cfg}; restart Claude Desktop to load it"]
    assert set(json.loads(cfg.read_text())["mcpServers"]) == {"other", "evotrainer"}
    r = cli("mcp-config", "--install", "--config-path", str(cfg), "--run", str(tmp_path / "run"))
    assert len(sorted(tmp_path.glob("claude_desktop_config.json.*.bak"))) == 2  # a second install keeps both
    fresh = tmp_path / "new" / "claude_desktop_config.json"
    r = cli("mcp-config", "--install", "--config-path", str(fresh), "--run", str(tmp_path / "run"))
    assert r.returncode == 0 and not r.stdout.startswith("backup")  # nothing to back up


def test_mcp_config_install_into_invalid_json_changes_nothing_and_leaves_no_backup(tmp_path):
    # a refused install left a <name>.<time>.bak of the untouched file each time it was retried
    cfg = tmp_path / "claude_desktop_config.json"
    cfg.write_text("{bad")
    assert cli("init", str(tmp_path / "run")).returncode == 0
    r = cli("mcp-config", "--install", "--config-path", str(cfg), "--run", str(tmp_path / "run"))
    assert r.returncode == 1
    assert r.stderr.strip() == (f"error: {cfg} is not valid JSON (Expecting property name enclosed in double quotes: "
                                "line 1 column 2 (char 1)); fix or move it, then rerun --install")
    assert cfg.read_text() == "{bad" and sorted(p.name for p in tmp_path.iterdir()) == [cfg.name, "run"]


def test_reward_params_table_matches_what_the_reward_code_reads():
    # every params.get("x") in a registered reward function (and swe_train's mode) is a known param,
    # so the validator never rejects a param the trainer reads, nor accepts one it ignores
    import re
    from pathlib import Path

    from evotrainer.recipe import REWARD_PARAMS

    root = Path(__file__).resolve().parents[1] / "rl_backend"
    read: dict[str, set[str]] = {}
    for chunk in (root / "rewards.py").read_text().split('@register("')[1:]:
        name = chunk.split('"', 1)[0]
        body = chunk.split("\n@register", 1)[0].split("\ndef _behaviour_penalty", 1)[0]
        read[name] = set(re.findall(r'params\.get\("(\w+)"', body))
    read["swe_tests"] = set(re.findall(r'comp\.params\.get\("(\w+)"', (root / "swe" / "train.py").read_text()))
    assert {n: ps for n, ps in read.items() if ps} == {n: set(ps) for n, ps in REWARD_PARAMS.items()}


def test_report_of_a_run_without_evaluations_says_so(tmp_path):
    # an imported foreign run (or a fresh init) has no dev evaluation: the table was a header over no rows
    run = tmp_path / "run"
    assert cli("init", str(run)).returncode == 0
    r = cli("report", str(run), columns=1000)  # wide: rich breaks "report: PATH" before a path longer than the line
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == (f"no score table: no version of {run} has a dev (held-out) evaluation yet (versions: v0 "
                        f"(proposed)); `evotrainer eval VERSION --run {run}` evaluates one that has a checkpoint")
    assert lines[1] == f"report: {run}/reports/report.html"


def test_every_command_argument_and_option_has_help_text():
    # `swe episodes --help` showed --max-turns, --temperature and --seed with no text
    import typer
    from typer.core import TyperGroup

    from evotrainer.cli import app

    missing, n_commands = [], 0

    def walk(cmd, path):
        nonlocal n_commands
        if isinstance(cmd, TyperGroup):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
        else:
            n_commands += 1
            if not (cmd.help or "").strip():
                missing.append((" ".join(path), "<command>"))
        missing.extend((" ".join(path), "/".join(p.opts)) for p in cmd.params
                       if p.name != "help" and not (getattr(p, "help", None) or "").strip())
        # reST literals (``x``) showed as such in `recipe validate --help` and `sandbox run --help`
        missing.extend((" ".join(path), "``") for t in [cmd.help or "", *(getattr(p, "help", "") or "" for p in
                                                                              cmd.params)] if "``" in t)

    walk(typer.main.get_command(app), [])
    assert n_commands >= 26  # every leaf command was reached (26 when this test was written)
    assert missing == []


# --- piped output: tables at 160 columns, not rich's 80 ---------------------------------------------
def test_piped_tables_are_160_columns_wide_unless_columns_is_set():
    """`analyzers list | less` (a stdout that is no terminal, COLUMNS unset) printed its table at rich's 80-column
    fallback, every description wrapped over several lines; it is 160 wide now, and COLUMNS still wins."""
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    piped = subprocess.run([sys.executable, "-m", "evotrainer.cli", "analyzers", "list"], capture_output=True,
                           text=True, env=env)
    assert piped.returncode == 0, piped.stderr
    widths = {len(line) for line in piped.stdout.splitlines() if line.strip()}
    assert max(widths) == 160  # the table's rule lines span the whole width
    narrow = cli("analyzers", "list", columns=80)
    assert max(len(line) for line in narrow.stdout.splitlines()) == 80
    assert len(narrow.stdout.splitlines()) > len(piped.stdout.splitlines())  # the same rows, wrapped at 80
