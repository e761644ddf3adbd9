# Turning R arguments into valve's command line, so every valve flag, including
# ones added after this package was written, can be passed from R.

# `flags` is a named list: `request_timeout = 30` becomes
# `--request-timeout 30`, TRUE a bare `--flag`, FALSE and NULL nothing.
valve_args <- function(flags, call = rlang::caller_env()) {
  if (length(flags) == 0) {
    return(character())
  }
  nms <- names(flags)
  if (is.null(nms) || any(is.na(nms) | !nzchar(nms))) {
    cli::cli_abort(
      c(
        "Every extra argument must be named after a valve flag.",
        "i" = "For example {.code request_timeout = 30} for {.code --request-timeout 30}; see {.code valve --help}."
      ),
      call = call
    )
  }
  out <- character()
  for (i in seq_along(flags)) {
    out <- c(out, one_flag(nms[[i]], flags[[i]], call))
  }
  out
}

one_flag <- function(name, value, call) {
  flag <- paste0("--", gsub("_", "-", name, fixed = TRUE))
  if (is.null(value) || isFALSE(value)) {
    return(character())
  }
  if (isTRUE(value)) {
    return(flag)
  }
  ok <- (is.numeric(value) || is.character(value)) &&
    length(value) == 1 && !is.na(value)
  if (!ok) {
    cli::cli_abort(
      c(
        "{.arg {name}} must be a single number, string, TRUE, FALSE or NULL.",
        "x" = "It is {.obj_type_friendly {value}}."
      ),
      call = call
    )
  }
  if (is.numeric(value)) {
    value <- format(value, scientific = FALSE, digits = 15, trim = TRUE)
  }
  c(flag, value)
}

# Arguments valve_run() and valve_start() share, as valve flags. The R
# executable defaults to the one running this session, so the workers see the
# same R version; VALVE_R_BIN or r_bin = in `...` choose another.
common_args <- function(filepath, host, port, n_min, n_max, workers,
                        check_unused, max_age, dots, call) {
  if (!is.character(filepath) || length(filepath) != 1 || is.na(filepath)) {
    cli::cli_abort("{.arg filepath} must be the path of a plumber API file or directory.", call = call)
  }
  named <- list(
    file = path.expand(filepath), host = host, port = port, n_min = n_min,
    n_max = n_max, workers = workers, check_unused = check_unused,
    max_age = max_age
  )
  if (!"r_bin" %in% names(dots) && !nzchar(Sys.getenv("VALVE_R_BIN"))) {
    named$r_bin <- file.path(R.home("bin"), "R")
  }
  valve_args(c(named, dots), call = call)
}

# The environment valve runs in: this session's library paths, so workers find
# the packages (plumber first of all) that this session finds.
child_env <- function(...) {
  c(
    "current",
    R_LIBS = paste(.libPaths(), collapse = .Platform$path.sep),
    ...
  )
}
