#!/bin/sh
# Tests the R package as R users get it:
#   1. bundles valve's Rust sources and vendored crates into a copy of r/
#      (tools/bundle; the checkout is left as it is);
#   2. R CMD build: the source tarball valve_<version>.tar.gz;
#   3. installs that tarball into a temporary library with the network cut
#      (unshare --net, as root), so cargo builds valve from the vendored crates
#      alone; checks nothing was written to the home directory;
#   4. runs the testthat suite against that installed copy and its binary.
# A test skipped for want of a binary counts as failed; a test skipped as
# "pending in valve" (a valve feature this binary does not have yet) is listed
# apart. The last line is always `N passed, N failed` (test blocks), and the
# exit status is non-zero if anything failed.
#
# Usage: r/run-tests.sh  (from anywhere)
#   VALVE_SOURCE_ROOT=DIR  take the Rust sources from DIR instead of the
#                          repository r/ is in
#   VALVE_BINARY=PATH      used only to run the vignette's code while building
#                          the tarball; the tests use the installed binary
#   VALVE_KEEP_TARBALL=DIR copy the tarball there

here=$(cd "$(dirname "$0")" && pwd)
root=${VALVE_SOURCE_ROOT:-$(dirname "$here")}
R=${R:-R}

fail() {
  echo "valve: $*"
  echo "0 passed, 1 failed"
  exit 1
}

work=$(mktemp -d "${TMPDIR:-/var/tmp}/valve-r-tests.XXXXXX") || fail "cannot create a temporary directory"
trap 'rm -rf "$work"' EXIT INT TERM
# Passable by every user, as a site library is (mktemp makes it 0700): as root,
# valve gives each app a user of its own, which must reach the package's example
# apps, and valve's binary in the library below must be reachable as well.
chmod 0755 "$work"
lib="$work/lib"
mkdir -p "$lib" "$work/src" "$work/build" "$work/home"

# 1. A copy of the package, without anything a previous install or bundle left.
cp -R "$here" "$work/src/valve" || fail "cannot copy $here"
(cd "$work/src/valve" && rm -rf src/rust src/Makevars src/valve-binary inst/bin inst/AUTHORS ./*.tar.gz ./*.Rcheck)
echo "valve: bundling the Rust sources of $root"
"$work/src/valve/tools/bundle" "$root" >"$work/bundle.log" 2>&1 || {
  cat "$work/bundle.log"
  fail "tools/bundle failed (log above)"
}
grep '^bundle: wrote' "$work/bundle.log"

# 2. The tarball. Building the vignette installs the package once more: that
# install skips cargo (VALVE_SKIP_BUILD) and runs the vignette's code with
# $VALVE_BINARY when it is set.
echo "valve: R CMD build"
(cd "$work/build" && VALVE_SKIP_BUILD=1 "$R" CMD build "$work/src/valve" >"$work/build.log" 2>&1) || {
  cat "$work/build.log"
  fail "R CMD build failed (log above)"
}
tarball=$(ls "$work/build"/valve_*.tar.gz 2>/dev/null | head -n 1)
[ -n "$tarball" ] || fail "R CMD build made no tarball"
echo "valve: built $(basename "$tarball") ($(du -k "$tarball" | cut -f1) KB)"
if [ -n "${VALVE_KEEP_TARBALL:-}" ]; then
  mkdir -p "$VALVE_KEEP_TARBALL" && cp "$tarball" "$VALVE_KEEP_TARBALL/"
fi

# 3. Install offline, with an empty home to see that nothing lands there.
offline=""
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null 2>&1 && unshare --net true 2>/dev/null; then
  offline="unshare --net"
  echo "valve: installing $(basename "$tarball") with the network cut (unshare --net)"
else
  echo "valve: ******************************************************************"
  echo "valve: WARNING: not root (or unshare --net refused): installing WITH the"
  echo "valve: network; the offline build is NOT tested in this run."
  echo "valve: ******************************************************************"
fi
cargo_path=$(command -v cargo 2>/dev/null || echo "$HOME/.cargo/bin/cargo")
# rustup's toolchains stay where they are (read, never written).
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
started=$(date +%s)
HOME="$work/home" RUSTUP_HOME="$rustup_home" PATH="$(dirname "$cargo_path"):$PATH" \
  $offline "$R" CMD INSTALL --library="$lib" "$tarball" >"$work/install.log" 2>&1 || {
  cat "$work/install.log"
  fail "R CMD INSTALL failed (log above)"
}
took=$(( $(date +%s) - started ))
grep -E '^(valve:|cargo [0-9]|rustc [0-9])|Finished' "$work/install.log"
echo "valve: installed in ${took} s"
[ -x "$lib/valve/bin/valve" ] || {
  cat "$work/install.log"
  fail "the install has no bin/valve (log above)"
}
left=$(cd "$work/home" && find . -mindepth 1 | head -n 5)
[ -z "$left" ] || fail "the install wrote to the home directory: $left"

# 3b. The same tarball where there is no cargo: it installs, without the
# binary, and says how to get one (the tests check what it said).
nocargo_lib="$work/lib-nocargo"
mkdir -p "$nocargo_lib" "$work/home-nocargo"
nocargo_path="$(dirname "$(command -v "$R")"):/usr/bin:/bin"
if PATH="$nocargo_path" command -v cargo >/dev/null 2>&1; then
  echo "valve: cargo is in /usr/bin here: the install without cargo is not tested"
  nocargo_lib=""
else
  HOME="$work/home-nocargo" PATH="$nocargo_path" env -u CARGO -u RUSTC \
    "$R" CMD INSTALL --library="$nocargo_lib" "$tarball" >"$work/install-nocargo.log" 2>&1 || {
    cat "$work/install-nocargo.log"
    fail "R CMD INSTALL without cargo failed (log above)"
  }
  echo "valve: installed again without cargo: $(grep -c '^valve:' "$work/install-nocargo.log") lines of advice"
fi

# 4. The tests, against the installed package and its own binary.
cd "$here" || exit 1
env -u VALVE_BINARY R_LIBS="$lib${R_LIBS:+:$R_LIBS}" VALVE_TESTS_REQUIRE_BINARY=1 \
  VALVE_TESTS_INSTALLED=1 VALVE_TESTS_NOCARGO_LIB="$nocargo_lib" \
  VALVE_TESTS_NOCARGO_LOG="$work/install-nocargo.log" NOT_CRAN=true \
  "$R" --no-echo --no-restore --no-save -e '
  options(valve.binary = NULL)
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
  skip_msgs <- lapply(res, function(t) {
    r <- Filter(function(e) inherits(e, "expectation_skip"), t$results)
    vapply(r, conditionMessage, "")
  })
  pending <- vapply(skip_msgs, function(m) length(m) > 0 && all(grepl("pending in valve", m, fixed = TRUE)), TRUE)
  bad <- df$failed > 0 | df$error
  skipped <- !bad & df$skipped & !pending
  if (any(pending & !bad)) {
    cat("pending (valve feature not in this binary yet, not counted):\n")
    cat(paste0("  ", df$test[pending & !bad], ": ", vapply(skip_msgs[pending & !bad], `[`, "", 1), "\n"), sep = "")
  }
  if (any(skipped)) {
    cat("skipped, counted as failed:", paste(df$test[skipped], collapse = "; "), "\n")
  }
  failed <- sum(bad | skipped)
  cat(sprintf("%d passed, %d failed\n", sum(!bad & !skipped & !pending), failed))
' 2>&1 | tee "$work/test.out"

last=$(tail -n 1 "$work/test.out")
case "$last" in
  *" passed, 0 failed") exit 0 ;;
  *" passed, "*" failed") exit 1 ;;
esac
echo "valve: the test run ended before reporting its counts (see above)"
echo "0 passed, 1 failed"
exit 1
