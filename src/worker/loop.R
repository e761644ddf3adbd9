# valve's frame loop: the R side of valve's own worker protocol (bench/r-loop/PROTOCOL.md).
#
# A plumber worker no longer runs an HTTP server. valve parses HTTP itself and
# hands the worker requests as frames on one loopback TCP connection that the
# *worker* opens to valve (the worker listens on nothing). For each request
# frame this loop builds the Rook environment httpuv 1.6.9 would have built,
# calls the app as httpuv's AppWrapper does (onHeaders, then call), and writes
# the answer back as one frame in one write, carrying the request's id.
#
# Async endpoints: when the app's answer is a pending promise, the loop says
# WAITING for that request (valve may then send another) and goes back to
# reading frames while running `later`, as httpuv does between requests; the
# answer goes out when the promise settles, in whatever order promises settle.
# R still computes one thing at a time: a request is read only while no R code
# runs. PROTOCOL.md, next to this file, is the
# byte-level specification; the comments here say why, not what bytes.
#
# For the launcher:
#
#   source("loop.R")     # defines the valve_* functions, runs nothing
#   valve_serve_frames(app, port, token, worker_id)    # warms up, connects, serves
#
# With --preload: valve_warm_up(app) once in the parent, then in each fork
#   valve_serve_frames(app, port, token, worker_id, warm_up = FALSE)
#
# valve_serve_frames() returns when valve closes the connection (EOF); the
# launcher then quits. It uses base R, `later` (a plumber dependency), `promises`
# only when an endpoint returns a promise, and httpuv's own Rook stream classes,
# so `rook.input` and `rook.errors` are the very objects httpuv would have given
# the API.
#
# Request-head encodings: the protocol has one, "rdsenv" (valve writes the
# request environment in R's serialization format; one unserialize() here).
# The others bench/r-loop/measure compares it with ("text", "lp", "rds") live
# in bench/r-loop/decoders.R, which adds them to .valve_decoders.

# ---------------------------------------------------------------------------
# Constants

.valve_frame <- local({
  type <- function(ch) as.integer(charToRaw(ch))
  list(
    # valve -> worker
    REQUEST = type("Q"), PING = type("P"),
    # worker -> valve
    HELLO = type("H"), ANSWER = type("A"), PONG = type("O"), WAITING = type("W"),
    # flags of a REQUEST frame
    REQ_BODY_FILE = 1L,
    # flags of an ANSWER frame
    ANS_BODY_FILE = 1L, ANS_FILE_OWNED = 2L, ANS_NO_BODY = 4L, ANS_LOOP_ERROR = 8L,
    PROTOCOL = "valve-frames/2",
    # socketConnection's timeout bounds every blocking read and write. Writing a
    # large answer may wait on a slow client behind valve, so it is long (30
    # days, the most POSIX promises); valve's --request-timeout ends hung workers.
    SOCKET_TIMEOUT = 30 * 24 * 3600,
    # Longest sleep between two looks at `later`'s queue while idle: callbacks
    # that other threads schedule run at most this late.
    IDLE_TICK = 0.1
  )
})

# The first int of an ANSWER frame's header: type 'A', flags, the request's id (u16).
.valve_answer_word <- function(flags, id = 0L) .valve_frame$ANSWER * 16777216L + flags * 65536L + id

# Sets the request id (the first word's low 16 bits) of a frame built without one.
.valve_with_id <- function(frame, id) {
  frame[3L] <- as.raw(id %/% 256L)
  frame[4L] <- as.raw(id %% 256L)
  frame
}

# WAITING: request `id` waits on a promise; the worker takes another meanwhile.
.valve_waiting_frame <- function(id) .valve_with_id(.valve_head_frame(.valve_frame$WAITING, raw(0)), id)

# ---------------------------------------------------------------------------
# Binary I/O

# The loop's reads, writes and request decoding. readBin(), writeBin() and
# unserialize() check their arguments in R on every call (~3 us each, six
# calls a request: 1-2 % of a fast call, measured in instructions); the loop
# always passes the same kinds of arguments, so it calls R's internal
# functions underneath them directly. Their signatures have not changed since
# R 2.x; they are checked once here, and if a future R changed them the
# exported functions serve instead (same results, a little slower).
#   raw(con, n)    up to n bytes from a connection (or raw vector)
#   ints(x, n)     n big-endian int32 from raw x
#   be(x)          integers -> big-endian bytes
#   send(x, con)   raw x to the connection
#   object(x)      unserialize(x)
.valve_io_internal <- local({
  swap <- .Platform$endian != "big"
  list(
    raw = function(con, n) .Internal(readBin(con, "raw", n, NA_integer_, TRUE, FALSE)),
    ints = function(x, n) .Internal(readBin(x, "integer", n, NA_integer_, TRUE, swap)),
    be = function(x) .Internal(writeBin(x, raw(), NA_integer_, swap, FALSE)),
    send = function(x, con) .Internal(writeBin(x, con, NA_integer_, FALSE, FALSE)),
    object = function(x) .Internal(unserialize(x, NULL))
  )
})

.valve_io_exported <- list(
  raw = function(con, n) readBin(con, raw(), n),
  ints = function(x, n) readBin(x, "integer", n, endian = "big"),
  be = function(x) writeBin(x, raw(), endian = "big"),
  send = function(x, con) writeBin(x, con),
  object = function(x) unserialize(x)
)

# Whether an I/O set does what the loop needs, on known bytes.
.valve_io_works <- function(io) {
  bytes <- as.raw(c(0, 0, 1, 2, 255, 255, 255, 254, 9))
  sink <- rawConnection(raw(0), "wb")
  ok <- tryCatch({
    io$send(bytes[1:3], sink)
    identical(io$raw(bytes, 2L), bytes[1:2]) && identical(io$ints(bytes, 2L), c(258L, -2L)) &&
      identical(io$be(c(258L, -2L)), bytes[1:8]) && identical(rawConnectionValue(sink), bytes[1:3]) &&
      identical(io$object(serialize(list(a = 1L), NULL, xdr = TRUE, version = 2L)), list(a = 1L))
  }, error = function(e) FALSE)
  close(sink)
  isTRUE(ok)
}

.valve_io <- if (.valve_io_works(.valve_io_internal)) .valve_io_internal else .valve_io_exported

# A frame of `type` with a head and no body, no flags (HELLO, PONG).
.valve_head_frame <- function(type, head) {
  c(as.raw(c(type, 0L, 0L, 0L)), .valve_io$be(c(length(head), 0L, 0L)), head)
}

# ---------------------------------------------------------------------------
# Request: frame -> Rook environment

# The fixed fields every head starts with, in this order (PROTOCOL.md).
.valve_fixed_keys <- c("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "SERVER_NAME", "SERVER_PORT",
                       "REMOTE_ADDR", "REMOTE_PORT", "rook.url_scheme", "SCRIPT_NAME", "rook.version")

# "rdsenv" (the protocol): R serialization (XDR, version 2) of the request
# environment itself, enclosed by the empty environment, every variable but
# the ones the loop adds (rook.input, rook.errors, httpuv.version,
# CONTENT_TYPE, CONTENT_LENGTH) already in it. Measured cheapest in R (one C
# call builds the whole environment).
.valve_decode_rdsenv <- function(head) {
  req <- .valve_io$object(head)
  if (!is.environment(req)) stop("malformed request head")
  req
}

.valve_decoders <- list(rdsenv = .valve_decode_rdsenv)

# ---------------------------------------------------------------------------
# Answer: the app's list -> one ANSWER frame (raw)

# Follows httpuv 1.6.9: rookCall's prepare_response() (header values pasted;
# the c(file = ) / list(file = , owned = ) body forms) and listToResponse()
# (character body -> charToRaw() of its first element, raw body as is, other
# atomic bodies coerced to raw, NULL body -> no body at all).
.valve_encode_answer <- function(resp, flags = 0L, id = 0L) {
  if (is.null(resp) || length(resp) == 0L) resp <- .valve_generic_error()
  status <- as.integer(resp$status)
  if (length(status) != 1L || is.na(status) || status < 0L) stop("the answer's status is not one integer >= 0")
  h <- resp$headers
  n <- length(h)
  if (n) {
    hn <- names(h)
    if (is.null(hn) || anyNA(hn)) stop("the answer's headers are not named")
    hv <- unlist(h, use.names = FALSE)
    if (!is.character(hv) || length(hv) != n) {
      hv <- vapply(h, function(v) {
        v <- paste(v)
        if (length(v) != 1L) stop("a header value is not one string")
        v
      }, "", USE.NAMES = FALSE)
    }
    strs <- if (n == 1L) c(hn, hv) else c(rbind(hn, hv))
    lens <- nchar(strs, type = "bytes")
    blob <- charToRaw(paste(strs, collapse = ""))
    # paste() re-encodes when strings carry different declared encodings;
    # httpuv sends each string's bytes as stored, so fall back to that.
    if (length(blob) != sum(lens)) blob <- unlist(lapply(strs, charToRaw), use.names = FALSE)
  } else {
    lens <- integer(0)
    blob <- raw(0)
  }
  body <- resp$body
  if (!is.null(nb <- names(body)) && "file" %in% nb) {
    owned <- "owned" %in% nb && isTRUE(as.logical(body[["owned"]]))
    path <- normalizePath(as.character(body[["file"]])[1L], mustWork = FALSE)
    if (!file.exists(path)) stop("the answer names a file that does not exist: ", path)
    flags <- bitwOr(flags, bitwOr(.valve_frame$ANS_BODY_FILE, if (owned) .valve_frame$ANS_FILE_OWNED else 0L))
    body <- charToRaw(enc2utf8(path))
  } else if (is.raw(body)) {
    # as is
  } else if (is.character(body)) {
    body <- charToRaw(body)
  } else if (is.null(body)) {
    flags <- bitwOr(flags, .valve_frame$ANS_NO_BODY)
    body <- raw(0)
  } else {
    body <- as.raw(body)
  }
  bl <- length(body)
  # The frame header, the status, the count and the lengths: one conversion.
  hi <- 0L
  if (bl >= 2147483648) {  # 2 GiB and more: u64 body length (never in practice)
    hi <- as.integer(bl %/% 4294967296)
    lo <- bl - hi * 4294967296
    bl <- as.integer(if (lo >= 2147483648) lo - 4294967296 else lo)
  }
  c(.valve_io$be(c(.valve_answer_word(flags, id), 8L + 8L * n + length(blob), hi, bl, status, n, lens)), blob, body)
}

# httpuv's answer to an R error in the app (rookCall's on_error()).
.valve_app_error <- function(e) {
  list(status = 500L, headers = list(`Content-Type` = "text/plain; charset=UTF-8"),
       body = charToRaw(enc2utf8(paste("ERROR:", conditionMessage(e), collapse = "\n"))))
}

# httpuv's answer when the app's list cannot be turned into a response (C++ errorResponse()).
.valve_generic_error <- function() {
  list(status = 500L, headers = list(`Content-Type` = "text/plain; charset=UTF-8"),
       body = "An exception occurred.")
}

# The answer of last resort, prepared once: what is sent if even building an
# error answer fails.
.valve_last_resort <- .valve_encode_answer(.valve_generic_error(), .valve_frame$ANS_LOOP_ERROR)

# ---------------------------------------------------------------------------
# One request

# Waits for a promise, running `later` (so promises, futures and timers) until
# it settles (the warm-up's requests, which nobody else waits behind).
.valve_await <- function(p) {
  done <- FALSE
  value <- NULL
  promises::then(p,
    onFulfilled = function(v) { value <<- v; done <<- TRUE },
    onRejected = function(e) { value <<- .valve_rejected(e); done <<- TRUE })
  while (!done) later::run_now(timeoutSecs = 1)
  value
}

# httpuv's answer to a rejected promise (a rejection with a value that is not
# a condition included: its printed form is the message).
.valve_rejected <- function(e) {
  if (!inherits(e, "condition")) e <- simpleError(paste(format(e), collapse = "\n"))
  .valve_app_error(e)
}

# Request `id` returned a pending promise: its answer goes out when it
# settles; its body's connection closes then. Nothing escapes the callbacks:
# an answer that cannot be encoded is httpuv's 500, and a write that fails
# (valve gone) ends the worker at its next read.
.valve_park <- function(p, con, id, input) {
  force(id)  # the caller's `id` and `input` change with the next request
  force(input)
  finish <- function(resp) {
    frame <- tryCatch(.valve_encode_answer(resp, 0L, id),
                      error = function(e) .valve_with_id(.valve_failed(e, 3L), id))
    if (!is.null(input)) tryCatch(close(input), error = function(e) NULL)
    tryCatch(.valve_io$send(frame, con),
             error = function(e) message("valve: could not send an answer: ", conditionMessage(e)))
    invisible()
  }
  promises::then(p, onFulfilled = finish, onRejected = function(e) finish(.valve_rejected(e)))
  invisible()
}

# The answer to a request that failed at `stage`:
#   1 building the request: the loop's fault (500 "ERROR: ...", flagged)
#   2 in the app (onHeaders, call, a rejected promise): httpuv's 500 "ERROR: ..."
#   3 turning the app's list into a frame: httpuv's 500 "An exception occurred."
.valve_failed <- function(e, stage) {
  tryCatch({
    if (stage == 2L) return(.valve_encode_answer(.valve_app_error(e)))
    message("valve: ", if (stage == 1L) "could not build the request: " else "could not send the app's answer: ",
            conditionMessage(e))
    if (stage == 1L) .valve_encode_answer(.valve_app_error(e), .valve_frame$ANS_LOOP_ERROR)
    else .valve_encode_answer(.valve_generic_error(), .valve_frame$ANS_LOOP_ERROR)
  }, error = function(e2) .valve_last_resort)
}

# Where a request stands, for whoever handles an error it raises: `active`
# (a request is being served), `stage` (see .valve_failed) and `input` (the
# body's connection, to close).
.valve_state <- function() {
  st <- new.env(parent = emptyenv())
  st$active <- FALSE
  st$stage <- 1L
  st$input <- NULL
  st$id <- 0L
  st
}

.valve_close_input <- function(st) {
  if (!is.null(st$input)) {
    tryCatch(close(st$input), error = function(e) NULL)  # the app may have closed it
    st$input <- NULL
  }
}

# Runs one request frame through the app; returns the app's answer: its list,
# or a promise. It has no tryCatch() of its own (one costs ~40k instructions,
# a seventh of the loop's whole cost): an error unwinds to the caller's
# handler, which answers with .valve_failed(e, st$stage).
.valve_request <- function(app, ctx, head, body, body_is_file, st) {
  st$stage <- 1L
  req <- ctx$decode(head)
  if (body_is_file) {
    path <- rawToChar(body)
    st$input <- file(path, open = "rb")
    req$rook.input <- ctx$InputStream$new(st$input, file.size(path))
  } else if (length(body)) {
    st$input <- rawConnection(body, open = "rb")
    req$rook.input <- ctx$InputStream$new(st$input, length(body))
  } else {
    req$rook.input <- ctx$null_input
  }
  # What httpuv's rookCall() adds before calling the app.
  req$rook.errors <- ctx$errors
  req$httpuv.version <- ctx$version
  if (!is.null(v <- req$HTTP_CONTENT_TYPE)) req$CONTENT_TYPE <- v
  if (!is.null(v <- req$HTTP_CONTENT_LENGTH)) req$CONTENT_LENGTH <- v
  st$stage <- 2L
  # httpuv's AppWrapper: onHeaders first (plumber answers 413 there), then call.
  resp <- if (ctx$has_on_headers) app$onHeaders(req)
  if (is.null(resp) || length(resp) == 0L) resp <- app$call(req)
  st$stage <- 3L
  resp
}

# One request, errors included: never throws (the warm-up and tests use it;
# the serving loop handles errors once for all requests instead).
.valve_handle <- function(app, ctx, head, body, body_is_file) {
  st <- .valve_state()
  answer <- tryCatch({
    resp <- .valve_request(app, ctx, head, body, body_is_file, st)
    if (inherits(resp, "promise")) resp <- .valve_await(resp)
    .valve_encode_answer(resp)
  }, error = function(e) .valve_failed(e, st$stage))
  .valve_close_input(st)
  answer
}

# What the loop hands every request, found once.
.valve_context <- function(app, encoding = "rdsenv") {
  decode <- .valve_decoders[[encoding]]
  if (is.null(decode)) stop("unknown request-head encoding: ", encoding)
  ns <- asNamespace("httpuv")
  list(decode = decode, InputStream = get("InputStream", ns), null_input = get("nullInputStream", ns),
       errors = get("stdErrStream", ns), version = utils::packageVersion("httpuv"),
       has_on_headers = isTRUE(tryCatch(is.function(app$onHeaders), error = function(e) FALSE)))
}

# ---------------------------------------------------------------------------
# `later` between requests

# later's exported next_op_secs() and run_now() look the current loop up on
# every call (60k instructions, twice a request). Between requests the current
# loop is always the global one, so call later's registered routines with its
# id directly; fall back to the exported functions if a later release renames
# them.
.valve_later <- function() {
  id <- tryCatch(later::global_loop()$id, error = function(e) NULL)
  nxt <- tryCatch(getNativeSymbolInfo("_later_nextOpSecs", "later"), error = function(e) NULL)
  run <- tryCatch(getNativeSymbolInfo("_later_execCallbacks", "later"), error = function(e) NULL)
  ok <- is.numeric(id) && !is.null(nxt) && !is.null(run) &&
    isTRUE(tryCatch(is.numeric(.Call(nxt, id)), error = function(e) FALSE))
  if (!ok) return(list(next_op = function() later::next_op_secs(later::global_loop()),
                       run = function() later::run_now(0, loop = later::global_loop())))
  list(next_op = function() .Call(nxt, id), run = function() .Call(run, 0, TRUE, id))
}

# Blocks until valve has sent something (or closed the connection), running
# `later`'s callbacks on time meanwhile, as httpuv::service() does between
# requests. An error in a callback is reported and does not end the worker.
.valve_wait_readable <- function(con, lt) {
  tick <- .valve_frame$IDLE_TICK
  repeat {
    w <- lt$next_op()
    if (w <= 0) {
      tryCatch(lt$run(), error = function(e) message("valve: error in a later() callback: ", conditionMessage(e)))
      next
    }
    if (socketSelect(list(con), FALSE, if (w < tick) w else tick)) return(invisible())
  }
}

# ---------------------------------------------------------------------------
# The connection

# Two big-endian int32 halves -> the u64 they hold (exact below 2^53).
.valve_u64 <- function(hi, lo) {
  (hi + (hi < 0L) * 4294967296) * 4294967296 + lo + (lo < 0L) * 4294967296
}

# Reads exactly n bytes. The connection is non-blocking, so a read is one
# recv() (R's blocking sockets select() before every read): bytes of the
# frame that have not arrived yet are waited for in .valve_read_rest().
.valve_read <- function(con, n) {
  if (n < 0L) n <- n + 4294967296  # a u32 length past 2^31 arrives negative
  if (n == 0) return(raw(0))
  x <- .valve_io$raw(con, n)
  if (length(x) == n) return(x)
  .valve_read_rest(con, n, x)
}

# The rest of n bytes after a short read `x`. A read that stopped for want of
# data leaves the connection "incomplete"; one that stopped at EOF does not:
# valve went away mid-frame.
.valve_read_rest <- function(con, n, x) {
  parts <- list(x)
  got <- length(x)
  repeat {
    if (!isIncomplete(con)) stop("connection to valve closed mid-frame")
    socketSelect(list(con), FALSE, .valve_frame$SOCKET_TIMEOUT)
    x <- .valve_io$raw(con, n - got)
    got <- got + length(x)
    parts[[length(parts) + 1L]] <- x
    if (got == n) return(unlist(parts, use.names = FALSE))
  }
}

# The worker connects to valve (it never listens): binary, TCP_NODELAY so that
# an answer's segments never wait for valve's ACK, and non-blocking for reads
# (see .valve_read; R waits for a non-blocking socket to take each write, so
# writes still block, bounded by the timeout).
.valve_connect <- function(host, port) {
  socketConnection(host = host, port = port, server = FALSE, blocking = FALSE, open = "r+b",
                   timeout = .valve_frame$SOCKET_TIMEOUT, options = "no-delay")
}

.valve_hello <- function(con, token, worker_id) {
  fields <- c(.valve_frame$PROTOCOL, as.character(worker_id), as.character(Sys.getpid()), token)
  if (any(grepl("\n", fields, fixed = TRUE))) stop("worker id and token must not hold a newline")
  head <- charToRaw(paste0(fields, "\n", collapse = ""))
  .valve_io$send(.valve_head_frame(.valve_frame$HELLO, head), con)
}

# ---------------------------------------------------------------------------
# Warm-up

#' Runs synthetic requests through the whole path (decode, app, encode; the
#' answers are thrown away) so that R has loaded and compiled what a real
#' request touches before the worker says hello (ready). Without it a fresh
#' worker's first two requests take ~100 ms more than the rest.
#'
#' 1. If plumber is loaded: a scratch router (no user code) with a GET endpoint
#'    taking a query argument and a POST endpoint taking a JSON body, so
#'    plumber's endpoint machinery, query and body parsers, JSON serializer and
#'    httpuv's InputStream are loaded and compiled.
#' 2. The app itself, on a path no API defines: plumber answers 404 through the
#'    app's own router, filters, hooks and error handler (so a filter that logs
#'    every request logs these; their path is /__valve__/warm-up). The API's
#'    endpoints themselves never run.
#'
#' Call it once before forking (--preload) so every fork starts warm.
#' Returns the seconds it took.
valve_warm_up <- function(app, rounds = 3L) {
  t0 <- proc.time()[["elapsed"]]
  # Request heads as valve writes them (PROTOCOL.md): the environment, serialized.
  frame_head <- function(method, path, query, extra = character(0)) {
    hn <- c("host", "user-agent", extra)
    hv <- c("127.0.0.1", "valve-warm-up", if (length(extra)) c("application/json", "13"))
    vals <- c(method, path, query, "127.0.0.1", "0", "127.0.0.1", "0", "http", "", "1.1-0", hv)
    names(vals) <- c(.valve_fixed_keys,
                     paste0("HTTP_", chartr("abcdefghijklmnopqrstuvwxyz-", "ABCDEFGHIJKLMNOPQRSTUVWXYZ_", hn)))
    env <- list2env(as.list(vals), envir = new.env(hash = FALSE, parent = emptyenv()))
    names(hv) <- hn
    env$HEADERS <- hv
    serialize(env, NULL, xdr = TRUE, version = 2L)
  }
  get_head <- frame_head("GET", "/__valve__/warm-up", "?msg=warm-up")
  post_head <- frame_head("POST", "/__valve__/warm-up", "", c("content-type", "content-length"))
  post_body <- charToRaw('{"a":1,"b":2}')
  # What serves any app (plumber's request path, the loop's own functions
  # compiled) is warmed once per environment: a fork of valve's warm parent
  # shares the parent's, and warms only its own app's router below.
  env <- environment(valve_warm_up)
  generic <- !isTRUE(env$.valve_warmed)
  if (generic && "plumber" %in% loadedNamespaces()) {
    scratch <- tryCatch({
      pr <- plumber::pr()
      pr$handle("GET", "/__valve__/warm-up", function(msg = "") list(msg = msg))
      pr$handle("POST", "/__valve__/warm-up", function(a, b) as.numeric(a) + as.numeric(b))
      pr
    }, error = function(e) NULL)
    if (!is.null(scratch)) {
      ctx <- .valve_context(scratch)
      for (i in seq_len(rounds)) {
        .valve_handle(scratch, ctx, get_head, raw(0), FALSE)
        .valve_handle(scratch, ctx, post_head, post_body, FALSE)
      }
    }
  }
  ctx <- .valve_context(app)
  for (i in seq_len(rounds)) .valve_handle(app, ctx, get_head, raw(0), FALSE)
  # The answer paths the requests above do not take.
  .valve_encode_answer(list(status = 200L, headers = list(a = "b", c = 1), body = raw(1)))
  .valve_encode_answer(list(status = 204L, headers = NULL, body = NULL))
  .valve_failed(simpleError("warm-up"), 2L)
  lt <- .valve_later()
  lt$next_op()
  lt$run()
  # The loop's I/O helpers cannot run before valve is connected; without this
  # R's JIT compiles them on the first frame (15-30 ms).
  if (generic) {
    for (f in c(".valve_serve", ".valve_recover", ".valve_park", ".valve_waiting_frame", ".valve_with_id", ".valve_wait_readable", ".valve_read", ".valve_read_rest", ".valve_u64",
                ".valve_hello", ".valve_connect")) {
      assign(f, compiler::cmpfun(get(f, envir = env)), envir = env)
    }
    assign(".valve_io", lapply(get(".valve_io", envir = env), compiler::cmpfun), envir = env)
    env$.valve_warmed <- TRUE
  }
  proc.time()[["elapsed"]] - t0
}

# ---------------------------------------------------------------------------
# The loop

#' Serves `app` (a plumber router, or anything with httpuv's `call(req)`) on
#' frames from valve until valve closes the connection.
#'
#' @param app the router (what plumber's run() hands httpuv::runServer()).
#' @param port,host valve's loopback listener.
#' @param token the secret valve put in the worker's environment.
#' @param worker_id valve's id for this worker.
#' @param warm_up run valve_warm_up() first (FALSE in a fork of a warmed parent).
#' @param encoding request-head encoding: "rdsenv" (the protocol); others for bench only.
valve_serve_frames <- function(app, port, token, worker_id, host = "127.0.0.1", warm_up = TRUE,
                               encoding = "rdsenv") {
  ctx <- .valve_context(app, encoding)
  if (isTRUE(warm_up)) valve_warm_up(app)
  lt <- .valve_later()
  con <- .valve_connect(host, port)
  on.exit(close(con))
  .valve_hello(con, token, worker_id)
  st <- .valve_state()
  # One error handler for all requests: an error inside a request unwinds
  # here, is answered (500), and serving resumes; an error outside one (a
  # broken frame, valve gone mid-frame) ends the worker.
  while (!tryCatch(.valve_serve(con, app, ctx, lt, st), error = function(e) .valve_recover(e, con, st))) NULL
  invisible(TRUE)
}

# Serves frames until EOF (returns TRUE). Errors propagate to valve_serve_frames().
.valve_serve <- function(con, app, ctx, lt, st) {
  F <- .valve_frame
  io <- .valve_io
  repeat {
    .valve_wait_readable(con, lt)
    # The 16-byte header as 4 big-endian ints: type and flags in the first.
    hdr <- io$raw(con, 16L)
    if (length(hdr) != 16L) {
      if (length(hdr) == 0L) {
        if (!isIncomplete(con)) return(TRUE)  # EOF: valve closed the connection; the worker ends
        next  # readable, yet nothing to read: wait again
      }
      hdr <- .valve_read_rest(con, 16L, hdr)
    }
    h <- io$ints(hdr, 4L)
    type <- h[1L] %/% 16777216L
    head <- .valve_read(con, h[2L])
    body <- .valve_read(con, if (h[3L] == 0L) h[4L] else .valve_u64(h[3L], h[4L]))
    if (type == F$REQUEST) {
      id <- h[1L] %% 65536L
      st$active <- TRUE
      st$id <- id
      resp <- .valve_request(app, ctx, head, body, (h[1L] %/% 65536L) %% 2L == 1L, st)
      if (inherits(resp, "promise")) {
        # Pending: valve may send the next request; the answer follows when it settles.
        .valve_park(resp, con, id, st$input)
        st$input <- NULL
        st$active <- FALSE
        io$send(.valve_waiting_frame(id), con)
      } else {
        answer <- .valve_encode_answer(resp, 0L, id)
        .valve_close_input(st)
        st$active <- FALSE
        io$send(answer, con)  # one write: the whole answer frame leaves at once
      }
    } else if (type == F$PING) {
      io$send(.valve_head_frame(F$PONG, c(head, io$be(Sys.getpid()))), con)
    } else {
      stop("unknown frame type ", type, " from valve")
    }
  }
}

# The handler for an error that escaped .valve_serve(): answer the request it
# came from and go on (FALSE), or end the worker if it was not in a request.
.valve_recover <- function(e, con, st) {
  if (!isTRUE(st$active)) stop(e)
  st$active <- FALSE
  .valve_close_input(st)
  .valve_io$send(.valve_with_id(.valve_failed(e, st$stage), st$id), con)
  FALSE
}
