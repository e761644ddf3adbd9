# valve in the foreground: the reference tool's valve_run(), blocking the
# session and showing valve's output until it is interrupted.

#' Run a plumber API behind valve, in the foreground
#'
#' Runs valve and blocks until it stops, showing its output, as the reference
#' tool's `valve_run()` did. Interrupt it (Esc in RStudio, Ctrl+C in a
#' terminal) to stop valve and its workers. To keep using the session while
#' valve runs, use [valve_start()].
#'
#' Every argument becomes a valve flag; see `valve --help` for all of them.
#' The R workers run with this session's R (`R.home("bin")`) and library
#' paths (`.libPaths()`), unless `r_bin` or the environment variable
#' `VALVE_R_BIN` says otherwise.
#'
#' @param filepath The plumber API: a file, or a directory holding
#'   `entrypoint.R` or `plumber.R` (`--file`).
#' @param host Address to listen on (`--host`).
#' @param port Port to listen on; `0` picks a free one (`--port`).
#' @param n_min R worker processes kept running even when idle (`--n-min`).
#' @param n_max Most R worker processes run at once (`--n-max`).
#' @param workers Threads valve itself uses to move requests (`--workers`).
#' @param check_unused Seconds between checks for unused workers
#'   (`--check-unused`).
#' @param max_age Seconds a worker may sit unused before it is stopped, never
#'   going below `n_min` (`--max-age`).
#' @param ... Any other valve flag, named with underscores:
#'   `request_timeout = 30` becomes `--request-timeout 30`, `TRUE` a bare
#'   flag, `FALSE` or `NULL` nothing. For example `start_timeout`,
#'   `graceful_timeout` or `r_bin`.
#' @return Invisibly, valve's exit status (0 after a clean stop). An error if
#'   valve could not start, carrying valve's message.
#' @seealso [valve_start()] to run valve in the background.
#' @export
#' @examples
#' \dontrun{
#' valve_run(system.file("examples", "plumber.R", package = "valve"), n_max = 5)
#' }
valve_run <- function(filepath = "plumber.R", host = "127.0.0.1", port = 3000,
                      n_min = 1, n_max = 3, workers = 3, check_unused = 10,
                      max_age = 300, ...) {
  call <- rlang::current_env()
  dots <- list(...)
  args <- common_args(
    filepath, host, port, n_min, n_max, workers, check_unused, max_age,
    dots, call
  )
  binary <- find_binary()
  colour <- if (cli::num_ansi_colors() > 1) character() else c(NO_COLOR = "1")
  # Pipes echoed from R rather than inherited descriptors, so the output shows
  # in any console (RStudio's too), and an interrupt reaches R, which then
  # stops valve below.
  p <- processx::process$new(
    binary, args,
    stdin = NULL, stdout = "|", stderr = "|",
    env = do.call(child_env, as.list(colour)),
    cleanup = TRUE, cleanup_tree = TRUE, supervise = TRUE
  )
  err_tail <- character()
  echo <- function() {
    out <- p$read_output_lines()
    if (length(out)) cat(out, sep = "\n")
    err <- p$read_error_lines()
    if (length(err)) {
      cat(err, sep = "\n", file = stderr())
      err_tail <<- utils::tail(c(err_tail, err), 200)
    }
  }
  on.exit(stop_foreground(p, graceful_timeout(dots) + 5, echo), add = TRUE)
  while (p$is_alive()) {
    p$poll_io(200)
    echo()
  }
  # Whatever valve printed last, after it exited.
  deadline <- Sys.time() + 5
  while ((p$is_incomplete_output() || p$is_incomplete_error()) && Sys.time() < deadline) {
    p$poll_io(200)
    echo()
  }
  status <- p$get_exit_status()
  if (!identical(status, 0L)) {
    abort_with_output(
      paste0("valve exited with status ", status, ":"),
      error_lines(err_tail),
      character(),
      class = "valve_run_error", call = call, status = status, stderr = err_tail
    )
  }
  invisible(status)
}

# On interrupt (or any error), valve gets SIGTERM and the time it needs to let
# requests in flight finish, as with Ctrl+C in a terminal; then it and
# everything it started are killed, whatever state they are in.
stop_foreground <- function(p, timeout, echo) {
  # A second interrupt while valve drains skips straight to the kill.
  tryCatch(
    if (p$is_alive()) {
      p$signal(tools::SIGTERM)
      deadline <- Sys.time() + timeout
      while (p$is_alive() && Sys.time() < deadline) {
        p$poll_io(200)
        try(echo(), silent = TRUE)
      }
    },
    interrupt = function(e) NULL
  )
  p$kill_tree()
  invisible()
}
