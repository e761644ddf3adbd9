# The package as r/run-tests.sh installs it: from the tarball, offline, with
# the binary cargo built at install time.

test_that("the installed package carries a stripped valve binary of a few MB", {
  skip_if(!nzchar(Sys.getenv("VALVE_TESTS_INSTALLED")), "only under r/run-tests.sh")
  bin <- system.file("bin", "valve", package = "valve")
  expect_true(nzchar(bin) && file.exists(bin))
  expect_equal(valve_binary(), normalizePath(bin))
  expect_true(valve_available())
  size <- file.size(bin)
  expect_lt(size, 10 * 1024^2)
  # Stripped: no symbol table section left.
  bytes <- readBin(bin, "raw", size)
  expect_length(grepRaw(".symtab", bytes, fixed = TRUE), 0)
  expect_match(processx::run(bin, "--version")$stdout, "^valve ")
})
