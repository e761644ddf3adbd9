# The handle's view of valve: status, metrics and log.

test_that("status(), metrics() and log() read valve's own pages and log", {
  skip_if_no_valve()
  api <- local_valve(n_min = 2, n_max = 3)
  expect_equal(fetch(paste0(api$url, "/echo?msg=hi"))$status, 200L)

  status <- api$status()
  expect_true(is.list(status))
  expect_gte(length(status$workers$pid), 2)
  expect_true(all(status$workers$pid %in% pids_of(valve_tree(api$pid))[-1]))

  metrics <- api$metrics()
  expect_named(metrics, c("name", "labels", "value"))
  expect_true(any(startsWith(metrics$name, "valve_")))
  expect_true(is.numeric(metrics$value))
  raw <- api$metrics(raw = TRUE)
  expect_match(raw, "# TYPE", fixed = TRUE)

  log <- api$log()
  expect_true(any(grepl("worker ready", log, fixed = TRUE)))
  expect_length(api$log(1), 1)
  expect_false(any(grepl("\033[", log, fixed = TRUE)))
})

test_that("a config file of several apps is passed to valve as --config", {
  skip_if_no_valve()
  skip_unless_valve_has("--config files of several apps", "--config")
  dir <- withr::local_tempdir()
  dir.create(file.path(dir, "a"))
  dir.create(file.path(dir, "b"))
  file.copy(example_api(), file.path(dir, "a", "plumber.R"))
  file.copy(example_api(), file.path(dir, "b", "plumber.R"))
  writeLines(c(
    "[[app]]", 'name = "a"', 'path = "/a"', 'file = "a/plumber.R"', "",
    "[[app]]", 'name = "b"', 'path = "/b"', 'file = "b/plumber.R"'
  ), file.path(dir, "valve.toml"))
  api <- valve_start(file.path(dir, "valve.toml"), timeout = 90)
  withr::defer(valve_stop(api, timeout = 10))
  expect_equal(sort(api$apps$name), c("a", "b"))
  expect_equal(fetch(paste0(api$url, "/a/echo?msg=1"))$status, 200L)
  expect_equal(fetch(paste0(api$url, "/b/echo?msg=2"))$status, 200L)
})
