# The package as r/run-tests.sh installs it: from the tarball, offline, with
# the binary cargo built at install time.

test_that("the installed package carries a stripped valve binary of a few MB", {
  skip_if(!nzchar(Sys.getenv("VALVE_TESTS_INSTALLED")), "only under r/run-tests.sh")
  bin <- system.file("bin", "valve", package = "valve")
  expect_true(nzchar(bin) && file.exists(bin))
  expect_equal(valve_binary(), normalizePath(bin))
  expect_true(valve_available())
  size <- file.size(bin)
  # About 12 MB since HTTPS (rustls and ring, HTTP/2, the ACME client and
  # certificate parsing): under 16 MB, far from an unstripped build's ~100.
  expect_lt(size, 16 * 1024^2)
  # Stripped: no symbol table section left.
  bytes <- readBin(bin, "raw", size)
  expect_length(grepRaw(".symtab", bytes, fixed = TRUE), 0)
  expect_match(processx::run(bin, "--version")$stdout, "^valve ")
})

test_that("without cargo the tarball installs, says how to get the binary, and the lookup goes on", {
  lib <- Sys.getenv("VALVE_TESTS_NOCARGO_LIB")
  skip_if(!nzchar(lib), "only under r/run-tests.sh")
  skip_if_not_installed("callr")
  log <- readLines(Sys.getenv("VALVE_TESTS_NOCARGO_LOG"))
  expect_true(any(grepl("cargo (Rust's package manager) was not found", log, fixed = TRUE)))
  expect_true(any(grepl("installing without the valve binary", log, fixed = TRUE)))
  expect_true(any(grepl("apt-get install cargo rustc", log, fixed = TRUE)))
  expect_true(any(grepl("options(valve.binary = )", log, fixed = TRUE)))
  expect_false(file.exists(file.path(lib, "valve", "bin", "valve")))

  lookup <- function(...) {
    env <- c(callr::rcmd_safe_env(), PATH = "/usr/bin:/bin", VALVE_BINARY = "")
    extra <- c(...)
    env[names(extra)] <- extra
    callr::r(
      function() tryCatch(valve::valve_binary(), valve_no_binary = function(e) "none"),
      libpath = c(lib, .libPaths()),
      env = env
    )
  }
  expect_equal(lookup(), "none")
  installed <- system.file("bin", "valve", package = "valve")
  expect_equal(lookup(VALVE_BINARY = installed), normalizePath(installed))
  dir <- withr::local_tempdir()
  file.copy(installed, file.path(dir, "valve"))
  Sys.chmod(file.path(dir, "valve"), "755")
  expect_equal(lookup(PATH = paste0(dir, ":/usr/bin:/bin")), normalizePath(file.path(dir, "valve")))
})
