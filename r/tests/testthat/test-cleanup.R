# Nothing outlives the R session that started valve: not valve, not its
# workers, whether the session quits or is killed.

# Starts valve with two workers in a child R session, which writes the PIDs
# and then waits for `go` before quitting. Returns the child and ps handles for
# valve and its workers, taken while they run.
session_with_valve <- function(api, dir) {
  pid_file <- file.path(dir, "pids")
  go_file <- file.path(dir, "go")
  session <- callr::r_bg(
    function(api, pid_file, go_file) {
      h <- valve::valve_start(api, port = 0, n_min = 2, timeout = 60)
      kids <- valve:::worker_handles(h$pid)
      writeLines(as.character(c(h$pid, vapply(kids, ps::ps_pid, integer(1)))), paste0(pid_file, ".tmp"))
      writeLines(tempdir(), paste0(pid_file, ".tempdir"))
      file.rename(paste0(pid_file, ".tmp"), pid_file)
      deadline <- Sys.time() + 60
      while (!file.exists(go_file) && Sys.time() < deadline) Sys.sleep(0.1)
      # The handle `h` is still referenced: the session ends with valve running.
      quit(save = "no", status = 0)
    },
    args = list(api = api, pid_file = pid_file, go_file = go_file),
    stdout = "|", stderr = "2>&1"
  )
  withr::defer(session$kill_tree(), envir = parent.frame())
  got <- wait_for(function() file.exists(pid_file) || !session$is_alive(), timeout = 60)
  expect_true(got && file.exists(pid_file), info = paste(session$read_output_lines(), collapse = "\n"))
  pids <- as.integer(readLines(pid_file))
  # A killed session cannot remove its own temporary directory: do it for it.
  withr::defer(unlink(readLines(paste0(pid_file, ".tempdir")), recursive = TRUE), envir = parent.frame())
  tree <- lapply(pids, ps::ps_handle)
  withr::defer(lapply(tree, function(h) try(ps::ps_kill(h), silent = TRUE)), envir = parent.frame())
  list(session = session, tree = tree, go = go_file)
}

test_that("valve and its workers end when the R session that started them quits", {
  skip_if_no_valve()
  skip_if_not_installed("callr")
  api <- local_api(readLines(example_api()))
  s <- session_with_valve(api, withr::local_tempdir())
  expect_length(s$tree, 3) # valve and two workers
  expect_true(all(vapply(s$tree, alive, logical(1))))
  # valve by its command line (forks of the warm parent carry the app's
  # variables only in their R, not in their initial environment).
  expect_gte(length(procs_serving(api)), 1)

  file.create(s$go)
  expect_true(wait_for(function() !s$session$is_alive(), timeout = 20))
  expect_true(all_gone(s$tree), info = paste("still running:", toString(pids_of(s$tree))))
  expect_length(procs_serving(api), 0)
})

test_that("valve and its workers end when the R session is killed", {
  skip_if_no_valve()
  skip_if_not_installed("callr")
  api <- local_api(readLines(example_api()))
  s <- session_with_valve(api, withr::local_tempdir())
  expect_length(s$tree, 3)
  expect_true(all(vapply(s$tree, alive, logical(1))))

  # SIGKILL: no R code runs, so only processx's supervisor can clean up.
  s$session$kill()
  expect_true(all_gone(s$tree), info = paste("still running:", toString(pids_of(s$tree))))
  expect_length(procs_serving(api), 0)
})
