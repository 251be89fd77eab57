"""Analyzer code the agents write at run time (harness evolution), and the code contract they follow.

The contract is harness/analyzers.py's ``run_analyzer_code``: the evidence folder is mounted
read-only at ``$EVIDENCE_DIR`` (``metrics.json`` = ``{version: {metric: [[step, value], ...]}}``,
``meta.json`` with recipes, parents, statuses, eval summaries); the code prints a JSON list of
findings (``kind, severity, versions, steps, evidence, explanation``) as the last stdout line. It
runs sandboxed (no network, read-only evidence), so it uses only the standard library.
"""

CONTRACT = (
    "Analyzer code contract: plain Python (standard library only). The evidence folder is at "
    "os.environ['EVIDENCE_DIR']: metrics.json = {version: {metric: [[step, value], ...]}} (metric names such as "
    "reward/mean, policy/entropy, completions/mean_length, completions/clipped_ratio, reward/frac_zero_std), "
    "meta.json = {recipes, parents, statuses, eval_summaries}. Print, as the LAST line of stdout, a JSON list of "
    "findings: {kind, severity: info|warn|blocking, versions: [ids], steps: [first, last], evidence: [metric "
    "names], explanation: text with the numbers}."
)

# A version whose mean completion length moved > 30% relative to its parent's (last-half means):
# a distribution shift that the built-in collapse / blow-up thresholds may not flag.
LENGTH_SHIFT = r'''
import json, os
d = os.environ["EVIDENCE_DIR"]
metrics = json.load(open(os.path.join(d, "metrics.json")))
meta = json.load(open(os.path.join(d, "meta.json")))
parents = meta.get("parents", {})
NAME = "completions/mean_length"

def late_mean(vid):
    pts = [v for _, v in metrics.get(vid, {}).get(NAME, []) if v is not None]
    if not pts:
        return None
    half = pts[len(pts) // 2:]
    return sum(half) / len(half)

out = []
for vid, parent in sorted(parents.items()):
    if not parent:
        continue
    a, b = late_mean(parent), late_mean(vid)
    if a is None or b is None or a <= 0:
        continue
    rel = (b - a) / a
    if abs(rel) > 0.30:
        steps = [s for s, _ in metrics[vid][NAME]]
        out.append({"kind": "length_shift", "severity": "warn", "versions": [vid],
                    "steps": [min(steps), max(steps)], "evidence": [NAME],
                    "explanation": f"mean completion length of {vid} is {b:.1f} tokens vs {a:.1f} for its parent "
                                   f"{parent} ({rel:+.0%}) over the last half of training"})
print(json.dumps(out))
'''
