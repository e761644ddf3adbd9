# The package's own state: the valves this session started and has not stopped.

#' @keywords internal
"_PACKAGE"

the <- new.env(parent = emptyenv())
the$running <- new.env(parent = emptyenv())
