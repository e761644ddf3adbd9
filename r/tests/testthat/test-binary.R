# Finding the binary (R/binary.R): option, then VALVE_BINARY, then the
# installed copy, then the PATH.

fake_binary <- function(dir, name = "valve") {
  path <- file.path(dir, name)
  writeLines("#!/bin/sh\nexit 0", path)
  Sys.chmod(path, "755")
  normalizePath(path)
}

test_that("the lookup order is option, VALVE_BINARY, installed copy, PATH", {
  dir <- withr::local_tempdir()
  opt <- fake_binary(dir, "from-option")
  env <- fake_binary(dir, "from-env")
  installed <- fake_binary(dir, "installed")
  on_path <- file.path(dir, "path")
  dir.create(on_path)
  in_path <- fake_binary(on_path)
  withr::local_envvar(PATH = on_path)

  withr::local_options(valve.binary = opt)
  withr::local_envvar(VALVE_BINARY = env)
  expect_equal(valve:::find_binary(installed), opt)

  withr::local_options(valve.binary = NULL)
  expect_equal(valve:::find_binary(installed), env)

  withr::local_envvar(VALVE_BINARY = NA)
  expect_equal(valve:::find_binary(installed), installed)

  expect_equal(valve:::find_binary(file.path(dir, "not-installed")), in_path)
})

test_that("the option and VALVE_BINARY accept ~ paths", {
  home <- withr::local_tempdir()
  withr::local_envvar(HOME = home, VALVE_BINARY = NA)
  path <- fake_binary(home)
  withr::local_options(valve.binary = "~/valve")
  expect_equal(valve:::find_binary("/nonexistent"), path)
})

test_that("no binary anywhere: the error names every place tried", {
  empty <- withr::local_tempdir()
  withr::local_envvar(PATH = empty, VALVE_BINARY = NA)
  withr::local_options(valve.binary = NULL)
  expect_snapshot(
    valve:::find_binary("/usr/lib/R/site-library/valve/bin/valve"),
    error = TRUE
  )
  expect_error(valve:::find_binary("/nonexistent"), class = "valve_no_binary")
})

test_that("a set but wrong option or VALVE_BINARY is an error, not skipped", {
  dir <- withr::local_tempdir()
  installed <- fake_binary(dir, "installed")
  not_exec <- file.path(dir, "not-exec")
  writeLines("", not_exec)
  Sys.chmod(not_exec, "644")

  withr::local_options(valve.binary = "/nonexistent/valve")
  expect_snapshot(valve:::find_binary(installed), error = TRUE)

  withr::local_options(valve.binary = NULL)
  withr::local_envvar(VALVE_BINARY = not_exec)
  expect_error(valve:::find_binary(installed), "is not an executable file", class = "valve_no_binary")
  withr::local_envvar(VALVE_BINARY = dir)
  expect_error(valve:::find_binary(installed), "is not an executable file", class = "valve_no_binary")
})
