# valve in the background (R/start.R): start, call, stop, and the errors users
# see when it cannot start.

test_that("valve_start() serves the example API until valve_stop()", {
  skip_if_no_valve()
  api <- valve_start(example_api(), port = 0, n_min = 1, n_max = 3, timeout = 60)
  tree <- valve_tree(api$pid)
  withr::defer(lapply(tree, function(h) try(ps::ps_kill(h), silent = TRUE)))

  expect_match(api$url, "^http://127\\.0\\.0\\.1:[0-9]+$")
  expect_gt(api$port, 0L)
  expect_equal(api$app, normalizePath(example_api()))
  expect_equal(c(api$n_min, api$n_max), c(1L, 3L))
  expect_length(tree, 2) # valve and one worker
  # As root, valve gives the app a user of its own: its worker is not root.
  if (valve:::is_root()) expect_false(ps::ps_uids(tree[[2]])[["effective"]] == 0L)

  echo <- fetch(paste0(api$url, "/echo?msg=hello"))
  expect_equal(echo$status, 200L)
  expect_match(echo$body, "The message is: 'hello'", fixed = TRUE)
  sum <- fetch(paste0(api$url, "/sum"), post_json = '{"a": 1, "b": 2}')
  expect_equal(sum$status, 200L)
  expect_equal(sum$body, "[3]")
  # The request was answered by the worker valve started, not by this session.
  slept <- fetch(paste0(api$url, "/sleep?zzz=0"))
  expect_match(slept$body, paste0('"pid":[', ps::ps_pid(tree[[2]]), "]"), fixed = TRUE)

  expect_equal(valve_stop(api), 0L)
  expect_true(all_gone(tree), info = paste("still running:", toString(pids_of(tree))))
  expect_false(api$process$is_alive())
  # Stopping twice is harmless.
  expect_equal(valve_stop(api), 0L)
})

test_that("printing a handle shows its URL and worker counts", {
  skip_if_no_valve()
  api <- local_valve(n_min = 2, n_max = 4)
  expect_true(wait_for(function() valve:::worker_count(api$pid) == 2))
  out <- capture.output(print(api))
  expect_match(out[[1]], paste0("<valve> ", api$url, " (running, pid ", api$pid, ")"), fixed = TRUE)
  expect_true(any(grepl(paste0("app:     ", normalizePath(example_api()), " (plumber)"), out, fixed = TRUE)))
  expect_true(any(grepl("workers: 2 running (min 2, max 4)", out, fixed = TRUE)))
  expect_true(any(grepl(paste0(api$url, "/__docs__/"), out, fixed = TRUE)))
  valve_stop(api)
  expect_match(capture.output(print(api))[[1]], "(stopped, exit status 0,", fixed = TRUE)
})

test_that("an API that cannot load fails valve_start() with valve's and R's message", {
  skip_if_no_valve()
  bad <- local_api("function( {")
  err <- expect_error(valve_start(bad, timeout = 60), class = "valve_start_error")
  msg <- conditionMessage(err)
  expect_match(msg, "valve could not start (exit status 1)", fixed = TRUE)
  expect_match(msg, "valve: error: the (API|app) could not start")
  expect_match(msg, "unexpected '{'", fixed = TRUE)
  expect_equal(err$status, 1L)
  expect_true(any(grepl("unexpected '{'", err$stderr, fixed = TRUE)))
  expect_equal(length(as.list(valve:::the$running)), 0)
})

test_that("flags valve refuses come back as an R error with valve's message", {
  skip_if_no_valve()
  err <- expect_error(valve_start(example_api(), no_such_flag = 1), class = "valve_start_error")
  expect_equal(err$status, 2L)
  expect_match(conditionMessage(err), "unexpected argument '--no-such-flag'", fixed = TRUE)

  err <- expect_error(valve_start(example_api(), n_min = 5, n_max = 2), class = "valve_start_error")
  expect_match(conditionMessage(err), "--n-min 5 is above --n-max 2", fixed = TRUE)

  err <- expect_error(valve_start(file.path(tempdir(), "nope.R")), class = "valve_start_error")
  expect_match(conditionMessage(err), "(API file|app) not found")
})

test_that("a port in use fails with valve's message, and the first valve keeps serving", {
  skip_if_no_valve()
  first <- local_valve()
  err <- expect_error(valve_start(example_api(), port = first$port), class = "valve_start_error")
  expect_match(conditionMessage(err), paste0("cannot listen on 127.0.0.1:", first$port), fixed = TRUE)
  expect_equal(fetch(paste0(first$url, "/echo?msg=still"))$status, 200L)
})

test_that("valve_start() gives up at its deadline and stops valve and its worker", {
  skip_if_no_valve()
  slow <- local_api(c(
    "writeLines('loading', 'loading.txt')",
    "Sys.sleep(60)",
    "#* @get /",
    "function() 1"
  ))
  # The worker writes into the API's own folder (its working directory), the
  # one place outside its private temporary folder that its user sees and,
  # made writable here, may write to when valve gives it a user of its own.
  Sys.chmod(dirname(slow), "0777", use_umask = FALSE)
  marker <- file.path(dirname(slow), "loading.txt")
  started <- Sys.time()
  # A fresh R: the first worker does not wait for the warm parent's start
  # (about 4 s here), so it reaches the API's load within the deadline.
  err <- expect_error(valve_start(slow, timeout = 3, warm_parent = "false"), class = "valve_start_error")
  expect_lt(as.numeric(difftime(Sys.time(), started, units = "secs")), 15)
  expect_match(conditionMessage(err), "did not report it was ready within 3 seconds", fixed = TRUE)
  # The worker got as far as loading the API, and neither it nor valve is left.
  # The deadline is short on purpose: given long enough, a garbage collection
  # would kill them through processx's finalizer even if valve_start() forgot.
  expect_true(file.exists(marker))
  expect_true(wait_for(function() length(procs_serving(slow)) == 0, timeout = 3))
})

test_that("an unassigned handle is kept until valve_stop_all()", {
  skip_if_no_valve()
  before <- ls(valve:::the$running)
  invisible(valve_start(example_api(), port = 0, timeout = 60))
  pid <- setdiff(ls(valve:::the$running), before)
  expect_length(pid, 1)
  tree <- valve_tree(pid)
  gc()
  gc()
  expect_true(all(vapply(tree, alive, logical(1))))
  expect_gte(valve_stop_all(timeout = 10), 1L)
  expect_true(all_gone(tree))
  expect_length(ls(valve:::the$running), 0)
})

test_that("the ready line is parsed into the handle's fields", {
  line <- paste0(
    '{"event":"ready","version":"0.1.0","pid":7,"url":"http://127.0.0.1:43210",',
    '"host":"127.0.0.1","port":43210,"admin_url":null,"workers":2,"max_workers":5,',
    '"apps":[{"name":"api","path":"/","file":"/srv/api/plumber.R","kind":"plumber",',
    '"url":"http://127.0.0.1:43210/","docs":"http://127.0.0.1:43210/__docs__/","n_min":2,"n_max":5}]}'
  )
  ready <- valve:::parse_ready_line(line)
  expect_equal(
    ready[c("url", "admin_url", "docs", "port", "app", "kind", "n_min", "n_max", "version")],
    list(
      url = "http://127.0.0.1:43210", admin_url = "http://127.0.0.1:43210",
      docs = "http://127.0.0.1:43210/__docs__/", port = 43210L,
      app = "/srv/api/plumber.R", kind = "plumber", n_min = 2L, n_max = 5L,
      version = "0.1.0"
    )
  )
  expect_equal(nrow(ready$apps), 1)

  # valve's own pages move to the admin listener when it has one; a config
  # file of several apps lists each.
  line <- paste0(
    '{"event":"ready","url":"http://127.0.0.1:3000","port":3000,',
    '"admin_url":"http://127.0.0.1:9000","apps":[',
    '{"name":"sales","path":"/sales","file":"/srv/sales/plumber.R","kind":"plumber","url":"http://127.0.0.1:3000/sales/","docs":"http://127.0.0.1:3000/sales/__docs__/","n_min":1,"n_max":4},',
    '{"name":"explorer","path":"/explorer","file":"/srv/explorer","kind":"shiny","url":"http://127.0.0.1:3000/explorer/","docs":null,"n_min":0,"n_max":2}]}'
  )
  ready <- valve:::parse_ready_line(line)
  expect_equal(ready$admin_url, "http://127.0.0.1:9000")
  expect_equal(ready$apps$name, c("sales", "explorer"))
  expect_equal(ready$apps$kind, c("plumber", "shiny"))
  expect_equal(ready$apps$n_max, c(4L, 2L))
  expect_true(is.na(ready$apps$docs[[2]]))
})

test_that("Prometheus text is parsed into name, labels and value", {
  text <- paste(
    "# HELP valve_requests_total Requests.",
    "# TYPE valve_requests_total counter",
    'valve_requests_total{method="GET",status="200"} 12',
    "valve_queue_depth 0",
    'valve_request_duration_seconds_bucket{le="+Inf"} 12',
    "",
    sep = "\n"
  )
  m <- valve:::parse_metrics(text)
  expect_equal(m$name, c("valve_requests_total", "valve_queue_depth", "valve_request_duration_seconds_bucket"))
  expect_equal(m$labels, c('method="GET",status="200"', "", 'le="+Inf"'))
  expect_equal(m$value, c(12, 0, 12))
})

test_that("valve's log lines lose timestamps, levels and tracing fields in errors", {
  log <- c(
    '2026-11-23T09:16:42.576987Z  INFO   plumber.R:1:11: unexpected \'{\' worker=1 pid=17263 stream="stderr"',
    '2026-11-23T09:16:42.643036Z ERROR valve: error: the app could not start: worker exited (exit code 4) app="plumber"',
    '2026-11-23T09:16:42.643062Z ERROR   R:               ^ app="plumber"'
  )
  expect_equal(
    valve:::error_lines(log),
    c("valve: error: the app could not start: worker exited (exit code 4)", "  R:               ^")
  )
})

test_that("the error quotes valve from its first error line on", {
  log <- c(
    "\033[32m INFO\033[0m starting workers",
    "valve: error: the API could not start: boom",
    "  R:   line 1:   ^",
    "hint: try this"
  )
  expect_equal(
    valve:::error_lines(log),
    c("valve: error: the API could not start: boom", "  R:   line 1:   ^", "hint: try this")
  )
  expect_equal(valve:::error_lines(c("a", "", "b"), tail_only = TRUE), c("a", "b"))
})

test_that("wrong arguments to valve_start() and valve_stop() are R errors", {
  expect_snapshot(error = TRUE, {
    valve_start(c("a.R", "b.R"))
    valve_start(list())
    valve_start("a.R", timeout = -1)
    valve_stop("http://127.0.0.1:3000")
  })
})
