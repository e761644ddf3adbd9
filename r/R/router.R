# A plumber router built in this session, sent to valve's workers: a copy is
# saved with saveRDS() into a private directory and valve starts with
# `-f that.rds`; every worker reads it with readRDS().
#
# Workers are other R processes, so the router must survive the trip:
# - the objects its handlers use from this session's global environment (or
#   from packages attached here but not in a worker) are copied along with it,
#   as `future` does for its globals;
# - what cannot cross (open connections, external pointers: a database
#   connection, a compiled model, anything held in C memory) is found before
#   saving and reported as an error naming it and what to do instead.

# Packages a worker has attached: R's defaults, and plumber (the launcher
# attaches it before reading the router).
worker_attached <- c(
  "base", "methods", "datasets", "utils", "grDevices", "graphics", "stats",
  "plumber"
)

is_router <- function(x) inherits(x, "Plumber")

# Saves `router` for valve's workers and returns the file's path, inside a new
# directory removed by valve_stop(): one only this user can read (0700) in
# this session's temporary folder, as valve's workers run as this user. As
# root, valve runs the router's workers as a user of its own, which must read
# it: the directory is then 0755 (the file 0644), in the system's temporary
# folder, since this session's own (0700) cannot be passed by another user.
save_router <- function(router, call = rlang::caller_env()) {
  if (!requireNamespace("plumber", quietly = TRUE)) {
    cli::cli_abort("Serving a plumber router needs the {.pkg plumber} package.", call = call)
  }
  # A deep copy (every environment but the global one, packages and
  # namespaces): what follows changes the copy, never the user's router.
  copy <- unserialize(serialize(router, NULL))
  captured <- capture_globals(copy)
  hook <- getOption("valve.on_worker_start")
  if (is.function(hook)) {
    add_worker_start_hook(copy, hook)
  }
  problems <- router_problems(copy, captured)
  if (length(problems) > 0) {
    shown <- utils::head(problems, 8)
    cli::cli_abort(
      c(
        "This plumber router cannot be sent to valve's workers: it holds things that live only in this R session.",
        rlang::set_names(shown, rep("x", length(shown))),
        if (length(problems) > length(shown)) c("x" = paste("...and", length(problems) - length(shown), "more.")),
        "i" = "valve's workers are other R processes: each gets a copy of the router, saved with {.fn saveRDS}, and an open connection or external pointer does not survive the copy.",
        "i" = "Create such things in each worker instead: in {.code options(valve.on_worker_start = function() ...)} set before {.fn valve_start}, or inside the handler."
      ),
      class = "valve_router_error",
      call = call
    )
  }
  if (length(captured) > 0) {
    cli::cli_inform(c(
      "i" = "Copied to valve's workers with the router: {.code {captured}}.",
      " " = "Each worker has its own copy: changes made in one are not seen by the others or by this session."
    ))
  }
  shared <- is_root()
  dir <- tempfile("valve-app-", tmpdir = if (shared) dirname(tempdir()) else tempdir())
  dir.create(dir, mode = if (shared) "0755" else "0700")
  Sys.chmod(dir, if (shared) "0755" else "0700", use_umask = FALSE)
  path <- file.path(dir, "router.rds")
  saveRDS(copy, path)
  Sys.chmod(path, if (shared) "0644" else "0600", use_umask = FALSE)
  path
}

# Whether this session runs as root: valve, started from it, then gives each
# app's workers a user of their own.
is_root <- function() {
  identical(unname(ps::ps_uids(ps::ps_handle())[["effective"]]), 0L)
}

# Every function the router runs for requests: endpoints and filters, of the
# router and of the routers mounted on it.
router_steps <- function(router, prefix = "") {
  steps <- list()
  for (group in router$endpoints) {
    for (ep in group) {
      label <- paste0(paste(ep$verbs, collapse = "/"), " ", prefix, ep$path)
      steps[[length(steps) + 1]] <- list(step = ep, label = paste("the handler of", label))
    }
  }
  for (f in router$filters) {
    if (inherits(f, "PlumberFilter") && !is.null(f$name) && !startsWith(f$name, "__")) {
      steps[[length(steps) + 1]] <- list(step = f, label = paste0("the filter `", f$name, "`"))
    }
  }
  mounts <- router$mounts
  for (i in seq_along(mounts)) {
    if (is_router(mounts[[i]])) {
      at <- sub("/$", "", names(mounts)[[i]])
      steps <- c(steps, router_steps(mounts[[i]], paste0(prefix, at)))
    }
  }
  steps
}

step_func <- function(step) step$.__enclos_env__$private$func

set_step_func <- function(step, f) {
  private <- step$.__enclos_env__$private
  if (identical(private$expr, private$func)) private$expr <- f
  private$func <- f
}

# An environment saveRDS() writes as a reference, not a copy: the worker has
# its own global environment, base, packages and namespaces.
is_special_env <- function(env) {
  identical(env, globalenv()) || identical(env, baseenv()) ||
    identical(env, emptyenv()) || isNamespace(env) ||
    startsWith(environmentName(env), "package:")
}

# Where `name` is found from `env`: the environment holding it, or NULL.
where <- function(name, env) {
  while (!identical(env, emptyenv())) {
    if (exists(name, envir = env, inherits = FALSE)) return(env)
    env <- parent.env(env)
  }
  NULL
}

# Needs copying: found in the global environment, or in a package attached
# here that a worker does not attach.
needs_capture <- function(env) {
  if (identical(env, globalenv())) return(TRUE)
  name <- environmentName(env)
  startsWith(name, "package:") && !sub("^package:", "", name) %in% worker_attached
}

# Copies the globals of every handler into one environment that stands, in
# the router copy, between the handlers and the global environment. Helper
# functions defined in the global environment are re-homed there too, and
# their own globals followed. Returns the names copied.
capture_globals <- function(router) {
  captured <- new.env(parent = globalenv())
  todo <- lapply(router_steps(router), function(s) step_func(s$step))
  done <- character()
  rehome <- function(f) {
    env <- environment(f)
    if (identical(env, globalenv())) {
      environment(f) <- captured
      return(f)
    }
    # A closure made inside a function: re-parent the top of its own chain.
    top <- env
    while (!is_special_env(parent.env(top))) top <- parent.env(top)
    if (!is_special_env(top) && identical(parent.env(top), globalenv())) {
      parent.env(top) <- captured
    }
    f
  }
  for (s in router_steps(router)) {
    f <- step_func(s$step)
    if (is.function(f) && !is.primitive(f)) set_step_func(s$step, rehome(f))
  }
  while (length(todo) > 0) {
    f <- todo[[1]]
    todo <- todo[-1]
    if (!is.function(f) || is.primitive(f)) next
    env <- environment(f)
    if (is.null(env)) next
    names <- codetools::findGlobals(f, merge = TRUE)
    for (name in setdiff(names, done)) {
      home <- where(name, env)
      if (is.null(home) || !needs_capture(home)) next
      value <- get(name, envir = home, inherits = FALSE)
      if (is.function(value) && !is.primitive(value) && identical(environment(value), globalenv())) {
        environment(value) <- captured
        todo[[length(todo) + 1]] <- value
      }
      assign(name, value, envir = captured)
      done <- c(done, name)
    }
  }
  sort(done)
}

# The session's valve.on_worker_start hook, run once in each worker (before
# its first request) since a worker serving a saved router sources no file
# that could set the option there.
add_worker_start_hook <- function(router, hook) {
  state <- new.env(parent = emptyenv())
  state$done <- FALSE
  once <- function(...) {
    if (!state$done) {
      state$done <- TRUE
      hook()
    }
    invisible()
  }
  router$registerHook("preroute", once)
  invisible(router)
}

# What in the router cannot cross to another process, as readable lines:
# "the handler of GET /db → `con` → @ptr: an external pointer (...)".
router_problems <- function(router, captured = character()) {
  problems <- character()
  seen <- new.env(parent = emptyenv())
  queue <- list()
  push <- function(x, where) queue[[length(queue) + 1]] <<- list(x = x, where = where)
  add <- function(where, what) problems <<- c(problems, paste0(where, ": ", what))

  # Handlers first, so a problem is named after the endpoint that uses it.
  for (s in router_steps(router)) push(step_func(s$step), s$label)
  push(router, "the router")

  head <- 0L
  while (head < length(queue) && length(problems) < 20) {
    head <- head + 1L
    item <- queue[[head]]
    queue[head] <- list(NULL)
    x <- item$x
    where <- item$where
    if (inherits(x, "connection")) {
      desc <- tryCatch(summary(x)$description, error = function(e) "?")
      add(where, paste0("a connection (", desc, "); connections are this session's own"))
      next
    }
    type <- typeof(x)
    if (type == "externalptr") {
      add(where, "an external pointer (memory of this R session, such as a database connection or a model held in C code)")
      next
    }
    if (type == "weakref") {
      add(where, "a weak reference (memory of this R session)")
      next
    }
    if (type == "environment") {
      if (is_special_env(x)) next
      key <- rlang::obj_address(x)
      if (!is.null(seen[[key]])) next
      seen[[key]] <- TRUE
      names <- ls(x, all.names = TRUE, sorted = FALSE)
      lazy <- if (length(names)) rlang::env_binding_are_lazy(x, names) else logical()
      for (i in seq_along(names)) {
        nm <- names[[i]]
        if (lazy[[i]] || bindingIsActive(nm, x)) next
        label <- if (identical(names[[i]], ".__enclos_env__")) where else paste0(where, " \u2192 `", nm, "`")
        if (nm %in% captured && identical(parent.env(x), globalenv())) {
          label <- paste0(where, " \u2192 `", nm, "` (from your global environment)")
        }
        # A missing argument's binding holds nothing (and get() errors on it).
        value <- tryCatch(get(nm, envir = x, inherits = FALSE), error = function(e) NULL)
        if (!is.null(value) && !is.symbol(value)) push(value, label)
      }
      push(parent.env(x), where)
    } else if (type == "closure") {
      push(environment(x), where)
      push(body(x), where)
      push(formals(x), where)
    } else if (type %in% c("list", "expression", "pairlist", "language")) {
      xs <- as.list(x)
      nms <- names(xs)
      for (i in seq_along(xs)) {
        # Symbols (including a formal argument's empty default) and NULL hold nothing.
        if (is.symbol(xs[[i]]) || is.null(xs[[i]])) next
        label <- if (!is.null(nms) && nzchar(nms[[i]]) && type == "list") paste0(where, "$", nms[[i]]) else where
        push(xs[[i]], label)
      }
    } else if (type == "S4") {
      for (slot in methods::slotNames(x)) {
        push(methods::slot(x, slot), paste0(where, "@", slot))
      }
      next
    }
    # Attributes can hold anything (an S4 slot, a pointer on a model object).
    attrs <- attributes(x)
    attrs <- attrs[setdiff(names(attrs), c("names", "dim", "dimnames", "class", "row.names", "srcref", "levels", "tsp"))]
    for (a in names(attrs)) push(attrs[[a]], where)
  }
  unique(problems)
}
