# R arguments to valve flags (R/args.R).

test_that("extra arguments become flags, underscores becoming dashes", {
  expect_equal(
    valve:::valve_args(list(request_timeout = 30, queue_size = 100L, host = "0.0.0.0")),
    c("--request-timeout", "30", "--queue-size", "100", "--host", "0.0.0.0")
  )
})

test_that("TRUE is a bare flag, FALSE and NULL are left out", {
  expect_equal(
    valve:::valve_args(list(verbose = TRUE, quiet = FALSE, max_age = NULL, port = 0)),
    c("--verbose", "--port", "0")
  )
})

test_that("numbers are written out in full, never in scientific notation", {
  expect_equal(
    valve:::valve_args(list(max_age = 1e6, check_unused = 0.5)),
    c("--max-age", "1000000", "--check-unused", "0.5")
  )
})

test_that("unnamed or unusable extra arguments are refused in R", {
  expect_snapshot(error = TRUE, {
    valve:::valve_args(list(30))
    valve:::valve_args(list(request_timeout = c(1, 2)))
    valve:::valve_args(list(request_timeout = NA))
  })
})

test_that("valve_run() and valve_start() share the flags, with this R for workers", {
  withr::local_envvar(VALVE_R_BIN = NA)
  args <- valve:::common_args(
    "api.R", "127.0.0.1", 3000, 1, 3, 3, 10, 300, list(graceful_timeout = 5),
    call = NULL
  )
  expect_equal(
    args,
    c(
      "--file", "api.R", "--host", "127.0.0.1", "--port", "3000",
      "--n-min", "1", "--n-max", "3", "--workers", "3",
      "--check-unused", "10", "--max-age", "300",
      "--r-bin", file.path(R.home("bin"), "R"),
      "--graceful-timeout", "5"
    )
  )
})

test_that("r_bin and VALVE_R_BIN take the place of this session's R", {
  withr::local_envvar(VALVE_R_BIN = NA)
  args <- valve:::common_args("api.R", "h", 1, 1, 1, 1, 1, 1, list(r_bin = "/opt/R"), call = NULL)
  expect_equal(sum(args == "--r-bin"), 1)
  expect_equal(args[[which(args == "--r-bin") + 1]], "/opt/R")

  withr::local_envvar(VALVE_R_BIN = "/opt/R")
  args <- valve:::common_args("api.R", "h", 1, 1, 1, 1, 1, 1, list(), call = NULL)
  expect_false("--r-bin" %in% args)
})
