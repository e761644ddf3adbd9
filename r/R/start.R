# valve in the background: start it, wait for its ready line, hand back a
# handle, stop it. processx ties valve (and, through it, its R workers) to this
# session, so nothing outlives it.

#' Start valve in the background
#'
#' Starts valve in the background and returns as soon as it serves requests,
#' so the same R session can call the API (with curl, httr2, or a browser) and
#' stop it with [valve_stop()]. Arguments are those of [valve_run()].
#'
#' `port` defaults to `0` here, which lets valve pick a free port: a
#' background server is usually called from the same session through
#' `$url`, and a fixed port would clash with a second `valve_start()` or with
#' anything else already on port 3000. Pass `port = 3000` to get the
#' reference tool's address.
#'
#' valve writes its log (its own events and everything the workers print, e.g.
#' R errors raised by endpoints) to the file `$log`; read it with
#' `readLines(handle$log)`.
#'
#' valve and its workers stop when [valve_stop()] is called, and at the latest
#' when this R session ends, even if it crashes: processx supervises them. The
#' handle need not be kept: valves this session started are remembered until
#' stopped (see [valve_stop_all()]).
#'
#' @inheritParams valve_run
#' @param port Port to listen on; `0` (the default here) picks a free one.
#' @param timeout Seconds to wait for valve to report it is ready before
#'   giving up and stopping it. valve itself gives up on a worker that takes
#'   longer than its `start_timeout` (120 seconds by default) and says why.
#' @return A `valve` object: a list with `url`, `docs` (the API's docs page),
#'   `port`, `app` (the API's absolute path), `n_min`, `n_max`, `pid`, `log`
#'   (valve's log file), `binary` and `process` (the [processx::process]).
#'   Printing it shows the URL and how many workers run.
#' @seealso [valve_stop()], [valve_run()] to run in the foreground.
#' @export
#' @examples
#' \dontrun{
#' api <- valve_start(system.file("examples", "plumber.R", package = "valve"))
#' api
#' readLines(paste0(api$url, "/echo?msg=hello"), warn = FALSE)
#' valve_stop(api)
#' }
valve_start <- function(filepath = "plumber.R", host = "127.0.0.1", port = 0,
                        n_min = 1, n_max = 3, workers = 3, check_unused = 10,
                        max_age = 300, ..., timeout = 120) {
  call <- rlang::current_env()
  if (!is.numeric(timeout) || length(timeout) != 1 || is.na(timeout) || timeout <= 0) {
    cli::cli_abort("{.arg timeout} must be a positive number of seconds.", call = call)
  }
  args <- common_args(
    filepath, host, port, n_min, n_max, workers, check_unused, max_age,
    list(...), call
  )
  binary <- find_binary()
  log_dir <- tempfile("valve-")
  dir.create(log_dir)
  out_file <- file.path(log_dir, "stdout.log")
  log_file <- file.path(log_dir, "valve.log")
  # Files, not pipes: nobody reads a pipe while valve runs in the background,
  # and a full pipe would block valve (and its workers' logging) for good.
  p <- processx::process$new(
    binary, args,
    stdin = NULL, stdout = out_file, stderr = log_file,
    env = child_env(NO_COLOR = "1"),
    cleanup = TRUE, cleanup_tree = TRUE, supervise = TRUE
  )
  ready <- FALSE
  on.exit(if (!ready) p$kill_tree(), add = TRUE)
  line <- wait_ready(p, out_file, log_file, timeout, call)
  ready <- TRUE

  handle <- structure(
    c(
      parse_ready_line(line),
      list(
        pid = p$get_pid(),
        log = log_file,
        binary = binary,
        graceful_timeout = graceful_timeout(list(...)),
        process = p
      )
    ),
    class = "valve"
  )
  # Keeping every started valve here means an unassigned handle is not
  # garbage-collected (and valve killed) at some random later moment.
  assign(as.character(handle$pid), handle, envir = the$running)
  handle
}

# Waits for valve's ready line on stdout; an R error with valve's own message
# if it exits first, and valve stopped if the deadline passes.
wait_ready <- function(p, out_file, log_file, timeout, call) {
  deadline <- Sys.time() + timeout
  repeat {
    line <- grep('"event":"ready"', complete_lines(out_file), value = TRUE, fixed = TRUE)
    if (length(line) > 0) {
      return(line[[1]])
    }
    if (!p$is_alive()) {
      status <- p$get_exit_status()
      start_failed(status, read_lines(log_file), log_file, call)
    }
    if (Sys.time() > deadline) {
      p$kill_tree()
      log <- read_lines(log_file)
      abort_with_output(
        cli::format_inline("valve did not report it was ready within {timeout} second{?s}, so it was stopped. Its last words:"),
        error_lines(log, tail_only = TRUE),
        c(
          "i" = cli::format_inline("Raise {.arg timeout} (and {.arg start_timeout}) if the API takes longer to load."),
          "i" = cli::format_inline("valve's log: {.file {log_file}}")
        ),
        class = "valve_start_error", call = call, stderr = log
      )
    }
    # Returns early if valve exits, so a failure is reported at once.
    p$wait(50)
  }
}

start_failed <- function(status, log, log_file, call) {
  what <- if (identical(status, 2L)) {
    "valve refused its arguments (exit status 2):"
  } else {
    paste0("valve could not start (exit status ", status, "):")
  }
  abort_with_output(
    what, error_lines(log),
    c("i" = cli::format_inline("valve's log: {.file {log_file}}")),
    class = "valve_start_error", call = call, status = status, stderr = log
  )
}

# An error quoting valve's output verbatim: cli would re-wrap it and collapse
# the spaces that line R's parse errors up under their caret, so the message
# goes to rlang as is. `stderr` and `status` ride along on the condition.
abort_with_output <- function(header, lines, hints, class, call, ...) {
  lines <- if (length(lines) == 0) c("x" = "valve printed nothing.") else rlang::set_names(lines, " ")
  rlang::abort(
    c(header, lines, hints),
    class = c(class, "valve_error"),
    call = call,
    use_cli_format = FALSE,
    ...
  )
}

# The part of valve's stderr that explains a failure: from its first
# `valve: error:` (or argument parser `error:`) line on, else the last lines.
error_lines <- function(log, tail_only = FALSE, n = 15) {
  log <- cli::ansi_strip(log)
  first <- if (tail_only) integer() else grep("^(valve: )?error: ", log)
  lines <- if (length(first) > 0) log[first[[1]]:length(log)] else utils::tail(log, n)
  lines[nzchar(trimws(lines))]
}

# Lines valve has finished writing: a ready line caught half-written must not
# be parsed.
complete_lines <- function(path) {
  size <- file.size(path)
  if (is.na(size) || size == 0) {
    return(character())
  }
  text <- readChar(path, size, useBytes = TRUE)
  text <- sub("[^\n]*$", "", text)
  if (!nzchar(text)) character() else strsplit(text, "\n")[[1]]
}

read_lines <- function(path) {
  if (!file.exists(path)) {
    return(character())
  }
  readLines(path, warn = FALSE)
}

# valve's ready line: one JSON object on stdout, e.g.
# {"event":"ready","url":"http://127.0.0.1:3000","port":3000,"workers":1,
#  "max_workers":3,"apps":[{"file":"/abs/plumber.R","docs":"...",...}],...}
parse_ready_line <- function(line) {
  ready <- jsonlite::fromJSON(line, simplifyVector = FALSE)
  app <- if (length(ready$apps) > 0) ready$apps[[1]] else list()
  null_na <- function(x, na) if (is.null(x)) na else x
  list(
    url = ready$url,
    docs = null_na(app$docs, NA_character_),
    port = as.integer(ready$port),
    app = null_na(app$file, NA_character_),
    n_min = as.integer(null_na(app$n_min, NA)),
    n_max = as.integer(null_na(app$n_max, NA))
  )
}

graceful_timeout <- function(dots) {
  value <- suppressWarnings(as.numeric(dots$graceful_timeout))
  if (length(value) == 1 && !is.na(value)) value else 30
}

#' Stop a valve started with valve_start()
#'
#' Asks valve to stop (SIGTERM), which lets requests in flight finish for up to
#' its `graceful_timeout` and then stops the workers. If valve has not exited
#' after `timeout` seconds, it and every process it started are killed.
#'
#' @param handle What [valve_start()] returned.
#' @param timeout Seconds to wait for valve to exit by itself before killing
#'   it. The default leaves valve its full `graceful_timeout` plus 5 seconds.
#' @return Invisibly, valve's exit status (0 after a clean stop; `NA` if it had
#'   to be killed).
#' @seealso [valve_stop_all()] stops every valve this session started.
#' @export
valve_stop <- function(handle, timeout = handle$graceful_timeout + 5) {
  if (!inherits(handle, "valve")) {
    cli::cli_abort(
      "{.arg handle} must be what {.fn valve_start} returned, not {.obj_type_friendly {handle}}."
    )
  }
  p <- handle$process
  on.exit(rm_running(handle$pid), add = TRUE)
  if (p$is_alive()) {
    p$signal(tools::SIGTERM)
    p$wait(max(0, timeout) * 1000)
  }
  status <- if (p$is_alive()) NA_integer_ else p$get_exit_status()
  # Kills valve if it is still up, and any worker that outlived it.
  p$kill_tree()
  invisible(status)
}

#' Stop every valve this session started
#'
#' @inheritParams valve_stop
#' @return Invisibly, the number of valves stopped.
#' @export
valve_stop_all <- function(timeout = 35) {
  handles <- as.list(the$running)
  for (h in handles) {
    valve_stop(h, timeout = timeout)
  }
  invisible(length(handles))
}

rm_running <- function(pid) {
  key <- as.character(pid)
  if (exists(key, envir = the$running, inherits = FALSE)) {
    rm(list = key, envir = the$running)
  }
}

#' @export
print.valve <- function(x, ...) {
  p <- x$process
  alive <- p$is_alive()
  state <- if (alive) "running" else paste("stopped, exit status", p$get_exit_status())
  running <- if (alive) worker_count(x$pid) else 0L
  cli::cat_line("<valve> ", x$url, " (", state, ", pid ", x$pid, ")")
  cli::cat_line("  API:     ", x$app)
  cli::cat_line(
    "  workers: ", if (is.na(running)) "?" else running, " running (min ",
    x$n_min, ", max ", x$n_max, ")"
  )
  cli::cat_line("  docs:    ", x$docs)
  cli::cat_line("  log:     ", x$log)
  invisible(x)
}

# valve's children are its R workers.
worker_count <- function(pid) {
  tryCatch(
    length(ps::ps_children(ps::ps_handle(as.integer(pid)))),
    error = function(e) NA_integer_
  )
}
