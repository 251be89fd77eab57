"""The run's HTML report: one self-contained file in ``RUN/reports/report.html``.

A rendering of stored data (lineage store, its kv stage records, logged metrics), not an agent:
inline CSS, plots as base64 PNG (matplotlib, Agg backend), no scripts and no external links, so
it opens offline. Sections: summary, held-out Avg@k with 95% CIs per version (the no-RL row
included), the lineage tree with each decision and its rationale, metric plots per version
(reward and its components, entropy, length, zero-variance fraction, KL), findings, interventions
tried, analyzers added, skills used, brain usage.

The per-version CI is a percentile bootstrap over held-out problems of the per-problem mean
correctness (2000 resamples, seed 0; Efron & Tibshirani 1993); the gain CIs shown in the decisions
are the promotion gate's paired bootstrap, as stored when the gate ran.
"""

from __future__ import annotations

import base64
import html
import io
import time
from pathlib import Path
from typing import Any

import numpy as np

from evotrainer import metrics as M
from evotrainer.workspace import Workspace

PLOTS: list[tuple[str, str]] = [
    (M.REWARD_MEAN, "reward (total)"), (M.CORRECT_MEAN, "correct fraction"), (M.POLICY_ENTROPY, "entropy (nats/token)"),
    (M.COMPLETIONS_MEAN_LENGTH, "completion length (tokens)"), (M.REWARD_FRAC_ZERO_STD, "zero-variance group fraction"),
    (M.POLICY_KL, "KL to reference (nats/token)"), (M.COMPLETIONS_CLIPPED_RATIO, "truncated fraction"),
]
CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:24px;margin-bottom:4px} h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;margin:8px 0} th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4} .muted{color:#777;font-size:12px} code{background:#f6f6f6;padding:1px 3px}
.kept{color:#1a7f37;font-weight:bold} .pruned{color:#cf222e} .reverted{color:#8250df} .failed{color:#cf222e;font-weight:bold}
.merged{color:#0969da} .trained,.training,.proposed{color:#9a6700}
ul.tree{list-style:none;padding-left:18px;border-left:1px dashed #ccc} ul.tree li{margin:6px 0}
.decision{font-size:12px;color:#444;margin-left:12px} img{max-width:100%} .finding{font-size:12px}
.blocking{color:#cf222e;font-weight:bold} .warn{color:#9a6700} .info{color:#777}
"""


def bootstrap_ci(matrix: dict[str, list[float]], n_boot: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """95% percentile bootstrap CI of Avg@k over problems (per-problem mean correctness); None if empty."""
    if not matrix:
        return None
    per_problem = np.array([np.mean(v) for v in matrix.values()], dtype=float)  # (P,)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(per_problem), size=(n_boot, len(per_problem)))  # (n_boot, P)
    means = per_problem[idx].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def _e(x: Any) -> str:
    return html.escape(str(x))


def _fmt(x: Any, nd: int = 3) -> str:
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else ("" if x is None else _e(x))


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def score_rows(ws: Workspace) -> list[dict[str, Any]]:
    """Rows of the score table: the no-RL row, then each evaluated version (Avg@k, 95% CI, pass@k, k)."""
    lin = ws.lineage
    versions = lin.versions()
    rows = []
    if versions:
        root = versions[0]
        no_rl = lin.kv_get(f"loop/eval/{root.id}/no_rl")
        if no_rl:
            rows.append({"name": "no-RL (base model)", "status": "", "avg": no_rl.get("avg@k"), "k": no_rl.get("k"),
                         "pass": no_rl.get("pass@k"), "ci": bootstrap_ci(lin.eval_matrix(root.id, "no_rl"))})
    for v in versions:
        ev = lin.kv_get(f"loop/eval/{v.id}/heldout") or (v.eval_summary if v.eval_summary.get("eval_name",
                                                                                               "heldout") == "heldout" else {})
        if not ev or ev.get("avg@k") is None:
            continue
        es = v.eval_summary or {}
        rows.append({"name": v.id, "status": v.status, "avg": ev.get("avg@k"), "k": ev.get("k"),
                     "pass": ev.get("pass@k"), "ci": bootstrap_ci(lin.eval_matrix(v.id, "heldout")),
                     "change": v.describe_change(), "vs_parent": es.get("vs_parent"), "vs_control": es.get("vs_control")})
    return rows


def gain_text(g: dict[str, Any] | None) -> str:
    """``+0.125 [+0.031, +0.219] (v1)`` from an ``eval_summary`` gain record (``vs_parent`` / ``vs_control``)."""
    if not g or not isinstance(g.get("gain"), (int, float)):
        return ""
    ci = g.get("ci")
    ci_s = f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if isinstance(ci, (list, tuple)) and len(ci) == 2 else ""
    return f"{g['gain']:+.3f}{ci_s} ({g.get('version')})"


def _compute_and_test(ws: Workspace) -> str:
    """Compute spent (tokens, CPU-seconds, wall) and the final answer's test score."""
    lin = ws.lineage
    c = lin.kv_get("loop/compute") or {}
    final = lin.kv_get("loop/final") or {}
    parts = []
    if c:
        parts.append(f"<p>compute: {c.get('train_tokens', 0)} train tokens (rollouts), {c.get('eval_tokens', 0)} dev "
                     f"eval tokens (the budget counts both), {c.get('no_rl_tokens', 0)} no-RL dev and "
                     f"{c.get('test_tokens', 0)} test eval tokens; {_fmt(c.get('cpu_s'), 0)} CPU-seconds, "
                     f"{_fmt(c.get('wall_s'), 0)} s wall</p>")
    if final.get("test") or final.get("no_rl_test"):
        t, n = final.get("test") or {}, final.get("no_rl_test") or {}
        parts.append(f"<p>test split (sealed during the run): final answer <b>{_e(final.get('version'))}</b> "
                     f"Avg@{_e(t.get('k'))} {_fmt(t.get('avg@k'))} on {_e(t.get('n_problems'))} problems; no-RL "
                     f"{_fmt(n.get('avg@k'))}</p>")
    return "".join(parts) or "<p class='muted'>no compute or test record (an older run, or still in progress)</p>"


def _score_plot(rows: list[dict[str, Any]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return ""
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(rows) + 2), 3))
    xs = np.arange(len(rows))
    avgs = [r["avg"] or 0.0 for r in rows]
    lo = [r["avg"] - r["ci"][0] if r["ci"] else 0 for r in rows]
    hi = [r["ci"][1] - r["avg"] if r["ci"] else 0 for r in rows]
    colors = ["#888" if r["status"] == "" else {"kept": "#1a7f37", "pruned": "#cf222e"}.get(r["status"], "#0969da")
              for r in rows]
    ax.bar(xs, avgs, yerr=[lo, hi], color=colors, capsize=4)
    ax.set_xticks(xs, [r["name"].split(" ")[0] for r in rows])
    ax.set_ylabel(f"held-out Avg@{rows[0].get('k') or 'k'}")
    ax.set_ylim(0, max(0.05, max(a + h for a, h in zip(avgs, hi, strict=True)) * 1.15))
    return _png(fig)


def _metric_plots(ws: Workspace) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    versions = [v for v in ws.lineage.versions() if ws.lineage.last_step(v.id) >= 0]
    if not versions:
        return "<p class='muted'>no training metrics logged yet</p>"
    names = list(PLOTS)
    comps = sorted({n for v in versions for n in ws.lineage.metric_names(v.id)
                    if n.startswith("reward/") and n.endswith("/mean") and n not in (M.REWARD_MEAN, M.CORRECT_MEAN)})
    names += [(c, c) for c in comps]
    series = {v.id: ws.lineage.all_metrics(v.id) for v in versions}
    names = [(n, t) for n, t in names if any(any(x is not None for _, x in series[v].get(n, [])) for v in series)]
    cols = 3
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    for ax, (name, title) in zip(axes.flat, names, strict=False):
        for i, v in enumerate(versions):  # one colour per version in every panel (C0, C1, ...), even where
            pts = series[v.id].get(name, [])  # a version lacks the metric (a reward component it did not have)
            pts = [(s, x) for s, x in pts if x is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=v.id, color=f"C{i % 10}")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=min(8, len(labels)), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return _png(fig)


def _tree(ws: Workspace) -> str:
    lin = ws.lineage
    versions = {v.id: v for v in lin.versions()}
    kids: dict[str | None, list[str]] = {}
    for v in versions.values():
        kids.setdefault(v.parent_id, []).append(v.id)

    def node(vid: str) -> str:
        v = versions[vid]
        ev = lin.kv_get(f"loop/eval/{vid}/heldout") or {}
        change = "; ".join(iv.describe() for iv in v.interventions) or "base recipe"
        head = (f"<b>{_e(vid)}</b> <span class='{_e(v.status)}'>{_e(v.status)}</span> <code>{_e(change)}</code>"
                + (f" &middot; Avg@k {_fmt(ev.get('avg@k'))}" if ev.get("avg@k") is not None else ""))
        decs = "".join(f"<div class='decision'>&#9656; <b>{_e(d.action)}</b> by {_e(d.author)}: {_e(d.rationale)}"
                       f" <span class='muted'>[evidence: {_e(', '.join(d.evidence[:6]))}]</span></div>"
                       for d in lin.decisions(vid))
        sub = "".join(node(c) for c in kids.get(vid, []))
        return f"<li>{head}{decs}" + (f"<ul class='tree'>{sub}</ul>" if sub else "") + "</li>"

    roots = kids.get(None, [])
    return "<ul class='tree'>" + "".join(node(r) for r in roots) + "</ul>" if roots else "<p>empty lineage</p>"


def _findings(ws: Workspace) -> str:
    rows = []
    for v in ws.lineage.versions():
        d = ws.lineage.kv_get(f"loop/diagnose/{v.id}") or {}
        items = d.get("findings") or v.findings or []
        for f in items:
            sev = f.get("severity", "")
            rows.append(f"<tr><td>{_e(v.id)}</td><td>{_e(f.get('kind'))}</td><td class='{_e(sev)}'>{_e(sev)}</td>"
                        f"<td class='finding'>{_e(f.get('explanation', ''))[:600]}</td>"
                        f"<td class='muted'>{_e(', '.join(map(str, f.get('evidence', [])[:4])))}</td></tr>")
    if not rows:
        return "<p class='muted'>no findings recorded</p>"
    return ("<table><tr><th>version</th><th>kind</th><th>severity</th><th>explanation</th><th>evidence</th></tr>"
            + "".join(rows) + "</table>")


def _interventions(ws: Workspace) -> str:
    rows = []
    for v in ws.lineage.versions():
        if not v.interventions and not v.is_control:
            continue
        gate = ws.lineage.kv_get(f"loop/gate/{v.id}") or {}
        es = v.eval_summary or {}
        vs_parent = es.get("vs_parent") or ({"gain": gate.get("gain"), "ci": gate.get("ci"), "version": v.parent_id}
                                            if gate.get("baseline_id", v.parent_id) == v.parent_id else None)
        vs_p, vs_c = gain_text(vs_parent), gain_text(es.get("vs_control"))
        ivs = v.interventions or [None]
        for iv in ivs:
            change = iv.describe() if iv else v.describe_change()
            rows.append(f"<tr><td>{_e(v.id)}</td><td>{_e(v.parent_id)}</td><td><code>{_e(change)}</code></td>"
                        f"<td>{_e(iv.category if iv else 'control')}</td><td>{_e(iv.hypothesis if iv else v.note)[:300]}"
                        f"</td><td>{_e(iv.source if iv else 'loop')}</td>"
                        f"<td class='{_e(v.status)}'>{_e(v.status)}</td><td>{_e(vs_c)}</td><td>{_e(vs_p)}</td></tr>")
    if not rows:
        return "<p class='muted'>no interventions tried</p>"
    return ("<table><tr><th>version</th><th>parent</th><th>change</th><th>category</th><th>hypothesis</th>"
            "<th>source</th><th>outcome</th><th>gain vs control [95% CI]</th><th>gain vs parent [95% CI]</th></tr>"
            + "".join(rows) + "</table>")


def _analyzers(ws: Workspace) -> str:
    """Harness evolution: rules searched and kept (with their numbers), drafts judged, inherited analyzers
    and how they did on this run's versions, and the branches a trusted analyzer would have stopped early."""
    searched, drafts, inherited, uses, stops = [], [], [], [], []
    for key, items in ws.lineage.kv_items("loop/r"):
        if not key.endswith("/evolve"):
            continue
        rnd = key.split("/")[1]
        for a in items or []:
            t = a.get("type", "draft")
            {"synthesis": searched, "draft": drafts, "inherited": inherited, "use": uses,
             "early_stop": stops}.get(t, drafts).append((rnd, a))
    if not any((searched, drafts, inherited, uses, stops)):
        return "<p class='muted'>no analyzer was added (no unexplained held-out move)</p>"
    parts = []
    if searched:
        tried = sum(a.get("n_candidates", 0) for _, a in searched)
        kept = [(r, a) for r, a in searched if a.get("registered")]
        parts.append(f"<p>Offline synthesis: {len(searched)} search(es), {tried} candidate rules tried, "
                     f"{len(kept)} kept and registered.</p>")
        rows = []
        for rnd, a in searched:
            loo = a.get("loo") or {}
            p = a.get("p_value")
            rows.append(f"<tr><td>{_e(rnd)}</td><td><code>{_e(a.get('describe') or '-')}</code></td>"
                        f"<td>{a.get('n_labels', 0)} ({a.get('n_bad', 0)} bad / {a.get('n_good', 0)} good)</td>"
                        f"<td>{a.get('n_candidates', 0)}</td><td>{_fmt(loo.get('precision'), 2)}</td>"
                        f"<td>{_fmt(loo.get('recall'), 2)}</td><td>{_fmt(p)}</td>"
                        f"<td>{'yes' if a.get('registered') else 'no'}</td><td>{_e(a.get('reason', ''))}</td></tr>")
        parts.append("<table><tr><th>round</th><th>best rule</th><th>labels</th><th>candidates</th>"
                     "<th>precision (leave-one-out)</th><th>recall (leave-one-out)</th><th>permutation p</th>"
                     "<th>kept</th><th>why</th></tr>" + "".join(rows) + "</table>")
    if drafts:
        parts.append("<table><tr><th>version</th><th>drafted analyzer</th><th>registered</th><th>why</th></tr>" + "".join(
            f"<tr><td>{_e(a.get('version'))}</td><td>{_e(a.get('name') or '-')}</td>"
            f"<td>{'yes' if a.get('registered') else 'no'}</td><td>{_e(a.get('reason', ''))}</td></tr>"
            for _, a in drafts) + "</table>")
    if inherited:
        parts.append("<p>Inherited from earlier runs: " + ", ".join(
            f"<code>{_e(a.get('name'))}</code> ({_e(a.get('reason', ''))})" for _, a in inherited) + "</p>")
    if uses:
        fired = [a for _, a in uses if a.get("fired")]
        right = sum(bool(a.get("correct")) for a in fired)
        parts.append(f"<p>Used on this run's decided versions: {len(uses)} checks, fired {len(fired)} times, "
                     f"{right} of them on a version that turned out bad.</p><table><tr><th>analyzer</th>"
                     "<th>version</th><th>fired</th><th>outcome</th><th>from</th></tr>" + "".join(
                         f"<tr><td>{_e(a.get('name'))}</td><td>{_e(a.get('version'))}</td>"
                         f"<td>{'yes' if a.get('fired') else 'no'}</td><td>{'bad' if a.get('bad') else 'good'}</td>"
                         f"<td>{_e(a.get('origin') or '')}</td></tr>" for _, a in uses) + "</table>")
    if stops:
        parts.append("<p>Decisions it would change (early stop at half the training steps):</p><ul>" + "".join(
            f"<li>{_e(a.get('version'))}: {'stop' if a.get('stop') else 'continue'}"
            f" ({_e(a.get('reason', ''))}); saves {a.get('saved_steps', 0)} steps; actual outcome "
            f"{_e(a.get('actual'))}, {'right' if a.get('right') else 'wrong'}</li>" for _, a in stops) + "</ul>")
    return "".join(parts)


def _skills(ws: Workspace) -> str:
    used: dict[str, list[str]] = {}
    for key, prop in ws.lineage.kv_items("loop/r"):
        if key.endswith("/propose"):
            for sid in prop.get("skills_used", []):
                used.setdefault(sid, []).append(f"proposed for {prop.get('parent_id')}")
    for v in ws.lineage.versions():
        for iv in v.interventions:
            if iv.source.startswith("skill:"):
                used.setdefault(iv.source.split(":", 1)[1], []).append(f"{v.id} ({v.status}): {iv.describe()}")
    if not used:
        return "<p class='muted'>no skill from memory was used</p>"
    return ("<table><tr><th>skill</th><th>use</th></tr>" + "".join(
        f"<tr><td><code>{_e(k)}</code></td><td>{_e('; '.join(v))}</td></tr>" for k, v in sorted(used.items()))
            + "</table>")


def render_html(ws: Workspace) -> str:
    """The report as one HTML string (see the module docstring)."""
    lin = ws.lineage
    cfg = lin.kv_get("loop/config") or {}
    mode = lin.kv_get("loop/mode", "evotrainer")
    usage = lin.kv_get("loop/usage") or {}
    rows = score_rows(ws)
    score_tbl = "".join(
        f"<tr><td>{_e(r['name'])}</td><td class='{_e(r['status'])}'>{_e(r['status'])}</td><td>{_fmt(r['avg'])}</td>"
        f"<td>{'[' + _fmt(r['ci'][0]) + ', ' + _fmt(r['ci'][1]) + ']' if r['ci'] else ''}</td>"
        f"<td>{_fmt(r['pass'])}</td><td>{_e(r['k'])}</td><td>{_e(gain_text(r.get('vs_control')))}</td>"
        f"<td>{_e(gain_text(r.get('vs_parent')))}</td></tr>" for r in rows)
    budget = cfg.get("budget", {})
    started = lin.kv_get("loop/started_at")
    head = (f"<p class='muted'>run <code>{_e(ws.root)}</code> &middot; mode <b>{_e(mode)}</b> &middot; brain "
            f"<b>{_e(lin.kv_get('loop/brain', '-'))}</b> &middot; model <code>"
            f"{_e(cfg.get('recipe', {}).get('model', {}).get('name_or_path', '?'))}</code> &middot; task "
            f"{_e(cfg.get('recipe', {}).get('data', {}).get('task', '?'))} level "
            f"{_e(cfg.get('recipe', {}).get('data', {}).get('level', '?'))} &middot; budget {_e(budget)}"
            + (f" &middot; started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}" if started else "")
            + f" &middot; {'finished' if lin.kv_get('loop/finished') else 'in progress / interrupted'}</p>")
    use = ""
    if usage.get("turns"):
        use = (f"<h2>Brain usage</h2><p>{_e(usage.get('model', ''))}: {usage.get('calls', 0)} role calls, "
               f"{usage.get('turns', 0)} model turns, {usage.get('input_tokens', 0)} input + "
               f"{usage.get('output_tokens', 0)} output tokens, ${usage.get('cost_usd', 0):.4f}; "
               f"{usage.get('fallbacks', 0)} fallbacks to the heuristic brain</p>")
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>EvoTrainer report: {_e(ws.root.name)}</title>
<style>{CSS}</style></head><body>
<h1>EvoTrainer run report</h1>{head}
<h2 id="scores">Held-out scores</h2>
<table id="score-table"><tr><th>version</th><th>status</th><th>Avg@k</th><th>95% CI (bootstrap over problems)</th><th>pass@k</th><th>k</th><th>gain vs control [95% CI]</th><th>gain vs parent [95% CI]</th></tr>{score_tbl}</table>
{_score_plot(rows)}
<h2 id="compute">Compute and test</h2>{_compute_and_test(ws)}
<h2 id="lineage">Lineage and decisions</h2>{_tree(ws)}
<h2 id="metrics">Training metrics per version</h2>{_metric_plots(ws)}
<h2 id="findings">Findings</h2>{_findings(ws)}
<h2 id="interventions">Interventions tried</h2>{_interventions(ws)}
<h2 id="analyzers">Analyzers added</h2>{_analyzers(ws)}
<h2 id="skills">Skills used</h2>{_skills(ws)}
{use}
<p class="muted">generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} by evotrainer report</p>
</body></html>"""


def write_report(ws: Workspace, name: str = "report.html") -> Path:
    """Write the report to ``RUN/reports/<name>``; returns its path."""
    out = ws.path("reports", name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(render_html(ws), encoding="utf-8")
    tmp.replace(out)
    return out


def summary_table(ws: Workspace) -> Any:
    """A rich table for the terminal: per version status, change, Avg@k with CI (the no-RL row first)."""
    from rich.table import Table

    t = Table(title=f"EvoTrainer run {ws.root.name}")
    for c in ("version", "status", "change"):  # text folds over lines at 80 columns, never cut
        t.add_column(c, overflow="fold", ratio=1 if c == "change" else None)
    for c in ("Avg@k", "95% CI"):  # numbers stay whole: "[0.250, 0.500]" never splits
        t.add_column(c, no_wrap=True, justify="right")
    rows = score_rows(ws)
    gains = [c for c in ("vs_control", "vs_parent") if any(r.get(c) for r in rows)]  # only where a gain exists
    for c in gains:  # "+0.068 [+0.005, +0.125]" wraps at its spaces, numbers whole
        t.add_column(c.replace("_", " "), justify="right")
    for r in rows:
        ci = f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if r["ci"] else ""
        t.add_row(r["name"], r["status"], r.get("change", ""), _fmt(r["avg"]), ci, *(gain_text(r.get(c)) for c in gains))
    return t
