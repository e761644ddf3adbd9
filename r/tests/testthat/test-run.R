# valve in the foreground (R/run.R): it blocks, shows valve's output, and an
# interrupt stops valve and its workers.

test_that("valve_run() serves until interrupted, then leaves nothing running", {
  skip_if_no_valve()
  skip_if_not_installed("callr")
  session <- callr::r_bg(
    function(api) valve::valve_run(api, port = 0, n_min = 2, graceful_timeout = 5),
    args = list(api = example_api()),
    stdout = "|", stderr = "2>&1"
  )
  withr::defer(session$kill_tree())

  output <- character()
  ready <- wait_for(timeout = 60, function() {
    session$poll_io(200)
    output <<- c(output, session$read_output_lines())
    any(grepl("valve is ready at", output, fixed = TRUE)) || !session$is_alive()
  })
  expect_true(ready && session$is_alive(), info = paste(output, collapse = "\n"))
  # valve's JSON ready line is turned into words for people.
  expect_false(any(grepl('"event":"ready"', output, fixed = TRUE)))
  line <- grep("valve is ready at", output, value = TRUE, fixed = TRUE)[[1]]
  url <- regmatches(line, regexpr("http://127\\.0\\.0\\.1:[0-9]+", line))

  valve <- Filter(function(h) ps::ps_name(h) == "valve", ps::ps_children(session$as_ps_handle()))
  expect_length(valve, 1)
  tree <- valve_tree(ps::ps_pid(valve[[1]]))
  expect_length(tree, 3) # valve and two workers
  expect_equal(fetch(paste0(url, "/echo?msg=fg"))$status, 200L)

  # valve_run() blocks: the session is still inside it.
  expect_true(session$is_alive())
  session$interrupt()
  expect_true(wait_for(function() !session$is_alive(), timeout = 20))
  expect_true(all_gone(tree), info = paste("still running:", toString(pids_of(tree))))
})

test_that("valve_run() shows valve's output and fails with its message", {
  skip_if_no_valve()
  bad <- local_api("function( {")
  shown <- capture.output(
    err <- tryCatch(valve_run(bad, port = 0), error = identity),
    type = "message"
  )
  expect_s3_class(err, "valve_run_error")
  expect_equal(err$status, 1L)
  expect_match(conditionMessage(err), "valve exited with status 1", fixed = TRUE)
  expect_match(conditionMessage(err), "unexpected '{'", fixed = TRUE)
  # The same lines were shown as valve printed them.
  expect_true(any(grepl("valve: error: the (API|app) could not start", shown)))
})
