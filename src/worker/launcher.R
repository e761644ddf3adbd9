# valve worker launcher. valve carries this file inside its binary, writes it to
# its private run directory and starts `R --file=` on it.
#
# VALVE_APP_KIND: plumber-file, plumber-dir, plumber-rds (a saved router), shiny,
#   shiny-rmd or shiny-prerendered (an interactive R Markdown document: VALVE_APP
#   is the document, run as `rmarkdown::run()` runs it, as Shiny Server does),
#   quarto-shiny (a Quarto document with `server: shiny`: rendered by the Quarto
#   CLI in VALVE_QUARTO, then run as a prerendered document, as the
#   quarto R package's quarto_serve() does), or server-yml (a folder whose _server.yml
#   names an engine package: VALVE_ENGINE's launch_server(VALVE_SETTINGS,
#   VALVE_ENGINE_HOST, VALVE_ENGINE_PORT) serves it over HTTP, never preloaded).
# VALVE_MODE=plain: load the API and serve it.
# VALVE_MODE=render: render a shiny-prerendered document once, before valve
#   starts its workers, and exit (workers never render it themselves).
# VALVE_MODE=packages: say which version of each package named in the
#   variable VALVE_PACKAGES (one a line; never a file, which the app's R could
#   reach) this R finds on its library paths (with the app's environment, working directory and .Rprofile, so an renv
#   library is seen as the app sees it), one line `valve-package NAME VERSION`
#   each (`-` for none), then exit: a published bundle's check.
# VALVE_MODE=install: build one package as the app (a restore of its
#   manifest's or renv.lock's packages): R CMD INSTALL of VALVE_INSTALL_TARBALL
#   into VALVE_INSTALL_OUT, with VALVE_LIBRARY as its only library besides R's.
# VALVE_MODE=preload: load the API (or the Shiny app) once, then fork a worker
#   for each line `fork ID SOCKET FIFO TOKEN` valve writes on stdin (TOKEN: the
#   fork's own frames token, `-` for none); exit when stdin closes.
# VALVE_TRANSPORT (plumber only; Shiny always uses httpuv):
#   frames: the request loop in VALVE_LOOP (loop.R, next to this file) takes
#     requests from valve over one loopback connection it opens to
#     VALVE_FRAME_PORT, with VALVE_FRAME_TOKEN and VALVE_WORKER_ID in its hello;
#   httpuv: httpuv's pipe server on the Unix socket VALVE_SOCKET.
#
# Each worker serves the API exactly as `library(plumber); pr_run(pr(file))`
# would, but only valve can reach it.
# Exit codes valve understands: 3 = a required R package is missing,
# 4 = the API failed to load (R's message is on stderr), 5 = the document
# could not be rendered (the last line on stderr is `valve-render-failed: MESSAGE`).
local({
  mode <- Sys.getenv("VALVE_MODE", "plain")
  app_path <- Sys.getenv("VALVE_APP")
  app_kind <- Sys.getenv("VALVE_APP_KIND")
  public_host <- Sys.getenv("VALVE_PUBLIC_HOST", "127.0.0.1")
  public_port <- as.integer(Sys.getenv("VALVE_PUBLIC_PORT", "3000"))

  # An app with its own library (restored packages, then what valve needs):
  # those paths and R's own, never the server's site library.
  own_library <- Sys.getenv("VALVE_LIBRARY")
  if (nzchar(own_library)) {
    .libPaths(strsplit(own_library, ":", fixed = TRUE)[[1]], include.site = FALSE)
  }
  fail <- function(status, ...) {
    cat("valve: ", ..., "\n", file = stderr(), sep = "")
    quit(save = "no", status = status)
  }
  if (identical(mode, "install")) {
    # One package's build, as the app: R CMD INSTALL of the tarball in
    # VALVE_INSTALL_TARBALL into VALVE_INSTALL_OUT, finding what it needs in
    # VALVE_LIBRARY (and R's own library) alone.
    status <- system2(file.path(R.home("bin"), "R"),
                      c("CMD", "INSTALL", "--no-docs", "--no-multiarch",
                        "-l", shQuote(Sys.getenv("VALVE_INSTALL_OUT")),
                        shQuote(Sys.getenv("VALVE_INSTALL_TARBALL"))))
    quit(save = "no", status = status)
  }
  if (identical(mode, "packages")) {
    wanted <- strsplit(Sys.getenv("VALVE_PACKAGES"), "\n", fixed = TRUE)[[1]]
    cat("valve-r ", as.character(getRversion()), " ", paste(.libPaths(), collapse = ":"), "\n", sep = "")
    for (name in sub(" .*", "", wanted[nzchar(wanted)])) {
      found <- suppressWarnings(utils::packageDescription(name, fields = "Version"))
      cat("valve-package ", name, " ", if (is.na(found)) "-" else found, "\n", sep = "")
    }
    quit(save = "no", status = 0)
  }
  # A Unix socket has no peer address: valve names the client in two headers
  # (X-Valve-Remote-Addr, -Port; it removes any a client sent), which become
  # the Rook environment's REMOTE_ADDR and REMOTE_PORT, as on a TCP server.
  client_from_valve <- function(req) {
    addr <- req[["HTTP_X_VALVE_REMOTE_ADDR"]]
    if (!is.null(addr)) {
      port <- req[["HTTP_X_VALVE_REMOTE_PORT"]]
      assign("REMOTE_ADDR", addr, envir = req)
      assign("REMOTE_PORT", if (is.null(port)) "" else port, envir = req)
      rm("HTTP_X_VALVE_REMOTE_ADDR", envir = req)
      if (!is.null(port)) rm("HTTP_X_VALVE_REMOTE_PORT", envir = req)
    }
    # valve's TLS: R sees the scheme its client used.
    scheme <- req[["HTTP_X_VALVE_SCHEME"]]
    if (!is.null(scheme)) {
      assign("rook.url_scheme", scheme, envir = req)
      rm("HTTP_X_VALVE_SCHEME", envir = req)
    }
    req
  }
  # valve's link token (VALVE_LINK_TOKEN, read when a request comes: a
  # preloaded fork learns its own after the app is built) is on every
  # request valve sends; anything else that reaches the socket (another
  # program of the same user: under Landlock another app's R can connect to
  # a pathname socket) gets 403 and never reaches the app.
  linked <- function(req) {
    want <- Sys.getenv("VALVE_LINK_TOKEN")
    !nzchar(want) || identical(req[["HTTP_X_VALVE_LINK"]], want)
  }
  refused <- list(status = 403L, headers = list("Content-Type" = "text/plain"),
                  body = "this socket serves valve only")
  unlink_req <- function(req) {
    if (!is.null(req[["HTTP_X_VALVE_LINK"]])) rm("HTTP_X_VALVE_LINK", envir = req)
    req
  }
  # The same httpuv app (its static paths too), each hook seeing the client.
  # httpuv serves static paths (Shiny's www/ and resource paths) without
  # calling R: its own header check asks them for the link token too.
  with_client <- function(app) {
    out <- app
    want <- Sys.getenv("VALVE_LINK_TOKEN")
    opts <- if (is.null(app$staticPathOptions)) httpuv::staticPathOptions() else app$staticPathOptions
    if (nzchar(want) && length(app$staticPaths) > 0 && length(opts$validation) == 0) {
      # Normalized options hold one check as c("==", header, value).
      opts$validation <- c("==", "x-valve-link", want)
      out$staticPathOptions <- opts
    }
    if (is.function(app$call)) out$call <- function(req) {
      if (!linked(req)) return(refused)
      app$call(client_from_valve(unlink_req(req)))
    }
    out$onHeaders <- function(req) {
      if (!linked(req)) return(refused)
      if (is.function(app$onHeaders)) app$onHeaders(client_from_valve(req)) else NULL
    }
    if (is.function(app$onWSOpen)) out$onWSOpen <- function(ws) {
      if (!linked(ws$request)) return(ws$close())
      client_from_valve(unlink_req(ws$request))
      app$onWSOpen(ws)
    }
    out
  }

  # A _server.yml app: the engine named in it serves the folder, as the
  # convention (plumber2's vignette "_server.yml") has a host do it, on the
  # loopback port valve picked. It needs nothing of valve's R side.
  if (identical(app_kind, "server-yml")) {
    engine <- Sys.getenv("VALVE_ENGINE")
    settings <- Sys.getenv("VALVE_SETTINGS")
    # httpuv's startServer(host, port) serves on this worker's private Unix
    # socket instead, which only valve and this worker can reach (a loopback
    # port any local process could). Done before the engine loads, so that
    # it imports the replacement.
    socket <- Sys.getenv("VALVE_SOCKET")
    if (nzchar(socket) && requireNamespace("httpuv", quietly = TRUE)) {
      httpuv_ns <- asNamespace("httpuv")
      start_pipe <- get("startPipeServer", envir = httpuv_ns)
      unlockBinding("startServer", httpuv_ns)
      assign("startServer", envir = httpuv_ns, function(host, port, app, quiet = FALSE) {
        start_pipe(socket, strtoi("077", 8L), with_client(app))
      })
      lockBinding("startServer", httpuv_ns)
    }
    if (!requireNamespace(engine, quietly = TRUE)) {
      fail(3, "the engine package '", engine, "' named in ", settings, " is not installed for R ",
           as.character(getRversion()), " (library paths: ", paste(.libPaths(), collapse = ", "),
           "): install it with install.packages(\"", engine, "\") or R CMD INSTALL its source",
           " into a library R finds (R_LIBS)")
    }
    launch <- tryCatch(get("launch_server", envir = asNamespace(engine), mode = "function"), error = function(e) NULL)
    if (is.null(launch)) {
      fail(4, "the package '", engine, "' named in ", settings,
           " has no launch_server() function, so it is no _server.yml engine")
    }
    launch(settings = settings, host = Sys.getenv("VALVE_ENGINE_HOST"),
           port = as.integer(Sys.getenv("VALVE_ENGINE_PORT")))
    # The convention's launch_server() blocks while it serves; one that
    # started its server in the background returned: turn its event loop.
    if (requireNamespace("later", quietly = TRUE)) repeat later::run_now(timeoutSecs = 3600)
    quit(save = "no")
  }

  rmd <- app_kind %in% c("shiny-rmd", "shiny-prerendered", "quarto-shiny")
  shiny <- identical(app_kind, "shiny") || rmd
  for (pkg in c(if (shiny) "shiny" else "plumber", "httpuv", if (rmd) "rmarkdown")) {
    if (!requireNamespace(pkg, quietly = TRUE)) {
      fail(3, "the R package '", pkg, "' is not installed for R ", as.character(getRversion()),
           " (library paths: ", paste(.libPaths(), collapse = ", "), ")")
    }
  }

  # The API may ask for set-up in every worker (a database connection, say):
  # options(valve.on_worker_start = function() ...). With --preload it runs in
  # each fork, after the fork, never in the parent.
  on_worker_start <- function() {
    hook <- getOption("valve.on_worker_start")
    if (is.function(hook)) hook()
  }

  # valve's own protocol: loop.R's functions live in their own environment.
  frames <- !shiny && identical(Sys.getenv("VALVE_TRANSPORT"), "frames")
  if (frames) {
    # A fork of valve's warm parent finds the loop there, loaded and warmed.
    frames_env <- getOption("valve.frames_env")
    if (!is.environment(frames_env)) {
      frames_env <- new.env()
      sys.source(Sys.getenv("VALVE_LOOP"), envir = frames_env, keep.source = FALSE)
    }
  }
  # Serves frames until valve closes the connection; warms up first unless
  # this is a fork of a parent that did.
  serve_frames <- function(app, id, warm_up) {
    frames_env$valve_serve_frames(app, port = as.integer(Sys.getenv("VALVE_FRAME_PORT")),
                                  token = Sys.getenv("VALVE_FRAME_TOKEN"), worker_id = id, warm_up = warm_up)
  }

  # --preload: the parent process loads the app once and only forks; each fork
  # is a worker. `serve(socket, id)` is what a fork does once it is set up.
  valve_pid <- Sys.getenv("VALVE_PID")
  valve_start <- Sys.getenv("VALVE_START_TIME")
  valve_alive <- function() {
    stat <- tryCatch(readLines(sprintf("/proc/%s/stat", valve_pid), warn = FALSE), error = function(e) "")
    fields <- strsplit(sub(".*\\) ", "", stat[1]), " ", fixed = TRUE)[[1]]
    length(fields) >= 20 && identical(fields[20], valve_start)
  }

  # Loaded once here in the parent; started in each fork.
  enter_dll <- tryCatch(dyn.load(Sys.getenv("VALVE_ENTER_LIB")), error = function(e) NULL)
  lifeline <- function() {
    fd <- as.integer(Sys.getenv("VALVE_LIFELINE", NA))
    !is.null(enter_dll) && !is.na(fd) &&
      isTRUE(.C("valve_lifeline", fd, ok = FALSE, PACKAGE = enter_dll[["name"]])$ok)
  }

  # Whether valve still reads `path`: a FIFO with no reader (valve gave up on
  # this fork, or is gone) would block a plain open for ever, leaving an
  # orphan R; the probe opens without waiting and fails at once instead.
  fifo_has_reader <- function(path) {
    file.exists(path) && tryCatch({
      close(fifo(path, open = "w", blocking = FALSE))
      TRUE
    }, warning = function(w) FALSE, error = function(e) FALSE)
  }

  become_worker <- function(id, socket, fifo, token, link, serve) {
    # Output goes to valve through this fork's own channel, pid first.
    # Write-only: valve holds the FIFO open for reading, so this never waits;
    # unless valve no longer does, and then the fork ends.
    if (!fifo_has_reader(fifo)) parallel:::mcexit(7L)
    out <- file(fifo, open = "w", raw = TRUE)
    writeLines(paste("valve-fork-pid", Sys.getpid()), out)
    flush(out)
    sink(out)
    sink(out, type = "message")
    Sys.setenv(VALVE_WORKER_ID = id, VALVE_SOCKET = socket, VALVE_LINK_TOKEN = link)
    if (!identical(token, "-")) Sys.setenv(VALVE_FRAME_TOKEN = token)
    # A fresh individual: R seeds its generator from the time and pid on next use.
    if (exists(".Random.seed", envir = globalenv(), inherits = FALSE)) {
      rm(".Random.seed", envir = globalenv())
    }
    # Its own temporary directory (tempdir() and tempfile() use it).
    own_tmp <- file.path(tempdir(), paste0("worker-", id))
    dir.create(own_tmp, showWarnings = FALSE)
    base <- baseenv()
    unlockBinding("tempdir", base)
    assign("tempdir", function(check = FALSE) own_tmp, envir = base)
    lockBinding("tempdir", base)
    Sys.setenv(TMPDIR = own_tmp)
    # R's own exit sequence can deadlock in a fork (it waits on threads that were
    # not copied), so quit() and q() end the fork at once.
    # A fork's exit status goes to its parent, not to valve, so it says it:
    # valve tells an exit R chose (quit() in an endpoint) from a kill.
    exit_now <- function(save = "default", status = 0, runLast = TRUE) {
      try({
        writeLines(paste("valve-fork-exit", as.integer(status)), out)
        flush(out)
      }, silent = TRUE)
      parallel:::mcexit(as.integer(status))
    }
    for (name in c("quit", "q")) {
      unlockBinding(name, base)
      assign(name, exit_now, envir = base)
      lockBinding(name, base)
    }
    # A fork's parent is this R, not valve: it dies with valve by the lifeline
    # (a thread that waits on a pipe only valve holds open), or else checks
    # on valve itself whenever R is idle.
    if (!lifeline()) {
      watchdog <- function() {
        if (!valve_alive()) tools::pskill(Sys.getpid(), tools::SIGKILL)
        later::later(watchdog, 1)
      }
      later::later(watchdog, 1)
    }
    on_worker_start()
    serve(socket, id)
  }

  # Returns only in a fork, with what `serve` returned; the parent quits when stdin closes.
  fork_on_demand <- function(serve) {
    commands <- file("stdin", open = "r")
    repeat {
      line <- readLines(commands, n = 1)
      if (length(line) == 0) quit(save = "no", status = 0)
      words <- strsplit(line, " ", fixed = TRUE)[[1]]
      if (length(words) != 6 || words[1] != "fork") next
      child <- parallel:::mcfork(estranged = TRUE)
      if (inherits(child, "masterProcess")) {
        close(commands)
        return(become_worker(words[2], words[3], words[4], words[5], words[6], serve))
      }
    }
  }

  # A shiny_prerendered document, rendered once by valve before any worker
  # starts, the way rmarkdown::run() would render it (to doc.html beside it,
  # in a new environment whose parent is the global one). A folder valve
  # cannot write to keeps the HTML it holds, as rmarkdown::run() does, and so
  # does RMARKDOWN_RUN_PRERENDER=0 (the HTML was rendered beforehand).
  # Where a prerendered document's HTML is: beside it (as rmarkdown::run()
  # writes it) when its folder is writable or already holds it; else, when
  # the app runs as a user of its own that cannot write there, in its private
  # render folder VALVE_RENDER_DIR, which valve made for this generation.
  render_dir <- function() {
    html <- file.path(dirname(app_path), paste0(tools::file_path_sans_ext(basename(app_path)), ".html"))
    out <- Sys.getenv("VALVE_RENDER_DIR")
    beside <- file.access(dirname(app_path), 2) == 0 || file.exists(html) || !nzchar(out)
    if (beside) NULL else out
  }

  if (identical(mode, "render")) {
    html <- file.path(dirname(app_path), paste0(tools::file_path_sans_ext(basename(app_path)), ".html"))
    elsewhere <- render_dir()
    keep <- identical(Sys.getenv("RMARKDOWN_RUN_PRERENDER"), "0") ||
      (is.null(elsewhere) && file.access(dirname(app_path), 2) != 0)
    if (keep) {
      if (!file.exists(html)) {
        fail(5, "valve-render-failed: ", html, " does not exist and cannot be rendered here (",
             if (identical(Sys.getenv("RMARKDOWN_RUN_PRERENDER"), "0")) "RMARKDOWN_RUN_PRERENDER=0" else "the folder is read-only",
             "): render it beforehand with rmarkdown::render()")
      }
      cat("valve-render: kept ", html, "\n", sep = "")
      quit(save = "no", status = 0)
    }
    if (identical(app_kind, "quarto-shiny")) {
      # As the quarto R package's quarto_serve() renders before rmarkdown::run(): the Quarto
      # CLI writes doc.html (and doc_files/) beside the document.
      status <- system2(Sys.getenv("VALVE_QUARTO"), c("render", shQuote(app_path)))
      if (!identical(as.integer(status), 0L)) {
        fail(5, "valve-render-failed: quarto render ", app_path, " exited with status ", status,
             " (Quarto's message is above)")
      }
      cat("valve-render: rendered ", html, " with quarto\n", sep = "")
      quit(save = "no", status = 0)
    }
    where <- NULL
    rendered <- tryCatch(
      withCallingHandlers(
        if (is.null(elsewhere)) {
          rmarkdown::render(app_path, envir = new.env(parent = globalenv()), quiet = TRUE)
        } else {
          # The folder is not the app's to write: the HTML goes to its render
          # folder, knitr's intermediate files to its temporary folder.
          rmarkdown::render(app_path, envir = new.env(parent = globalenv()), quiet = TRUE,
                            output_dir = elsewhere, intermediates_dir = tempdir(), knit_root_dir = dirname(app_path))
        },
        message = function(m) {
          # knitr says which chunk failed as a message before the error.
          if (grepl("^Quitting from lines", conditionMessage(m))) where <<- trimws(conditionMessage(m))
        }
      ),
      error = function(e) {
        msg <- gsub("\\s+", " ", trimws(conditionMessage(e)))
        fail(5, "valve-render-failed: ", msg, if (length(where)) paste0(" (knitr: ", where, ")"))
      }
    )
    cat("valve-render: rendered ", rendered, "\n", sep = "")
    quit(save = "no", status = 0)
  }

  if (shiny) {
    # Shiny serves a domain socket itself when `port` is a path with a `mask`.
    # In a fork of the warm parent shiny is loaded already: attaching it is
    # all library() would do, at a third of the cost.
    if (isNamespaceLoaded("shiny") && !"package:shiny" %in% search()) {
      suppressPackageStartupMessages(attachNamespace("shiny"))
    } else {
      suppressPackageStartupMessages(library(shiny))
    }
    socket <- Sys.getenv("VALVE_SOCKET", "preload-parent")
    attr(socket, "mask") <- strtoi("077", 8L)
    imports <- parent.env(asNamespace("shiny"))
    start_pipe <- get("startPipeServer", envir = imports)
    unlockBinding("startPipeServer", imports)
    if (identical(mode, "plain")) {
      on_worker_start()
      assign("startPipeServer", envir = imports, function(name, mask, app) {
        start_pipe(name, mask, with_client(app))
      })
    } else {
      # --preload: runApp() does everything it does before serving (global.R,
      # R/, app.R's top level: the data it loads) once, here in the parent; at
      # the point where it starts its server, the parent forks instead, and
      # each fork starts its own server on its socket and goes on inside
      # runApp() as a worker. Shiny's own random seed (session tokens) is reset
      # in each fork.
      assign("startPipeServer", envir = imports, function(name, mask, app) {
        fork_on_demand(function(socket, id) {
          assign("ownSeed", NULL, envir = shiny:::.globals)
          start_pipe(socket, mask, with_client(app))
        })
      })
    }
    lockBinding("startPipeServer", imports)
    if (rmd) {
      # As Shiny Server runs a document: rmarkdown::run() on its folder, the
      # document as the default, no auto-reload (valve reloads), and the port
      # passed through to shiny::runApp(). A prerendered document was rendered
      # by valve already: rmarkdown must not render it again in each worker.
      if (app_kind %in% c("shiny-prerendered", "quarto-shiny")) Sys.setenv(RMARKDOWN_RUN_PRERENDER = "0")
      render_args <- list(envir = globalenv())
      if (app_kind == "shiny-prerendered") render_args$output_dir <- render_dir()
      rmarkdown::run(file = NULL, dir = dirname(app_path), default_file = basename(app_path),
                     shiny_args = list(port = socket, launch.browser = FALSE, quiet = TRUE),
                     render_args = render_args, auto_reload = FALSE)
    } else {
      shiny::runApp(app_path, port = socket, launch.browser = FALSE, quiet = TRUE)
    }
    quit(save = "no")
  }

  # Attach plumber at top level, as users do before pr(): some APIs use %>% or
  # pr_cookie() unqualified.
  suppressPackageStartupMessages(library(plumber))

  # A router saved with saveRDS() (built in an R session) is read back as is.
  read_router <- function(path) {
    r <- readRDS(path)
    if (!inherits(r, "Plumber")) {
      stop("'", path, "' holds ", class(r)[1], ", not a plumber router: save one made with pr() or plumb()")
    }
    r
  }
  router <- tryCatch(
    switch(app_kind,
      "plumber-dir" = plumber::plumb(dir = app_path),
      "plumber-rds" = read_router(app_path),
      plumber::plumb(app_path)
    ),
    error = function(e) fail(4, "the API failed to load: ", conditionMessage(e))
  )

  # Plumber's run() does the set-up users rely on (docs, debug, hooks, working
  # directory) and ends in httpuv::runServer(host, port, app). valve keeps all of
  # that and swaps that last call for `then(app)`: serving on valve's private
  # socket, or (with --preload) forking workers that serve it. So forks inherit
  # a router that is already set up and only start their pipe server.
  run_with <- function(then) {
    utils::assignInNamespace("runServer", function(host, port, app, interruptIntervalMs = NULL) then(app), ns = "httpuv")
    router$run(host = public_host, port = public_port, quiet = TRUE)
  }

  # valve's readiness path, answered with the pid of whoever answers it.
  serve_on_socket <- function(socket, app) {
    wrapped <- list(call = function(req) {
      if (identical(req$PATH_INFO, "/__valve__/ping")) {
        list(status = 200L, headers = list("Content-Type" = "text/plain"),
             body = paste("valve-worker-ready", Sys.getpid()))
      } else {
        app$call(req)
      }
    })
    if (is.function(app$onHeaders)) wrapped$onHeaders <- function(req) app$onHeaders(req)
    if (is.function(app$onWSOpen)) wrapped$onWSOpen <- function(ws) app$onWSOpen(ws)
    server <- httpuv::startPipeServer(socket, strtoi("077", 8L), with_client(wrapped))
    on.exit(httpuv::stopServer(server))
    httpuv::service(0)
  }

  if (identical(mode, "plain")) {
    on_worker_start()
    if (frames) {
      run_with(function(app) serve_frames(app, Sys.getenv("VALVE_WORKER_ID"), warm_up = TRUE))
    } else {
      run_with(function(app) serve_on_socket(Sys.getenv("VALVE_SOCKET"), app))
    }
    quit(save = "no")
  }

  run_with(function(app) {
    # Warm up once, here: every fork starts warm and shares what it compiled.
    if (frames) frames_env$valve_warm_up(app)
    fork_on_demand(function(socket, id) {
      if (frames) serve_frames(app, id, warm_up = FALSE) else serve_on_socket(socket, app)
    })
    quit(save = "no", status = 0)
  })
})
