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

# What valve serves, as its command line: `--file PATH` for a plumber file or
# folder, a Shiny app folder or app.R; `--config PATH` for a .toml file of
# several apps. A plumber router built in this session is only checked to be
# one here: with_router() saves it once the binary is known. NULL passes
# nothing: valve's default applies.
app_args <- function(app, call) {
  if (is.null(app)) {
    return(list(args = character(), cleanup = NULL))
  }
  if (is_router(app)) {
    # Saved once the binary is known (see with_router()).
    return(list(args = character(), cleanup = NULL, router = app))
  }
  if (inherits(app, "shiny.appobj")) {
    cli::cli_abort(
      c(
        "valve serves a Shiny app from its files, not from a {.fn shinyApp} object.",
        "i" = "Pass the app's folder (holding {.file app.R}, or {.file ui.R} and {.file server.R}) or its {.file app.R} file."
      ),
      call = call
    )
  }
  if (!is.character(app) || length(app) != 1 || is.na(app) || !nzchar(app)) {
    cli::cli_abort(
      c(
        "{.arg app} must be the path of a plumber file or folder, a Shiny app folder or {.file app.R}, or a {.file .toml} file of several apps; or a plumber router built with {.fn plumber::pr}.",
        "x" = "It is {.obj_type_friendly {app}}."
      ),
      call = call
    )
  }
  path <- path.expand(app)
  flag <- if (grepl("\\.toml$", path, ignore.case = TRUE)) "--config" else "--file"
  list(args = c(flag, path), cleanup = NULL)
}

# The whole command line for valve_run() and valve_start(). `flags` holds the
# named arguments: NULL ones (those the user did not give) are left out, so
# valve's own defaults apply. `dots` are any other valve flags. The R
# executable defaults to the one running this session, so the workers see the
# same R version; VALVE_R_BIN or r_bin = choose another. `filepath` (the
# reference tool's name for the app) is taken for `app`.
valve_command <- function(app, flags, dots, call) {
  if ("filepath" %in% names(dots)) {
    if (!is.null(app)) {
      cli::cli_abort("Give {.arg app} or {.arg filepath}, not both.", call = call)
    }
    app <- dots$filepath
    dots$filepath <- NULL
  }
  # Checked before a router is saved.
  rest <- valve_args(c(flags, dots), call = call)
  if (!"r_bin" %in% names(dots) && !nzchar(Sys.getenv("VALVE_R_BIN"))) {
    rest <- c(rest, "--r-bin", file.path(R.home("bin"), "R"))
  }
  target <- app_args(app, call)
  list(args = c(target$args, rest), cleanup = target$cleanup, router = target$router)
}

# A router is saved for the workers into a private directory, and valve
# started with `--file` on it: on the .rds file when this valve binary reads
# routers saved with saveRDS() (its --help says so), else on the directory,
# with an entrypoint.R that reads the .rds (plumber::plumb(dir = ) serves
# what entrypoint.R returns), so older binaries serve routers too.
with_router <- function(command, binary, call) {
  if (is.null(command$router)) {
    return(command)
  }
  path <- save_router(command$router, call = call)
  dir <- dirname(path)
  target <- path
  if (!reads_rds(binary)) {
    writeLines(c(
      "# Written by the valve R package: this valve binary does not read .rds",
      "# routers itself, so plumber::plumb(dir = ) serves what this returns.",
      paste0("readRDS(", deparse(path), ")")
    ), file.path(dir, "entrypoint.R"))
    target <- dir
  }
  command$args <- c("--file", target, command$args)
  command$cleanup <- dir
  command$router <- NULL
  command
}

reads_rds <- function(binary) {
  help <- tryCatch(
    processx::run(binary, "--help", error_on_status = FALSE, timeout = 10)$stdout,
    error = function(e) ""
  )
  grepl("saveRDS|\\.rds", help)
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
