"""Analyzer code the agents write at run time (harness evolution), and the code contract they follow.

The contract is harness/analyzers/registry.py's ``run_analyzer_code``: the evidence folder is mounted
read-only at ``$EVIDENCE_DIR`` (``metrics.json`` = ``{version: {metric: [[step, value], ...]}}``,
``meta.json`` with recipes, parents, statuses, eval summaries); the code prints a JSON list of
findings (``kind, severity, versions, steps, evidence, explanation``) as the last stdout line. It
runs sandboxed (no network, read-only evidence), so it uses only the standard library.

The offline synthesiser (``harness/synthesis.py``) compiles its kept rules to the same contract
(``compile_program``); the template below is the heuristic brain's hand-written draft. Every draft,
this one and the Claude brain's, is kept only under the synthesiser's rule (``KEEP_RULE``: enough
labels of both outcomes, and a permutation test of its Youden J on the versions of known outcome).
"""

CONTRACT = (
    "Analyzer code contract: plain Python (standard library only). The evidence folder is at "
    "os.environ['EVIDENCE_DIR']: metrics.json = {version: {metric: [[step, value], ...]}} (metric names such as "
    "reward/mean, policy/entropy, completions/mean_length, completions/clipped_ratio, reward/frac_zero_std), "
    "meta.json = {recipes, parents, statuses, eval_summaries}. Print, as the LAST line of stdout, a JSON list of "
    "findings: {kind, severity: info|warn|blocking, versions: [ids], steps: [first, last], evidence: [metric "
    "names], explanation: text with the numbers}."
)

# A version whose mean completion length moved > 30%: against its parent's last-half mean when the
# parent is in the evidence, else from its own first quarter of training to its last quarter. A
# distribution shift the built-in collapse (x0.5) / blow-up (x2) thresholds do not flag.
LENGTH_SHIFT = r'''
import json, os
d = os.environ["EVIDENCE_DIR"]
metrics = json.load(open(os.path.join(d, "metrics.json")))
meta = json.load(open(os.path.join(d, "meta.json")))
parents = meta.get("parents", {})
NAME = "completions/mean_length"

def points(vid):
    return [(s, v) for s, v in metrics.get(vid, {}).get(NAME, []) if v is not None]

def mean(xs):
    return sum(xs) / len(xs) if xs else None

out = []
for vid in sorted(metrics):
    pts = points(vid)
    if len(pts) < 4:
        continue
    q = max(1, len(pts) // 4)
    late = mean([v for _, v in pts[-q:]])
    parent = parents.get(vid)
    ppts = points(parent) if parent else []
    if ppts:
        ref, what = mean([v for _, v in ppts[len(ppts) // 2:]]), f"its parent {parent}"
    else:
        ref, what = mean([v for _, v in pts[:q]]), "its first quarter of training"
    if not ref or ref <= 0:
        continue
    rel = (late - ref) / ref
    if abs(rel) > 0.30:
        out.append({"kind": "length_shift", "severity": "warn", "versions": [vid],
                    "steps": [pts[0][0], pts[-1][0]], "evidence": [NAME],
                    "explanation": f"mean completion length of {vid} ends at {late:.1f} tokens vs {ref:.1f} for "
                                   f"{what} ({rel:+.0%})"})
print(json.dumps(out))
'''
