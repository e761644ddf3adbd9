# Shared test helpers: finding valve, the example API, and watching processes
# by PID (with their start times, so a reused PID is never mistaken for ours).

# Skips when there is no valve binary, except under r/run-tests.sh, which sets
# VALVE_TESTS_REQUIRE_BINARY so a missing binary fails instead of passing as
# skipped.
skip_if_no_valve <- function() {
  found <- tryCatch(valve_binary(), valve_no_binary = function(e) e)
  if (inherits(found, "valve_no_binary")) {
    if (nzchar(Sys.getenv("VALVE_TESTS_REQUIRE_BINARY"))) {
      stop("no valve binary, but VALVE_TESTS_REQUIRE_BINARY is set: ", conditionMessage(found))
    }
    skip("no valve binary (set VALVE_BINARY to target/release/valve)")
  }
  skip_if_not_installed("plumber")
  skip_if_not_installed("curl")
  invisible(found)
}

example_api <- function() {
  path <- system.file("examples", "plumber.R", package = "valve")
  stopifnot(nzchar(path))
  path
}

# An API file holding `code`, removed when the calling test ends.
local_api <- function(code, .local_envir = parent.frame()) {
  dir <- withr::local_tempdir(.local_envir = .local_envir)
  path <- file.path(dir, "plumber.R")
  writeLines(code, path)
  path
}

# Starts valve on a free port and stops it when the calling test ends.
local_valve <- function(..., .local_envir = parent.frame()) {
  handle <- valve_start(example_api(), port = 0, ..., timeout = 60)
  withr::defer(valve_stop(handle, timeout = 10), envir = .local_envir)
  handle
}

fetch <- function(url, post_json = NULL) {
  h <- curl::new_handle(timeout = 20)
  if (!is.null(post_json)) {
    curl::handle_setopt(h, postfields = post_json)
    curl::handle_setheaders(h, "Content-Type" = "application/json")
  }
  res <- curl::curl_fetch_memory(url, handle = h)
  list(status = res$status_code, body = rawToChar(res$content))
}

# ps handles for valve and its R workers, taken while they run.
valve_tree <- function(pid) {
  valve <- ps::ps_handle(as.integer(pid))
  c(list(valve), valve:::worker_handles(pid))
}

# A zombie has exited; only its parent has not collected it yet.
alive <- function(h) {
  tryCatch(ps::ps_is_running(h) && ps::ps_status(h) != "zombie", error = function(e) FALSE)
}

# Waits until `cond()` is TRUE; FALSE if `timeout` seconds pass first.
wait_for <- function(cond, timeout = 15) {
  deadline <- Sys.time() + timeout
  while (Sys.time() < deadline) {
    if (isTRUE(cond())) return(TRUE)
    Sys.sleep(0.1)
  }
  isTRUE(cond())
}

all_gone <- function(handles, timeout = 15) {
  wait_for(function() !any(vapply(handles, alive, logical(1))), timeout)
}

pids_of <- function(handles) vapply(handles, ps::ps_pid, integer(1))

# Processes serving the API at `path`: valve (named in its command line) and
# its workers (named in their VALVE_APP environment variable). API paths are
# unique temporary files, so this never counts another test's or another
# person's valve.
procs_serving <- function(path) {
  paths <- unique(c(path, normalizePath(path)))
  mine <- function(h) {
    tryCatch(
      alive(h) && (
        any(ps::ps_cmdline(h) %in% paths) ||
          unname(ps::ps_environ(h)["VALVE_APP"]) %in% paths
      ),
      error = function(e) FALSE
    )
  }
  Filter(mine, ps::ps()$ps_handle)
}

# valve features that land in the binary separately from this package (a
# plumber router saved as .rds, --config files): a test of one runs when the
# binary's --help mentions it, and otherwise skips as "pending in valve",
# which r/run-tests.sh reports apart from failures.
valve_help <- local({
  cache <- NULL
  function() {
    if (is.null(cache)) {
      cache <<- tryCatch(
        paste(processx::run(valve_binary(), "--help", error_on_status = FALSE)$stdout, collapse = "\n"),
        error = function(e) ""
      )
    }
    cache
  }
})

skip_unless_valve_has <- function(what, pattern) {
  if (!grepl(pattern, valve_help())) {
    skip(paste0("pending in valve: ", what, " (not in this binary's --help yet)"))
  }
}

# Fetches `urls` at the same time (curl's multi interface), in order.
fetch_all <- function(urls, timeout = 30) {
  pool <- curl::new_pool(total_con = length(urls), host_con = length(urls))
  out <- vector("list", length(urls))
  for (i in seq_along(urls)) {
    local({
      j <- i
      curl::curl_fetch_multi(
        urls[[j]],
        done = function(res) out[[j]] <<- list(status = res$status_code, body = rawToChar(res$content)),
        fail = function(msg) out[[j]] <<- list(status = NA_integer_, body = msg),
        pool = pool,
        handle = curl::new_handle(timeout = timeout)
      )
    })
  }
  curl::multi_run(pool = pool)
  out
}
