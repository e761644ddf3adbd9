# valve in the foreground: the reference tool's valve_run(), blocking the
# session and showing valve's output until it is interrupted.

#' Run an app behind valve, in the foreground
#'
#' Runs valve and blocks until it stops, showing its output, as the reference
#' tool's `valve_run()` did. Interrupt it (Esc in RStudio, Ctrl+C in a
#' terminal) to stop valve and its workers. To keep using the session while
#' valve runs, use [valve_start()].
#'
#' `app` is what valve serves:
#' * a plumber API: a file, or a folder holding `entrypoint.R` or `plumber.R`;
#' * a Shiny app: a folder holding `app.R` (or `ui.R` and `server.R`), or an
#'   `app.R` file;
#' * several apps on one port: a `.toml` configuration file (passed to valve as
#'   `--config`);
#' * a plumber router built in this session, e.g.
#'   `plumber::pr() |> plumber::pr_get("/x", function() 1)`. valve's workers
#'   are other R processes, so the router is copied to them: it is saved with
#'   [saveRDS()] into a private temporary directory (mode 0700) and every
#'   worker reads it with [readRDS()]. (As root, valve runs the workers as a
#'   user of their own, so the copy goes into a directory in the system's
#'   temporary folder that every user may read: keep secrets out of the
#'   router's globals and read them in `valve.on_worker_start` instead.)
#'   Objects its handlers use from your
#'   global environment, and functions from packages attached in this session,
#'   travel with it (each worker gets its own copy). What cannot travel (an
#'   open connection, an external pointer such as a database connection or a
#'   model held in C memory) is reported before anything starts: open such
#'   things in each worker, in `options(valve.on_worker_start = function() ...)`
#'   (set in this session before starting valve; it runs once in each worker,
#'   before its first request) or inside the handler.
#'
#' Every other argument is a valve flag. An argument left `NULL` is not passed,
#' so valve's own default applies (`valve --help` lists them, and valve's
#' `VALVE_*` environment variables work as usual). The R workers run with this
#' session's R (`R.home("bin")`) and library paths (`.libPaths()`), unless
#' `r_bin` or the environment variable `VALVE_R_BIN` says otherwise.
#'
#' @param app What to serve: the path of a plumber file or folder, of a Shiny
#'   app folder or `app.R`, or of a `.toml` file of several apps; or a plumber
#'   router object. `NULL` leaves it to valve (`plumber.R` in the working
#'   directory). `filepath =`, the reference tool's name, is accepted too.
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
#'   `graceful_timeout`, `max_sessions`, `preload` or `r_bin`.
#' @return Invisibly, valve's exit status (0 after a clean stop). An error if
#'   valve could not start, carrying valve's message.
#' @seealso [valve_start()] to run valve in the background.
#' @export
#' @examples
#' \dontrun{
#' # Blocks until interrupted.
#' valve_run(system.file("examples", "plumber.R", package = "valve"), n_max = 5)
#'
#' # A router built in this session, served by three R workers.
#' router <- plumber::pr() |>
#'   plumber::pr_get("/pid", function() Sys.getpid())
#' valve_run(router, n_min = 3, n_max = 3)
#'
#' # A Shiny app, from its folder.
#' valve_run("path/to/shiny-app", n_max = 4)
#' }
valve_run <- function(app = NULL, host = NULL, port = NULL, n_min = NULL,
                      n_max = NULL, workers = NULL, check_unused = NULL,
                      max_age = NULL, ...) {
  call <- rlang::current_env()
  dots <- list(...)
  command <- valve_command(
    app,
    list(
      host = host, port = port, n_min = n_min, n_max = n_max, workers = workers,
      check_unused = check_unused, max_age = max_age
    ),
    dots, call
  )
  on.exit(if (!is.null(command$cleanup)) unlink(command$cleanup, recursive = TRUE), add = TRUE)
  binary <- find_binary()
  command <- with_router(command, binary, call)
  # valve's run directory and its workers' temporary directories go in here,
  # removed once valve has stopped, however it stopped.
  tmp <- tempfile("valve-")
  dir.create(tmp)
  on.exit(unlink(tmp, recursive = TRUE), add = TRUE)
  colour <- if (cli::num_ansi_colors() > 1) character() else c(NO_COLOR = "1")
  # Pipes echoed from R rather than inherited descriptors, so the output shows
  # in any console (RStudio's too), and an interrupt reaches R, which then
  # stops valve below.
  p <- processx::process$new(
    binary, command$args,
    stdin = NULL, stdout = "|", stderr = "|",
    env = do.call(child_env, c(as.list(colour), TMPDIR = tmp)),
    cleanup = TRUE, cleanup_tree = TRUE, supervise = TRUE
  )
  err_tail <- character()
  echo <- function() {
    out <- p$read_output_lines()
    for (line in out) {
      # valve's ready line is for programs: people get it in words.
      if (grepl('"event":"ready"', line, fixed = TRUE)) {
        ready <- tryCatch(parse_ready_line(line), error = function(e) NULL)
        if (!is.null(ready)) {
          cli::cli_inform(c("v" = "valve is ready at {.url {ready$url}}{if (!is.na(ready$docs)) paste0(' (docs: ', ready$docs, ')') else ''}. Interrupt R to stop it."))
          next
        }
      }
      cat(line, "\n", sep = "")
    }
    err <- p$read_error_lines()
    if (length(err)) {
      cat(err, sep = "\n", file = stderr())
      err_tail <<- utils::tail(c(err_tail, err), 200)
    }
  }
  grace <- suppressWarnings(as.numeric(dots$graceful_timeout))
  if (length(grace) != 1 || is.na(grace)) grace <- 30
  on.exit(stop_foreground(p, grace + 5, echo), add = TRUE, after = FALSE)
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
