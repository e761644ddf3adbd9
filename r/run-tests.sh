#!/bin/sh
# Tests the R package as users get it: installs it (building the valve binary
# with cargo through configure) into a temporary library, then runs the
# testthat suite against that installed copy, with VALVE_BINARY pointing at
# ../target/release/valve when it exists. Skipping for want of a binary counts
# as failing here. The last line is always `N passed, N failed` (test blocks),
# and the exit status is non-zero if anything failed.
#
# Usage: r/run-tests.sh  (from anywhere; set VALVE_SKIP_BUILD=1 to install
# without running cargo)

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
R=${R:-R}

lib=$(mktemp -d "${TMPDIR:-/tmp}/valve-r-tests.XXXXXX") || {
  echo "valve: cannot create a temporary library"
  echo "0 passed, 1 failed"
  exit 1
}
trap 'rm -rf "$lib"' EXIT INT TERM

echo "valve: installing the R package into $lib"
if ! "$R" CMD INSTALL --no-multiarch --library="$lib" "$here" >"$lib/install.log" 2>&1; then
  cat "$lib/install.log"
  echo "valve: R CMD INSTALL failed (log above)"
  echo "0 passed, 1 failed"
  exit 1
fi
grep '^valve:' "$lib/install.log"

if [ -x "$root/target/release/valve" ]; then
  VALVE_BINARY="$root/target/release/valve"
  export VALVE_BINARY
fi
echo "valve: testing with ${VALVE_BINARY:-the binary valve_binary() finds (VALVE_BINARY is not set)}"

cd "$here" || exit 1
R_LIBS="$lib${R_LIBS:+:$R_LIBS}" VALVE_TESTS_REQUIRE_BINARY=1 NOT_CRAN=true \
  "$R" --no-echo --no-restore --no-save -e '
  res <- testthat::test_dir(
    "tests/testthat",
    package = "valve", load_package = "installed",
    # One line per file in CI logs, and every test run however many fail.
    reporter = testthat::ProgressReporter$new(
      show_praise = FALSE, max_failures = Inf, update_interval = Inf
    ),
    stop_on_failure = FALSE, stop_on_warning = FALSE
  )
  df <- as.data.frame(res)
  bad <- df$failed > 0 | df$error
  skipped <- !bad & df$skipped
  if (any(skipped)) {
    cat("skipped, counted as failed:", paste(df$test[skipped], collapse = "; "), "\n")
  }
  failed <- sum(bad | skipped)
  cat(sprintf("%d passed, %d failed\n", nrow(df) - failed, failed))
' 2>&1 | tee "$lib/test.out"

last=$(tail -n 1 "$lib/test.out")
case "$last" in
  *" passed, 0 failed") exit 0 ;;
  *" passed, "*" failed") exit 1 ;;
esac
echo "valve: the test run ended before reporting its counts (see above)"
echo "0 passed, 1 failed"
exit 1
