#!/usr/bin/env bash
# GTPO as shipped (gtpo/alpha2_0.1: joint Eq. 6 norm, group scope, sequence-weighted statistics) against the
# paper-faithful reading (gtpo/paper_faithful: per_polarity_padded, batch scope for Eq. 6 and the entropy
# shares, token-weighted statistics), same seeds and steps, on the shared testbed (scripts/lib/testbed.sh).
# The default in conf/algorithm/gtpo.yaml was kept or changed from this. Extra arguments are Hydra overrides
# for every run.
#   GTPO_PF_STEPS (default 4, as gtpo_norm.sh) training steps per run; GTPO_PF_DIR (default outputs/gtpo_paper_faithful) the
#   multirun folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup.sh | tail -n 1)"
source scripts/lib/testbed.sh
OUT="${GTPO_PF_DIR:-outputs/gtpo_paper_faithful}"
DOCS=docs/data/gtpo_paper_faithful
timed_sweep "gtpo paper-faithful" "$OUT" "${GTPO_PF_STEPS:-4}" \
    experiment=gtpo/alpha2_0.1,gtpo/paper_faithful seed=0,1 "$@"
"$PY" -m tokenpo.compare "$OUT" --group-by experiment --baseline experiment=gtpo/alpha2_0.1 \
    --target-metric eval/accuracy --target 0.7 --band minmax --out "$DOCS"
# Welch's t-test on the final held-out accuracy of the two groups, from the table's mean, std and run count
"$PY" - "$DOCS/summary.csv" <<'EOF' | tee -a "$DOCS/summary.md"
import csv, math, sys
import numpy as np
rows = list(csv.DictReader(open(sys.argv[1])))
(a, b) = [(r["group"], float(r["final_eval_mean"]), float(r["final_eval_std"]), int(r["n_runs"])) for r in rows]
se2 = [s * s / n for _, _, s, n in (a, b)]
t = (b[1] - a[1]) / math.sqrt(sum(se2))
df = sum(se2) ** 2 / sum(v * v / (n - 1) for v, (_, _, _, n) in zip(se2, (a, b)))
x = np.linspace(0.0, abs(t), 200001)  # two-sided p = 1 - 2 * integral of the t pdf from 0 to |t|
pdf = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi) * (1 + x * x / df) ** (-(df + 1) / 2)
p = 1.0 - 2.0 * float(np.sum((pdf[1:] + pdf[:-1]) / 2) * (x[1] - x[0]))
print(f"\nWelch t-test, final eval/accuracy, {b[0]} minus {a[0]}: difference {b[1] - a[1]:+.3f}, "
      f"t = {t:.2f}, df = {df:.1f}, two-sided p = {p:.2f} (n = {a[3]} and {b[3]})")
EOF
