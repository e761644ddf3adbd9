# valve's warm parent. valve carries this file inside its binary, writes it to
# its run directory and starts `R --file=` on it once, shared by every app
# that can use it. It loads the packages apps load (plumber, shiny,
# rmarkdown and VALVE_PRELOAD_PACKAGES), warms them (the lazy loads a first
# router or page pulls in), and never runs an app's code. For each line valve
# writes on stdin (one JSON object: a worker to start) it forks; the fork
# becomes that app's worker:
#
#   1. it reads (and removes) the file valve wrote with its environment
#      (through a handle: valve's own file, never a link), and says its pid
#      on the parent's output (`valve-fork ID pid PID`; the parent says it
#      too, as soon as it has forked);
#   2. it enters the app's sandbox (valve_enter(), the C executor valve wrote
#      beside this file: a mount namespace and the app's view, its working
#      directory, memory limit (on top of the data it inherits beyond a bare
#      R's), groups, gid, uid, no new privileges), and only then, as the
#      app's user, opens the FIFO valve made for it (write-only) for its
#      output, its pid first; a step that fails is said on the parent's
#      output (`valve-fork ID failed STEP: errno N`);
#   3. it takes the worker's environment (the app's own variables, HOME,
#      TMPDIR...; of an app of its own user, nothing else of valve's or the
#      parent's but what valve allows), its own temporary folder and random
#      seed, and starts as R's own start-up would for the app: its
#      .Renviron, its library paths, its project .Rprofile;
#   4. it checks that nothing the parent loaded differs from what the app's
#      library paths hold; if something does, it exits with code 6
#      (`valve-fresh-r: WHY`) and valve starts a fresh R for the app instead;
#      of an app with a library of its own, it unloads what the parent
#      loaded and the app did not name;
#   5. it runs the launcher as a plain worker of the app (VALVE_LAUNCHER),
#      which loads and serves it.
#
# Exit codes of a fork valve understands: 6 = needs a fresh R (the reason on
# its FIFO), 7 = could not enter the app's sandbox (the step and the error,
# on the parent's output).
local({
  started <- Sys.time()
  # The data a bare R holds (RLIMIT_DATA counts it): what the parent loads
  # beyond it for every app is not charged to a fork's memory_limit.
  vm_data <- function() {
    line <- grep("^VmData:", readLines("/proc/self/status"), value = TRUE)
    as.numeric(sub("^VmData:[[:space:]]*([0-9]+) kB.*$", "\\1", line)) * 1024
  }
  bare_data <- vm_data()
  quiet_load <- function(pkg) suppressPackageStartupMessages(requireNamespace(pkg, quietly = TRUE))
  wanted <- c("jsonlite", "later", "httpuv", "plumber", "shiny", "rmarkdown", "knitr",
              strsplit(Sys.getenv("VALVE_PRELOAD_PACKAGES"), ",", fixed = TRUE)[[1]])
  wanted <- unique(trimws(wanted[nzchar(trimws(wanted))]))
  loaded <- wanted[vapply(wanted, quiet_load, TRUE)]
  if (!"jsonlite" %in% loaded) {
    cat("valve: the warm parent needs the R package 'jsonlite'\n", file = stderr())
    quit(save = "no", status = 3)
  }
  # Attached as a plain worker has them (the launcher attaches them again, at once).
  if ("plumber" %in% loaded) suppressPackageStartupMessages(library(plumber))

  # Warm up: what a first router or page pulls in lazily, done once here.
  warm <- function() {
    if ("plumber" %in% loaded) {
      f <- tempfile(fileext = ".R")
      writeLines(c("#* @get /", "#* @serializer unboxedJSON", "function(req) list(ok = TRUE)"), f)
      router <- plumber::pr(f)
      # plumber's request path, as valve's frames loop drives it; the loop,
      # loaded and compiled here, is every fork's (the launcher finds it).
      env <- new.env()
      sys.source(Sys.getenv("VALVE_LOOP"), envir = env, keep.source = FALSE)
      env$valve_warm_up(router)
      options(valve.frames_env = env)
      # A frames worker connects to valve with socketConnection(): R loads its
      # internet module on the first one (a refused connection does it here).
      try(suppressWarnings(close(socketConnection("127.0.0.1", port = 1L, blocking = FALSE, open = "r+b",
                                                  timeout = 1))), silent = TRUE)
      # plumber's run() up to its server (the docs' set-up, hooks), as the
      # launcher drives it, with httpuv's runServer a no-op for the while.
      real <- httpuv::runServer
      utils::assignInNamespace("runServer", function(host, port, app, interruptIntervalMs = NULL) invisible(NULL),
                               ns = "httpuv")
      try(router$run(host = "127.0.0.1", port = 1L, quiet = TRUE), silent = TRUE)
      utils::assignInNamespace("runServer", real, ns = "httpuv")
      unlink(f)
    }
    if ("shiny" %in% loaded) {
      # fontawesome: shiny's icons (and its showcase mode) load it on a first page.
      quiet_load("fontawesome")
      ui <- shiny::fluidPage(shiny::titlePanel("warm"), shiny::sliderInput("n", "n", 1, 10, 5),
                             shiny::textOutput("out"), shiny::plotOutput("plot"), shiny::icon("house"))
      invisible(htmltools::renderTags(ui))
      # A first page as Shiny serves it (bslib, sass, jquerylib load then:
      # ~0.1 s a fork would pay on its first page). It leaves no file behind.
      app <- shiny::shinyApp(ui, function(input, output) NULL)
      req <- list2env(list(REQUEST_METHOD = "GET", PATH_INFO = "/", QUERY_STRING = "",
                           HTTP_HOST = "127.0.0.1", HEADERS = c(host = "127.0.0.1")))
      invisible(app$httpHandler(req))
    }
    if ("rmarkdown" %in% loaded) invisible(rmarkdown::html_document())
  }
  tryCatch(warm(), error = function(e) cat("valve: warming up: ", conditionMessage(e), "\n", sep = "", file = stderr()))
  # Every object of the packages a first page or answer runs through, read
  # from their lazy-load databases once here rather than in each fork: a fork
  # that reads them allocates, and its garbage collection then writes to
  # pages it shares with this parent, each of which the kernel must copy.
  # (About 0.3 s and 30 MB here, shared by all forks; a Shiny fork's first
  # page is about 25 ms faster.)
  path_packages <- c("shiny", "htmltools", "bslib", "sass", "jquerylib", "httpuv", "later", "promises",
                     "fastmap", "R6", "jsonlite", "cachem", "fontawesome", "commonmark", "ellipsis",
                     "lifecycle", "digest", "mime", "withr", "glue", "memoise")
  for (pkg in intersect(path_packages, loadedNamespaces())) {
    ns <- asNamespace(pkg)
    for (name in ls(ns, all.names = TRUE)) {
      if (!bindingIsActive(name, ns)) try(get(name, envir = ns), silent = TRUE)
    }
  }
  # What every fork runs first, compiled here once. A fork runs with R's JIT
  # on (below), and the JIT compiles a closure on its first or second call,
  # in each fork anew: the launcher's code and the frames loop's functions
  # cost a fork about 50 ms of compiling before its first answer (a first
  # API request 136-150 ms against 85-94 ms compiled here, for 0.5 s more
  # here). plumber's and Shiny's R6 methods (copied into each object) were
  # tried too: 1-5 s more here for nothing measurable in a fork.
  compiled <- function(f) {
    if (!is.function(f) || is.primitive(f) || typeof(.Internal(bodyCode(f))) == "bytecode") return(f)
    tryCatch(suppressMessages(suppressWarnings(compiler::cmpfun(f))), error = function(e) f)
  }
  frames_env <- getOption("valve.frames_env")
  if (is.environment(frames_env)) {
    for (name in ls(frames_env, all.names = TRUE)) {
      if (bindingIsActive(name, frames_env) || bindingIsLocked(name, frames_env)) next
      value <- get(name, envir = frames_env)
      if (is.function(value)) {
        assign(name, compiled(value), envir = frames_env)
      } else if (is.list(value) && !is.object(value) && length(value) && all(vapply(value, is.function, NA))) {
        assign(name, lapply(value, compiled), envir = frames_env)
      }
    }
  }
  launcher <- Sys.getenv("VALVE_LAUNCHER")
  # Parsed and compiled once here; each fork evaluates it as source() would
  # have (the closures it makes are compiled already).
  launcher_code <- lapply(parse(launcher, keep.source = FALSE), compiler::compile)
  # Everything above aged into R's oldest generation before any fork: a
  # fork's collections of its young objects then leave the parent's alone
  # (and the pages they live on shared).
  for (i in 1:3) invisible(gc(full = TRUE))
  # R's byte-code JIT level: parallel's fork turns the JIT off in its child
  # (right for mclapply's short-lived children, not for a worker that lives
  # for hours). Each fork turns it back on at the parent's level: without it
  # the app's and plumber's functions ran uncompiled (a plumber request about
  # 1.5x as slow, an R loop several times slower than in a fresh R).
  jit_level <- compiler::enableJIT(-1L)
  enter_lib <- Sys.getenv("VALVE_ENTER_LIB")
  dll <- dyn.load(enter_lib)
  lifeline <- as.integer(Sys.getenv("VALVE_LIFELINE", NA))
  if (is.na(lifeline)) stop("VALVE_LIFELINE is not set")
  zygote_home <- Sys.getenv("HOME")
  parent_libs <- normalizePath(.libPaths(), mustWork = FALSE)
  # Where each package the parent loaded beyond R's own library came from
  # (name -> folder), found once here for every fork.
  r_own <- normalizePath(.Library, mustWork = FALSE)
  parent_loaded <- vapply(setdiff(loadedNamespaces(), "base"),
                          function(ns) normalizePath(getNamespaceInfo(ns, "path"), mustWork = FALSE), "")
  parent_loaded <- parent_loaded[dirname(parent_loaded) != r_own]
  cat(sprintf("valve-zygote-ready %d %.3f %s\n", Sys.getpid(), as.numeric(Sys.time() - started, units = "secs"),
              paste(loaded, collapse = ",")))
  flush(stdout())

  # R's start-up, as it would have gone for the app's user in the app's folder.
  split_paths <- function(v) {
    x <- strsplit(v, ":", fixed = TRUE)[[1]]
    x[nzchar(x)]
  }
  startup_libpaths <- function() {
    # An app with a library of its own: that, valve's runtime and R's own.
    own <- split_paths(Sys.getenv("VALVE_LIBRARY"))
    if (length(own)) return(unique(normalizePath(c(own[dir.exists(own)], .Library), mustWork = FALSE)))
    user <- Sys.getenv("R_LIBS_USER")
    if (startsWith(user, zygote_home)) {
      user <- paste0(Sys.getenv("HOME"), substring(user, nchar(zygote_home) + 1L))
      Sys.setenv(R_LIBS_USER = user)
    }
    libs <- c(split_paths(Sys.getenv("R_LIBS")), split_paths(user))
    libs <- libs[dir.exists(libs)]
    unique(normalizePath(c(libs, .Library.site, .Library), mustWork = FALSE))
  }
  # Whether a package the parent loaded would come from elsewhere, at
  # another version, with these library paths: then this fork is no app's worker.
  differs <- function(libs) {
    # The parent's own paths, in its order: every package is found where the
    # parent found it.
    if (identical(libs[dir.exists(libs)], parent_libs)) return(NULL)
    # (Those a fork unloaded are gone: nothing to compare.)
    for (ns in intersect(names(parent_loaded), loadedNamespaces())) {
      loaded_at <- parent_loaded[[ns]]
      first <- find.package(ns, lib.loc = libs, quiet = TRUE)
      # Not on its paths: an app with a library of its own did not name it
      # (unload_unnamed() takes it away), any other app may load it later.
      if (length(first) == 0L) next
      first <- normalizePath(first[1L], mustWork = FALSE)
      if (identical(first, loaded_at)) next
      version <- tryCatch(read.dcf(file.path(first, "DESCRIPTION"), "Version")[1L, 1L], error = function(e) NA)
      if (!identical(as.character(version), as.character(getNamespaceVersion(ns)))) {
        return(sprintf("its library has %s %s (%s); the warm parent loaded %s", ns, version, dirname(first),
                       getNamespaceVersion(ns)))
      }
    }
    NULL
  }
  # What the parent loaded that an app with a library of its own did not
  # name is unloaded in the fork (its users first), so the app sees only
  # what it asked for and still starts in milliseconds. NULL once all are
  # gone, else why not (then a fresh R).
  unload_unnamed <- function(libs) {
    if (!length(split_paths(Sys.getenv("VALVE_LIBRARY")))) return(NULL)
    unnamed <- Filter(function(ns) length(find.package(ns, lib.loc = libs, quiet = TRUE)) == 0L,
                      names(parent_loaded))
    for (round in seq_along(unnamed)) {
      left <- intersect(unnamed, loadedNamespaces())
      if (!length(left)) break
      for (ns in left) {
        if (!length(intersect(getNamespaceUsers(ns), loadedNamespaces()))) try(unloadNamespace(ns), silent = TRUE)
      }
    }
    left <- intersect(unnamed, loadedNamespaces())
    if (length(left)) {
      sprintf("its library does not hold %s, which the warm parent loaded and could not unload",
              paste(left, collapse = ", "))
    }
  }
  user_file <- function(var, name) {
    given <- Sys.getenv(var)
    if (nzchar(given)) return(if (file.exists(given)) given else NULL)
    if (file.exists(name)) return(name)
    home <- file.path(Sys.getenv("HOME"), name)
    if (file.exists(home)) home else NULL
  }

  become <- function(job) {
    # A test's hook (valve built with its test hooks): the first fork asked
    # for while the file exists dies at once, before it says anything.
    hook <- Sys.getenv("VALVE_HOOK_FORK_DIES")
    if (nzchar(hook) && file.exists(hook) && file.remove(hook)) tools::pskill(Sys.getpid(), 9L)
    # Until its FIFO is open it speaks on the parent's output, by worker id:
    # valve hears its pid, or why it could not enter the app's sandbox, at once.
    id <- as.character(job$id)
    report <- function(...) {
      # One string, so one write: the parent and its other forks write
      # to the same pipe, and pieces of lines interleaved there.
      cat(paste0("valve-fork ", id, " ", ..., "\n"))
      flush(stdout())
    }
    # Its environment: the app's variables, its frames token... from valve's
    # own file in the app's run folder (never through the parent), read and
    # removed while still root: the app's user cannot read it.
    # Opened as a handle (never through a link; valve's own file, one name)
    # and removed at once.
    opened <- .C("valve_open_env", as.character(job$env_file), as.integer(job$env_uid), fd = -1L, errno = 0L,
                 PACKAGE = dll[["name"]])
    if (opened$fd < 0L) {
      report("failed opening its environment ", job$env_file, ": errno ", opened$errno)
      parallel:::mcexit(7L)
    }
    given <- tryCatch(jsonlite::fromJSON(readLines(sprintf("/proc/self/fd/%d", opened$fd), warn = FALSE),
                                         simplifyVector = FALSE), error = function(e) {
      report("failed reading its environment ", job$env_file, ": ", conditionMessage(e))
      parallel:::mcexit(7L)
    })
    invisible(.C("valve_close", opened$fd, PACKAGE = dll[["name"]]))
    report("pid ", Sys.getpid())
    compiler::enableJIT(jit_level)
    steps <- as.character(unlist(job$steps))
    # An app's memory_limit bounds a fork as it would a fresh R: the data the
    # fork inherits beyond a bare R's (the packages the parent loaded for
    # every app) comes on top of it.
    data_step <- grep("^data [0-9]+$", steps)
    if (length(data_step) == 1L) {
      limit <- as.numeric(sub("^data ", "", steps[data_step]))
      steps[data_step] <- sprintf("data %.0f", limit + max(0, vm_data() - bare_data))
    }
    # The sandbox, then (its last step, as the app's user) stdout and stderr
    # to the FIFO.
    entered <- .C("valve_enter", steps, length(steps), failed = -1L, errno = 0L, PACKAGE = dll[["name"]])
    if (entered$failed >= 0L) {
      report("failed ", steps[entered$failed + 1L], ": errno ", entered$errno)
      parallel:::mcexit(7L)
    }
    # Opened as the app's user, write-only (valve holds it open for reading).
    # Probed first without waiting: with no reader (valve gave up on this
    # fork, or is gone) a plain open would block for ever, an orphan R.
    has_reader <- file.exists(job$fifo) && tryCatch({
      close(fifo(job$fifo, open = "w", blocking = FALSE))
      TRUE
    }, warning = function(w) FALSE, error = function(e) FALSE)
    if (!has_reader) {
      report("failed opening its output ", job$fifo, ": valve no longer reads it")
      parallel:::mcexit(7L)
    }
    out <- file(job$fifo, open = "w", raw = TRUE)
    writeLines(paste("valve-fork-pid", Sys.getpid()), out)
    flush(out)
    sink(out)
    sink(out, type = "message")
    say_exit <- function(status) {
      try({
        writeLines(paste("valve-fork-exit", as.integer(status)), out)
        flush(out)
      }, silent = TRUE)
    }
    # R's own exit sequence can deadlock in a fork: quit() and q() end it at
    # once, saying the code first (a fork's status goes to its parent, not valve).
    exit_now <- function(save = "default", status = 0, runLast = TRUE) {
      say_exit(status)
      parallel:::mcexit(as.integer(status))
    }
    base <- baseenv()
    for (name in c("quit", "q")) {
      unlockBinding(name, base)
      assign(name, exit_now, envir = base)
      lockBinding(name, base)
    }
    for (name in unlist(given$unset)) Sys.unsetenv(name)
    if (length(given$env)) do.call(Sys.setenv, lapply(given$env, as.character))
    # Its own temporary folder in its TMPDIR, R's own (what R's C code uses
    # too): the parent's is not in its view, or is the parent's.
    if (!.C("valve_tempdir", ok = FALSE, PACKAGE = dll[["name"]])$ok) {
      cat("valve-fork-failed: making its temporary folder in ", Sys.getenv("TMPDIR"), "\n", sep = "")
      exit_now(status = 7)
    }
    # A fresh individual before any of the app's own code runs (its .Rprofile
    # may draw): R seeds its generator from the time and pid on next use.
    if (exists(".Random.seed", envir = globalenv(), inherits = FALSE)) rm(".Random.seed", envir = globalenv())
    if ("shiny" %in% loadedNamespaces()) assign("ownSeed", NULL, envir = shiny:::.globals)
    # plumber is attached here for plumber's forks; a fresh R worker of any
    # other app has only its own package attached.
    if (!startsWith(Sys.getenv("VALVE_APP_KIND"), "plumber") && "package:plumber" %in% search()) {
      detach("package:plumber", character.only = TRUE)
    }
    renviron <- user_file("R_ENVIRON_USER", ".Renviron")
    if (!is.null(renviron)) readRenviron(renviron)
    # valve's own checks failing is no fault of the app: it gets a fresh R.
    fresh_r <- function(why) {
      cat("valve-fresh-r: ", why, "\n", sep = "")
      exit_now(status = 6)
    }
    libs <- tryCatch(startup_libpaths(), error = function(e) fresh_r(paste("its library paths:", conditionMessage(e))))
    why <- tryCatch(differs(libs), error = function(e) paste("comparing its library paths:", conditionMessage(e)))
    if (!is.null(why)) fresh_r(why)
    .libPaths(libs)
    why <- tryCatch(unload_unnamed(libs), error = function(e) paste("unloading what it did not name:", conditionMessage(e)))
    if (!is.null(why)) fresh_r(why)
    profile <- user_file("R_PROFILE_USER", ".Rprofile")
    if (!is.null(profile)) {
      before <- .libPaths()
      source(profile, local = globalenv(), echo = FALSE)
      if (!identical(before, .libPaths())) {
        why <- tryCatch(differs(.libPaths()), error = function(e) paste("comparing its library paths:", conditionMessage(e)))
        if (!is.null(why)) fresh_r(paste("its .Rprofile changes the library paths and", why))
      }
    }
    # A fork's parent is this R, not valve: it dies with valve by the lifeline
    # (a thread that waits on a pipe only valve holds open).
    started <- .C("valve_lifeline", lifeline, ok = FALSE, PACKAGE = dll[["name"]])
    if (!started$ok) {
      cat("valve-fork-failed: starting the lifeline thread\n")
      exit_now(status = 7)
    }
    # Now a plain worker of the app: the launcher loads and serves it.
    Sys.setenv(VALVE_MODE = "plain")
    worker <- new.env(parent = globalenv())
    for (expr in launcher_code) eval(expr, worker)
    quit(save = "no")
  }

  commands <- file("stdin", open = "r")
  repeat {
    line <- readLines(commands, n = 1)
    if (length(line) == 0) quit(save = "no", status = 0)
    job <- tryCatch(jsonlite::fromJSON(line, simplifyVector = FALSE), error = function(e) NULL)
    if (is.null(job) || is.null(job$fifo)) next
    child <- parallel:::mcfork(estranged = TRUE)
    if (inherits(child, "masterProcess")) {
      close(commands)
      become(job)
    }
    # Said at once, by the parent: a fork that dies before it can say
    # anything is noticed then, not at valve's start timeout.
    cat(paste0("valve-fork ", as.character(job$id), " pid ", child$pid, "\n"))
    flush(stdout())
  }
})
