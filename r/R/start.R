# valve in the background: start it, wait for its ready line, hand back a
# handle, stop it. processx ties valve (and, through it, its R workers) to this
# session, so nothing outlives it.

#' Start valve in the background
#'
#' Starts valve in the background and returns as soon as it serves requests,
#' so the same R session can call the app (with curl, httr2, or a browser) and
#' stop it with [valve_stop()]. Arguments are those of [valve_run()].
#'
#' `port` defaults to `0` here, which lets valve pick a free port: a
#' background server is usually called from the same session through
#' `$url`, and a fixed port would clash with a second `valve_start()` or with
#' anything else already listening. Pass a port to get a fixed address.
#'
#' valve and its workers stop when [valve_stop()] is called, and at the latest
#' when this R session ends, even if it crashes or is killed: processx
#' supervises them. The handle need not be kept: valves this session started
#' are remembered until stopped (see [valve_stop_all()]).
#'
#' @inheritParams valve_run
#' @param port Port to listen on; `0` (the default here) picks a free one.
#' @param timeout Seconds to wait for valve to report it is ready before
#'   giving up and stopping it. valve itself gives up on a worker that takes
#'   longer than its `start_timeout` and says why.
#' @return A `valve` object, a list with:
#'   * `url`: where the app is served, e.g. `http://127.0.0.1:41234`;
#'   * `admin_url`: where valve's own pages (`/__valve__/status`, metrics,
#'     the dashboard) are served: `url` unless valve has a separate admin
#'     listener;
#'   * `admin_token_file`: the file holding valve's operator token, which
#'     every admin page but health and readiness asks for (`status()` and
#'     `metrics()` send it; the dashboard asks to sign in with it);
#'   * `docs`: the plumber API's docs page (`NA` for a Shiny app);
#'   * `port`, `pid` (valve's process id), `app` (the app's absolute path),
#'     `kind` (`"plumber"` or `"shiny"`), `n_min`, `n_max`, `apps` (a data
#'     frame with one row per app, for a config file of several);
#'   * `status()`: valve's `/__valve__/status`, parsed (every worker's pid,
#'     state, requests and memory; the queue; the configuration);
#'   * `metrics(raw = FALSE)`: valve's Prometheus metrics as a data frame
#'     (`name`, `labels`, `value`), or the text itself with `raw = TRUE`;
#'   * `log(n = Inf)`: valve's log lines (its own and everything the workers
#'     print, such as an endpoint's R errors), the last `n`;
#'   * `stop()`: the same as `valve_stop(handle)`;
#'   * `log_file`, `binary` and `process` (the [processx::process]).
#'
#'   Printing it shows the URL, the app and how many workers run.
#' @seealso [valve_stop()], [valve_run()] to run in the foreground.
#' @export
#' @examplesIf valve::valve_available() && requireNamespace("plumber", quietly = TRUE)
#' api <- valve_start(system.file("examples", "plumber.R", package = "valve"))
#' api
#' readLines(paste0(api$url, "/echo?msg=hello"), warn = FALSE)
#' api$status()$workers
#' api$metrics()[1:3, ]
#' tail(api$log(), 2)
#' valve_stop(api)
#' \dontshow{
#' # processx's supervisor (which stops valve if R dies) keeps two pipes open.
#' processx:::supervisor_kill()
#' }
valve_start <- function(app = NULL, host = NULL, port = 0, n_min = NULL,
                        n_max = NULL, workers = NULL, check_unused = NULL,
                        max_age = NULL, ..., timeout = 120) {
  call <- rlang::current_env()
  if (!is.numeric(timeout) || length(timeout) != 1 || is.na(timeout) || timeout <= 0) {
    cli::cli_abort("{.arg timeout} must be a positive number of seconds.", call = call)
  }
  dots <- list(...)
  command <- valve_command(
    app,
    list(
      host = host, port = port, n_min = n_min, n_max = n_max, workers = workers,
      check_unused = check_unused, max_age = max_age
    ),
    dots, call
  )
  ready <- FALSE
  on.exit(if (!ready && !is.null(command$cleanup)) unlink(command$cleanup, recursive = TRUE), add = TRUE)
  binary <- find_binary()
  command <- with_router(command, binary, call)
  log_dir <- tempfile("valve-")
  dir.create(log_dir)
  out_file <- file.path(log_dir, "stdout.log")
  log_file <- file.path(log_dir, "valve.log")
  # Files, not pipes: nobody reads a pipe while valve runs in the background,
  # and a full pipe would block valve (and its workers' logging) for good.
  # valve's run directory (and its workers' R temporary directories) go
  # inside this one too: removed with the session's, even when valve had to
  # be killed and could not remove its own.
  p <- processx::process$new(
    binary, command$args,
    stdin = NULL, stdout = out_file, stderr = log_file,
    env = child_env(NO_COLOR = "1", TMPDIR = log_dir),
    cleanup = TRUE, cleanup_tree = TRUE, supervise = TRUE
  )
  on.exit(if (!ready) kill_valve(p, log_dir), add = TRUE)
  line <- wait_ready(p, out_file, log_file, timeout, call)
  handle <- new_handle(
    parse_ready_line(line), p,
    log_file = log_file, binary = binary, cleanup = command$cleanup,
    graceful_timeout = dots$graceful_timeout
  )
  ready <- TRUE
  # Keeping every started valve here means an unassigned handle is not
  # garbage-collected (and valve killed) at some random later moment.
  assign(as.character(handle$pid), handle, envir = the$running)
  handle
}

new_handle <- function(ready, p, log_file, binary, cleanup, graceful_timeout) {
  admin_url <- ready$admin_url
  token_file <- ready$admin_token_file
  log_lines <- function(n = Inf) {
    lines <- cli::ansi_strip(read_lines(log_file))
    if (is.finite(n)) utils::tail(lines, n) else lines
  }
  self <- NULL
  self <- structure(
    c(
      ready,
      list(
        pid = p$get_pid(),
        log_file = log_file,
        binary = binary,
        process = p,
        run_dir = cleanup,
        graceful_timeout = graceful_timeout,
        status = function() valve_get_status(admin_url, token_file = token_file),
        metrics = function(raw = FALSE) valve_get_metrics(admin_url, raw, token_file = token_file),
        log = log_lines,
        stop = function(timeout = NULL) valve_stop(self, timeout)
      )
    ),
    class = "valve"
  )
  self
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
      kill_valve(p, dirname(log_file))
      log <- read_lines(log_file)
      abort_with_output(
        cli::format_inline("valve did not report it was ready within {timeout} second{?s}, so it was stopped. Its last words:"),
        error_lines(log, tail_only = TRUE),
        c(
          "i" = cli::format_inline("Raise {.arg timeout} (and {.arg start_timeout}) if the app takes longer to load."),
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
  log <- plain_log_lines(log)
  first <- if (tail_only) integer() else grep("^(valve: )?error: ", log)
  lines <- if (length(first) > 0) log[first[[1]]:length(log)] else utils::tail(log, n)
  lines[nzchar(trimws(lines))]
}

# valve's log lines as a person reads them in an error: no colour, no
# timestamp and level in front, no tracing fields (the app, a worker's id and
# pid, the stream) behind.
plain_log_lines <- function(log) {
  log <- cli::ansi_strip(log)
  log <- sub("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z? +(TRACE|DEBUG|INFO|WARN|ERROR) ", "", log)
  sub("( (app|worker|pid|stream)=(\"[^\"]*\"|[^ ]+))+$", "", log)
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
# {"event":"ready","version":"0.1.0","pid":7,"url":"http://127.0.0.1:3000",
#  "host":"127.0.0.1","port":3000,"admin_url":null,"workers":1,"max_workers":3,
#  "apps":[{"name":"api","path":"/","file":"/abs/plumber.R","kind":"plumber",
#           "url":"...","docs":"...","n_min":1,"n_max":3}]}
# valve's own pages are on `admin_url` when it is not null, else on `url`.
parse_ready_line <- function(line) {
  ready <- jsonlite::fromJSON(line, simplifyVector = FALSE)
  or <- function(x, y) if (is.null(x)) y else x
  apps <- lapply(or(ready$apps, list()), function(a) {
    data.frame(
      name = or(a$name, NA_character_), path = or(a$path, NA_character_),
      file = or(a$file, NA_character_), kind = or(a$kind, NA_character_),
      url = or(a$url, NA_character_), docs = or(a$docs, NA_character_),
      n_min = as.integer(or(a$n_min, NA)), n_max = as.integer(or(a$n_max, NA)),
      stringsAsFactors = FALSE
    )
  })
  apps <- if (length(apps)) do.call(rbind, apps) else data.frame()
  first <- function(col, na) if (nrow(apps) > 0) apps[[col]][[1]] else na
  list(
    url = ready$url,
    admin_url = or(ready$admin_url, ready$url),
    admin_token_file = or(ready$admin_token_file, NA_character_),
    docs = first("docs", NA_character_),
    port = as.integer(ready$port),
    app = first("file", NA_character_),
    kind = first("kind", NA_character_),
    n_min = first("n_min", NA_integer_),
    n_max = first("n_max", NA_integer_),
    apps = apps,
    version = or(ready$version, NA_character_)
  )
}

#' Stop a valve started with valve_start()
#'
#' Asks valve to stop (SIGTERM), which lets requests in flight finish for up to
#' its `graceful_timeout` and then stops the workers. If valve has not exited
#' after `timeout` seconds, it and every process it started are killed. A
#' router saved for the workers is removed.
#'
#' @param handle What [valve_start()] returned.
#' @param timeout Seconds to wait for valve to exit by itself before killing
#'   it. `NULL` (the default) leaves valve its full `graceful_timeout`, as
#'   valve reports it, plus 5 seconds.
#' @return Invisibly, valve's exit status (0 after a clean stop; `NA` if it had
#'   to be killed).
#' @seealso [valve_stop_all()] stops every valve this session started.
#' @export
valve_stop <- function(handle, timeout = NULL) {
  if (!inherits(handle, "valve")) {
    cli::cli_abort(
      "{.arg handle} must be what {.fn valve_start} returned, not {.obj_type_friendly {handle}}."
    )
  }
  p <- handle$process
  on.exit(rm_running(handle$pid), add = TRUE)
  on.exit(if (!is.null(handle$run_dir)) unlink(handle$run_dir, recursive = TRUE), add = TRUE)
  if (p$is_alive()) {
    if (is.null(timeout)) timeout <- graceful_timeout(handle) + 5
    p$signal(tools::SIGTERM)
    # processx's wait() can return before its timeout (another child's exit
    # wakes it), so wait in a loop until valve exits or the deadline passes.
    deadline <- Sys.time() + max(0, timeout)
    while (p$is_alive() && Sys.time() < deadline) {
      p$wait(max(1, min(1000, as.numeric(deadline - Sys.time(), units = "secs") * 1000)))
    }
  }
  status <- if (p$is_alive()) NA_integer_ else p$get_exit_status()
  # Kills valve if it is still up, and any worker that outlived it.
  kill_valve(p, dirname(handle$log_file))
  invisible(status)
}

# Kills valve and everything it started, then removes what a killed valve
# and its workers could not: their temporary directories (valve's log files
# stay, for $log()).
kill_valve <- function(p, dir) {
  p$kill_tree()
  left <- setdiff(list.files(dir, all.files = TRUE, no.. = TRUE), c("valve.log", "stdout.log"))
  unlink(file.path(dir, left), recursive = TRUE)
  invisible()
}

# valve's grace period: as given to valve_start(), else as valve reports it,
# else valve's documented default.
graceful_timeout <- function(handle) {
  given <- suppressWarnings(as.numeric(handle$graceful_timeout))
  if (length(given) == 1 && !is.na(given)) {
    return(given)
  }
  reported <- tryCatch(
    as.numeric(
      valve_get_status(handle$admin_url, timeout = 2, token_file = handle$admin_token_file)$config$graceful_timeout_s
    ),
    error = function(e) numeric()
  )
  if (length(reported) == 1 && !is.na(reported)) reported else 30
}

#' Stop every valve this session started
#'
#' @inheritParams valve_stop
#' @return Invisibly, the number of valves stopped.
#' @export
valve_stop_all <- function(timeout = NULL) {
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
  apps <- x$apps
  if (is.data.frame(apps) && nrow(apps) > 1) {
    for (i in seq_len(nrow(apps))) {
      cli::cat_line("  app:     ", apps$path[[i]], " \u2192 ", apps$file[[i]], " (", apps$kind[[i]], ")")
    }
  } else {
    cli::cat_line("  app:     ", x$app, if (!is.na(x$kind)) paste0(" (", x$kind, ")"))
  }
  cli::cat_line(
    "  workers: ", if (is.na(running)) "?" else running, " running (min ",
    x$n_min, ", max ", x$n_max, ")"
  )
  if (!is.na(x$docs)) cli::cat_line("  docs:    ", x$docs)
  if (!identical(x$admin_url, x$url)) cli::cat_line("  admin:   ", x$admin_url, "/__valve__/")
  cli::cat_line("  log:     ", x$log_file)
  invisible(x)
}

# valve's R workers: its children (plain workers), and with preload the
# children of its preload parent, counted by the status page when it answers.
worker_count <- function(pid) {
  tryCatch(length(worker_handles(pid)), error = function(e) NA_integer_)
}

# valve's workers: its children, except its warm parent (which serves no app),
# whose children, forks of it, are workers too. As root, valve's processes
# are started by its privileged spawner (`valve-spawner`): its children.
worker_handles <- function(pid) {
  kids <- ps::ps_children(ps::ps_handle(as.integer(pid)))
  spawner <- vapply(kids, function(h) {
    identical(tryCatch(ps::ps_name(h), error = function(e) ""), "valve-spawner")
  }, logical(1))
  kids <- c(kids[!spawner], unlist(lapply(kids[spawner], ps::ps_children), recursive = FALSE))
  warm <- vapply(kids, function(h) {
    isTRUE(tryCatch("VALVE_MODE=zygote" %in% ps::ps_environ_raw(h), error = function(e) FALSE))
  }, logical(1))
  c(kids[!warm], unlist(lapply(kids[warm], ps::ps_children), recursive = FALSE))
}
