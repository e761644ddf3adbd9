# Finding the valve binary: one fixed order, and an error naming every place
# tried when none has it.

#' The valve binary this package runs
#'
#' valve is a separate program (written in Rust); this package starts it. It is
#' looked for in this order, and the first hit wins:
#'
#' 1. the option `valve.binary`, e.g. `options(valve.binary = "~/bin/valve")`;
#' 2. the environment variable `VALVE_BINARY`;
#' 3. the copy built when this package was installed, if cargo was there
#'    (`system.file("bin", "valve", package = "valve")`);
#' 4. `valve` on the `PATH` (`Sys.which("valve")`).
#'
#' An option or environment variable that is set but does not point at an
#' executable file is an error rather than skipped, so a typo never silently
#' runs some other valve.
#'
#' @return `valve_binary()`: the absolute path of the binary, or an error
#'   of class `valve_no_binary` naming every place tried. `valve_available()`:
#'   `TRUE` when `valve_binary()` finds one.
#' @export
#' @examples
#' try(valve_binary())
#' valve_available()
valve_binary <- function() {
  find_binary()
}

#' @rdname valve_binary
#' @export
valve_available <- function() {
  tryCatch(
    {
      find_binary()
      TRUE
    },
    valve_no_binary = function(e) FALSE
  )
}

# The lookup itself. `installed` and `path_name` are arguments only so tests can
# point them somewhere fixed; users never pass them.
find_binary <- function(installed = installed_binary(), path_name = "valve") {
  option <- getOption("valve.binary")
  if (!is.null(option)) {
    return(explicit_binary(option, "The option {.code valve.binary}"))
  }
  env <- Sys.getenv("VALVE_BINARY")
  if (nzchar(env)) {
    return(explicit_binary(env, "The environment variable {.envvar VALVE_BINARY}"))
  }
  if (is_executable(installed)) {
    return(normalizePath(installed))
  }
  on_path <- unname(Sys.which(path_name))
  if (nzchar(on_path) && is_executable(on_path)) {
    return(normalizePath(on_path))
  }
  cli::cli_abort(
    c(
      "Cannot find the {.strong valve} binary.",
      "x" = "The option {.code valve.binary} is not set.",
      "x" = "The environment variable {.envvar VALVE_BINARY} is not set.",
      "x" = "No copy built at install time: {.file {installed}} does not exist.",
      "x" = "No {.code {path_name}} on the {.envvar PATH}.",
      "i" = paste(
        "Install Rust's cargo and rustc ({.code apt-get install cargo rustc}",
        "or {.url https://rustup.rs}) and reinstall this package, which then",
        "builds the binary; or build valve with {.code cargo build --release}",
        "and point {.code options(valve.binary = )} or {.envvar VALVE_BINARY} at",
        "{.file target/release/valve}."
      )
    ),
    class = "valve_no_binary",
    call = NULL
  )
}

# Where `R CMD INSTALL` puts the binary configure built. The path is reported
# even when the package has no copy, so the error can say where it looked.
installed_binary <- function() {
  file.path(system.file(package = "valve"), "bin", "valve")
}

explicit_binary <- function(path, source) {
  expanded <- path.expand(path)
  if (!is_executable(expanded)) {
    why <- if (file.exists(expanded)) "is not an executable file" else "does not exist"
    cli::cli_abort(
      c(
        paste0(source, " points at {.file {path}}, which ", why, "."),
        "i" = paste(
          "Point it at the valve binary (e.g. {.file target/release/valve} after",
          "{.code cargo build --release}), or unset it to use the copy",
          "installed with the package or the one on the {.envvar PATH}."
        )
      ),
      class = "valve_no_binary",
      call = NULL
    )
  }
  normalizePath(expanded)
}

is_executable <- function(path) {
  length(path) == 1 && !is.na(path) && nzchar(path) &&
    file.exists(path) && !dir.exists(path) &&
    unname(file.access(path, 1L) == 0L)
}
