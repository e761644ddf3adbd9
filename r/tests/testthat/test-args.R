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

test_that("arguments left NULL are not passed: valve's defaults apply", {
  withr::local_envvar(VALVE_R_BIN = NA)
  cmd <- valve:::valve_command(
    "api.R", list(host = NULL, port = 0, n_min = NULL, n_max = 5),
    list(graceful_timeout = 5),
    call = NULL
  )
  expect_equal(
    cmd$args,
    c(
      "--file", "api.R", "--port", "0", "--n-max", "5", "--graceful-timeout", "5",
      "--r-bin", file.path(R.home("bin"), "R")
    )
  )
  expect_null(cmd$cleanup)
})

test_that("a .toml path is a config file, anything else an app file or folder", {
  withr::local_envvar(VALVE_R_BIN = "/opt/R")
  expect_equal(valve:::valve_command("sites/valve.toml", list(), list(), NULL)$args, c("--config", "sites/valve.toml"))
  expect_equal(valve:::valve_command("apps/VALVE.TOML", list(), list(), NULL)$args, c("--config", "apps/VALVE.TOML"))
  expect_equal(valve:::valve_command("shiny-app", list(), list(), NULL)$args, c("--file", "shiny-app"))
  expect_equal(valve:::valve_command(NULL, list(), list(), NULL)$args, character())
  # The reference tool's name for the app.
  expect_equal(valve:::valve_command(NULL, list(), list(filepath = "api.R"), NULL)$args, c("--file", "api.R"))
  expect_error(valve:::valve_command("a.R", list(), list(filepath = "b.R"), NULL), "not both")
})

test_that("r_bin and VALVE_R_BIN take the place of this session's R", {
  withr::local_envvar(VALVE_R_BIN = NA)
  args <- valve:::valve_command("api.R", list(), list(r_bin = "/opt/R"), call = NULL)$args
  expect_equal(sum(args == "--r-bin"), 1)
  expect_equal(args[[which(args == "--r-bin") + 1]], "/opt/R")

  withr::local_envvar(VALVE_R_BIN = "/opt/R")
  args <- valve:::valve_command("api.R", list(), list(), call = NULL)$args
  expect_false("--r-bin" %in% args)
})

test_that("what valve cannot serve is refused in R", {
  expect_snapshot(error = TRUE, {
    valve:::valve_command(c("a.R", "b.R"), list(), list(), NULL)
    valve:::valve_command(42, list(), list(), NULL)
  })
  skip_if_not_installed("shiny")
  app <- shiny::shinyApp(shiny::fluidPage(), function(input, output) NULL)
  expect_error(valve:::valve_command(app, list(), list(), NULL), "from its files")
})
