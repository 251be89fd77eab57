"""Cold start of the CLI from the shell: each command in a fresh interpreter, beside its peer.

- ``evotrainer --version`` / ``--help``; peer: the same after importing the modules the entry point
  imported before issue 21 (recipe, intervention, lineage, workspace, importer, for its error list);
- ``evotrainer skills search "truncation"`` on a seeded store (created first, not timed); peers: the
  same command with the query embedded by sentence-transformers (torch), the path before issue 21, and the
  same command after a plain ``import lancedb`` (its REST namespace client imported eagerly, the path before
  ``evotrainer.lazy.import_lancedb``);
- ``evotrainer serve all --run RUN`` with stdin at end of file: the stdio server starts, reads EOF and exits,
  so the figure is its start-up (imports, tool catalogue) plus shutdown; peer: the same after importing
  torch, lancedb and the local backend first, what the servers' module-level imports loaded before.

Where the search's time goes: ``import lancedb`` alone, ``import lancedb`` with LanceDB's REST namespace client
(``lance_namespace``, imported by ``lancedb.db`` and unused for a local folder) imported first and timed apart,
and a bare interpreter (``pass``), each in a fresh interpreter, interleaved with the commands.

Each figure is the median of ``--repeat`` runs, peers interleaved, with wall seconds, CPU seconds
(user + system of the child) and peak RSS (MiB); the load average is printed beside them.

Usage: ``python benchmarks/cli_cold.py [--repeat 3] [--json]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from _report import print_result

OLD_IMPORTS = ("import evotrainer.recipe, evotrainer.intervention, evotrainer.lineage, evotrainer.workspace, "
               "evotrainer.harness.importer; ")
OLD_SERVE_IMPORTS = "import torch, lancedb, evotrainer.rl_backend.local, evotrainer.skills_db.embeddings; "
MAKE_RUN = ("import sys; from evotrainer.recipe import Recipe; from evotrainer.workspace import Workspace; "
            "ws = Workspace(sys.argv[1], writer=True); ws.lineage.create_root(Recipe()); ws.close()")
ST_QUERY = ("import functools; from evotrainer.skills_db import embeddings as E; "
            "st = functools.cache(lambda: __import__('sentence_transformers').SentenceTransformer("
            "str(E.model_dir()), device='cpu')); "
            "E.embed_query = lambda text: st().encode([text], normalize_embeddings=True)[0]; ")


def run(code: str, args: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of ``python -c code`` with ``sys.argv[1:] = args`` (GNU time)."""
    p = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", sys.executable, "-c", code, *args], env=env,
                       capture_output=True, text=True, timeout=300, input="")
    if p.returncode != 0:
        raise SystemExit(f"{args}: exit {p.returncode}: {p.stderr[-2000:]}")
    wall, user, sys_, rss_kb = p.stderr.strip().splitlines()[-1].split()
    return float(wall), float(user) + float(sys_), int(rss_kb) / 1024


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    main_code = "import sys; sys.argv[0] = 'evotrainer'; from evotrainer.cli import main; main()"
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "EVOTRAINER_SKILLS_DIR": d, "HF_HUB_OFFLINE": "1"}
        subprocess.run([sys.executable, "-c", main_code, "skills", "list"], env=env, capture_output=True,
                       check=True, timeout=300)  # creates and seeds the store
        run_dir = os.path.join(d, "run")
        subprocess.run([sys.executable, "-c", MAKE_RUN, run_dir], env=env, check=True, timeout=300)
        cases = {
            "--version": (main_code, OLD_IMPORTS + main_code, ["--version"]),
            "--help": (main_code, OLD_IMPORTS + main_code, ["--help"]),
            "skills search": (main_code, ST_QUERY + main_code, ["skills", "search", "truncation", "-n", "3"]),
            "skills search, eager lancedb": (main_code, "import lancedb; " + main_code,
                                             ["skills", "search", "truncation", "-n", "3"]),
            "serve (start, EOF)": (main_code, OLD_SERVE_IMPORTS + main_code, ["serve", "all", "--run", run_dir]),
        }
        res: dict[str, dict] = {}
        parts = {"python (pass)": "pass", "import lancedb": "import lancedb",
                 "import lancedb, REST client deferred": "from evotrainer.lazy import import_lancedb; import_lancedb()",
                 "import lance_namespace": "import lance_namespace"}
        timed: dict[str, list] = {k: [] for k in parts}
        for _ in range(a.repeat):
            for k, code in parts.items():
                timed[k].append(run(code, [], env))
        res["imports"] = {k: {"wall_s": round(statistics.median(x[0] for x in v), 2),
                              "cpu_s": round(statistics.median(x[1] for x in v), 2)} for k, v in timed.items()}
        for name, (new, old, args) in cases.items():
            figs: dict[str, list] = {"new": [], "old": []}
            for _ in range(a.repeat):
                for key, code in (("new", new), ("old", old)):
                    figs[key].append(run(code, args, env))
            res[name] = {k: {"wall_s": round(statistics.median(x[0] for x in v), 2),
                             "cpu_s": round(statistics.median(x[1] for x in v), 2),
                             "peak_rss_mib": round(statistics.median(x[2] for x in v))} for k, v in figs.items()}
    res["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print_result(res, a.json, 16)
    return res


if __name__ == "__main__":
    main()
