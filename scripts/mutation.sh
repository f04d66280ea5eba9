#!/usr/bin/env bash
# Mutation score of the pure-logic modules (model math, parsing, statistics, judging, scoring).
#
#   scripts/mutation.sh                 every module below, one after another
#   scripts/mutation.sh modelmath sse   only those
#
# Each module is mutated alone (mutmut 3, `pip install -e '.[mutation]'`) in a scratch copy of
# the working tree under $MUTATION_DIR (default /tmp/studyc-mutation), against its fast tests
# only (never the vllm or chromium ones). The repo itself is never written. At the end a table
# gives killed / total per module; surviving mutants are listed in $MUTATION_DIR/<name>.survivors,
# to read with `cd $MUTATION_DIR/<name> && mutmut show <mutant>`.
# Not part of CI: a full run takes tens of minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
MUTMUT="$REPO/.venv/bin/mutmut"
WORK="${MUTATION_DIR:-/tmp/studyc-mutation}"
CHILDREN="${MUTATION_CHILDREN:-2}"

# name | module | fast tests (space separated)
MODULES=(
  "modelmath|compiler/modelmath.py|tests/compiler/test_modelmath.py tests/compiler/test_modelmath_edges.py tests/compiler/test_roofline_placement.py"
  "modelconfig|compiler/modelconfig.py|tests/compiler/test_modelmath.py tests/compiler/test_modelmath_edges.py"
  "expr|compiler/expr.py|tests/compiler/test_expr.py tests/compiler/test_expr_edges.py"
  "sse|runner/load/sse.py|tests/runner/test_sse.py tests/runner/test_sse_edges.py"
  "prometheus|runner/measure/prometheus.py|tests/runner/test_prometheus.py tests/runner/test_prometheus_parse.py"
  "stats|runner/checks/stats.py|tests/runner/test_stats.py tests/runner/test_stats_edges.py tests/runner/test_slo_stats.py tests/runner/test_stats_turns.py"
  "checks|runner/checks/checks.py|tests/runner/test_checks.py tests/runner/test_checks_edges.py tests/runner/test_tails.py"
  "tails|runner/checks/tails.py|tests/runner/test_tails.py"
  "judge|runner/checks/judge.py|tests/runner/test_judge.py tests/runner/test_judge_edges.py"
  "reconcile|runner/checks/reconcile.py|tests/runner/test_reconcile.py tests/runner/test_reconcile_edges.py tests/runner/test_reconcile_monotone.py"
  "context|report/scoring/context.py|tests/report/test_study_context.py tests/report/test_context_edges.py tests/report/test_scoring_branches.py"
  "scoring|report/scoring/scoring.py|tests/report/test_capacity.py tests/report/test_scoring.py tests/report/test_scoring_edges.py tests/report/test_scoring_branches.py tests/report/test_one_launch.py tests/report/test_cliff_scoring.py"
  "verdict|report/stats/verdict.py|tests/report/test_scoring_edges.py tests/report/test_scoring.py tests/report/test_sequential.py"
  "intervals|report/stats/intervals.py|tests/report/test_intervals.py tests/report/test_intervals_edges.py"
  "power|report/stats/power.py|tests/report/test_power.py tests/report/test_block_planner.py"
  "cheapest_design|report/planning/cheapest_design.py|tests/report/test_cheapest_design.py"
  "deciding|report/planning/deciding.py|tests/report/test_one_launch.py tests/report/test_scoring_branches.py"
  "run_compare|report/run_compare.py|tests/report/test_run_compare.py tests/report/test_run_compare_text.py"
  "resume|runner/execute/resume.py|tests/runner/test_resume_blocks.py tests/runner/test_resume_search.py"
  "capacity|compiler/capacity.py|tests/compiler/test_capacity.py"
  "slo|compiler/slo.py|tests/compiler/test_slo.py tests/runner/test_slo_stats.py"
  "workload|compiler/workload.py|tests/compiler/test_workload.py tests/compiler/test_workload_edges.py"
  "shapes|runner/load/shapes.py|tests/runner/test_shapes.py tests/runner/test_shapes_edges.py tests/runner/test_checks_shapes.py"
  "cache|runner/checks/cache.py|tests/runner/test_cache.py"
  "prestart|runner/execute/prestart.py|tests/runner/test_prestart.py"
  "prime|runner/execute/prime.py|tests/runner/test_prime.py"
  "machine|runner/execute/machine.py|tests/runner/test_machine_calibration.py"
  "reaper|runner/execute/reaper.py|tests/runner/test_reaper.py"
  "plan_estimate|compiler/plan_estimate.py|tests/compiler/test_capacity.py"
  "format|base/format.py|tests/report/test_format.py tests/report/test_format_edges.py"
  "capacity_report|report/scoring/capacity.py|tests/report/test_capacity.py"
  "phase_compare|report/phase_compare.py|tests/report/test_phase_compare.py"
  "block_planner|report/planning/block_planner.py|tests/report/test_block_planner.py tests/report/test_block_planner_edges.py tests/report/test_one_launch.py tests/report/test_stored_repeats.py"
  "stored_repeats|report/planning/stored_repeats.py|tests/report/test_stored_repeats.py tests/report/test_block_planner.py"
  "premise|report/scoring/premise.py|tests/report/test_premise.py"
  "stepreplay|compiler/stepreplay.py|tests/compiler/test_stepmodel.py tests/compiler/test_stepreplay_turns.py"
  "fidelity|runner/checks/fidelity.py|tests/runner/test_fidelity.py tests/runner/test_fidelity_edges.py"
  "design_costs|report/planning/design_costs.py|tests/report/test_design_costs.py tests/report/test_design_costs_edges.py"
  "power_text|report/planning/power_text.py|tests/report/test_block_planner_edges.py"
  "fit_cache|report/ledger/fit_cache.py|tests/report/test_fit_cache.py"
  "tables|runner/store/tables.py|tests/runner/test_store_rows.py tests/runner/test_store.py"
  "claims|compiler/claims.py|tests/compiler/test_claims.py"
  "claims_report|report/claims.py|tests/report/test_claims.py"
  "decidability|report/planning/decidability.py|tests/report/test_decidability.py tests/report/test_inconclusive_reason.py"
  "decidability_text|report/planning/decidability_text.py|tests/report/test_decidability_text.py"
  "alpha_ledger|report/stats/alpha_ledger.py|tests/report/test_alpha_ledger.py tests/report/test_alpha_ledger_edges.py"
  "target_card|compiler/target_card.py|tests/compiler/test_target_card.py tests/compiler/test_target_card_edges.py"
  "timefmt|runner/store/timefmt.py|tests/runner/test_timefmt.py"
  "sequential|report/stats/sequential.py|tests/report/test_sequential.py tests/report/test_sequential_edges.py"
)

[ -x "$MUTMUT" ] || { echo "mutmut missing: .venv/bin/pip install -e '.[mutation]'" >&2; exit 2; }
mkdir -p "$WORK"

run_one() {
  local name=$1 module=$2 tests=$3 dir="$WORK/$1" t present=()
  for t in $tests; do [ -f "$REPO/$t" ] && present+=("$t"); done
  rm -rf "$dir" && mkdir -p "$dir"
  # The working tree as git sees it (tracked and untracked, not ignored), plus local tokenizers.
  (git ls-files -co --exclude-standard -z; find models -name 'tokenizer*.json' -print0 2>/dev/null) |
    tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$dir"
  {
    echo "[mutmut]"
    echo "source_paths ="
    printf '    %s\n' base compiler runner report studyc site_templates
    echo "only_mutate = $module"
    echo "also_copy ="
    printf '    %s\n' studies sources models results benchmarks
    echo "pytest_add_cli_args_test_selection ="
    printf '    %s\n' "${present[@]}"
    echo "pytest_add_cli_args ="
    printf '    %s\n' -m "not vllm and not chromium and not ray" -p no:cacheprovider
  } >"$dir/setup.cfg"
  echo "== $name: $module against ${present[*]}"
  (cd "$dir" && nice -n 10 "$MUTMUT" run --max-children "$CHILDREN" >"$dir.log" 2>&1) || {
    echo "mutmut failed for $name; see $dir.log" >&2
    tail -20 "$dir.log" >&2
    return 1
  }
  (cd "$dir" && "$MUTMUT" results --all true) >"$dir.results"
  grep -v ': killed$' "$dir.results" | sed 's/^ *//' >"$dir.survivors" || true
}

summary() {
  printf '%-10s %7s %6s %8s %8s %7s %6s\n' module killed total survived no_tests timeout score
  local name f
  for name in "$@"; do
    f="$WORK/$name.results"
    [ -f "$f" ] || continue
    awk -v name="$name" '
      { s = $0; sub(/^[^:]*: /, "", s); n[s]++; total++ }
      END {
        k = n["killed"] + 0
        printf "%-10s %7d %6d %8d %8d %7d %5.1f%%\n", name, k, total, n["survived"] + 0,
          n["no tests"] + 0, n["timeout"] + 0, total ? 100 * k / total : 0
      }' "$f"
  done
  # All the modules above together: killed / total over every mutant
  for name in "$@"; do [ -f "$WORK/$name.results" ] && cat "$WORK/$name.results"; done | awk '
    / killed$/ { k++ } { t++ }
    END { if (t) printf "%-10s %7d %6d %8s %8s %7s %5.1f%%\n", "all", k, t, "", "", "", 100 * k / t }'
}

selected=()
for entry in "${MODULES[@]}"; do
  IFS='|' read -r name module tests <<<"$entry"
  if [ $# -eq 0 ] || [[ " $* " == *" $name "* ]]; then
    run_one "$name" "$module" "$tests"
    selected+=("$name")
  fi
done
summary "${selected[@]}" | tee "$WORK/summary.txt"
