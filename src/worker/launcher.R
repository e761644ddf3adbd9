# valve worker launcher. valve carries this file inside its binary, writes it to
# its private run directory and starts `R --file=` on it once per worker.
# It serves the API exactly as `library(plumber); pr_run(pr(file))` would, but on
# a Unix socket (httpuv's pipe server) that only valve can reach.
#
# Exit codes valve understands: 3 = a required R package is missing,
# 4 = the API failed to load (R's message is on stderr).
local({
  socket <- Sys.getenv("VALVE_SOCKET")
  app_path <- Sys.getenv("VALVE_APP")
  app_kind <- Sys.getenv("VALVE_APP_KIND")
  public_host <- Sys.getenv("VALVE_PUBLIC_HOST", "127.0.0.1")
  public_port <- as.integer(Sys.getenv("VALVE_PUBLIC_PORT", "3000"))

  fail <- function(status, ...) {
    cat("valve: ", ..., "\n", file = stderr(), sep = "")
    quit(save = "no", status = status)
  }
  for (pkg in c("plumber", "httpuv")) {
    if (!requireNamespace(pkg, quietly = TRUE)) {
      fail(3, "the R package '", pkg, "' is not installed for R ", as.character(getRversion()),
           " (library paths: ", paste(.libPaths(), collapse = ", "), ")")
    }
  }

  # Attach plumber at top level, as users do before pr(): some APIs use %>% or
  # pr_cookie() unqualified.
  suppressPackageStartupMessages(library(plumber))

  router <- tryCatch(
    if (identical(app_kind, "plumber-dir")) plumber::plumb(dir = app_path) else plumber::plumb(app_path),
    error = function(e) fail(4, "the API failed to load: ", conditionMessage(e))
  )

  # Plumber's run() does the set-up users rely on (docs, debug, hooks, working
  # directory) and ends in httpuv::runServer(host, port, app). valve keeps all of
  # that and swaps that last call for a pipe server on valve's private socket.
  serve_on_socket <- function(host, port, app, interruptIntervalMs = NULL) {
    ping <- list(status = 200L, headers = list("Content-Type" = "text/plain"), body = "valve-worker-ready")
    wrapped <- list(call = function(req) {
      if (identical(req$PATH_INFO, "/__valve__/ping")) ping else app$call(req)
    })
    if (is.function(app$onHeaders)) wrapped$onHeaders <- function(req) app$onHeaders(req)
    if (is.function(app$onWSOpen)) wrapped$onWSOpen <- function(ws) app$onWSOpen(ws)
    server <- httpuv::startPipeServer(socket, strtoi("077", 8L), wrapped)
    on.exit(httpuv::stopServer(server))
    httpuv::service(0)
  }
  utils::assignInNamespace("runServer", serve_on_socket, ns = "httpuv")
  router$run(host = public_host, port = public_port, quiet = TRUE)
})
