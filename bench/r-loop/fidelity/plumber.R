# The API bench/r-loop/fidelity runs twice, under plain plumber (pr_run on a
# port) and under valve's frame loop (loop.R), to compare the answers byte for
# byte. Each endpoint exercises one thing the loop must get right.

library(promises)
# Async endpoints: future runs the work in a forked child; `later` polls it.
future::plan(future::multicore, workers = 2)

# plumber reads this in run(): bodies over 8 MB are answered 413 by onHeaders.
options(plumber.maxRequestSize = 8 * 1024^2)

#* @filter stamp
function(req, res) {
  res$setHeader("X-Filter", "seen")
  plumber::forward()
}

#* The example's fast call.
#* @get /echo
function(msg = "") {
  list(msg = paste0("The message is: '", msg, "'"))
}

#* Everything httpuv put in the request environment that an API could read.
#* @serializer unboxedJSON
#* @get /env
#* @post /env
function(req) {
  keys <- sort(ls(req, all.names = TRUE))
  keys <- setdiff(keys, c("pr", ".internal", "args", "argsQuery", "argsPath", "argsBody", "body",
                          "bodyRaw", "postBody", "cookies", "rook.input", "rook.errors", ".bodyData",
                          "REMOTE_PORT", "REMOTE_ADDR", "SERVER_PORT", "SERVER_NAME"))
  vals <- lapply(keys, function(k) {
    v <- get(k, envir = req)
    if (is.character(v)) if (length(v) == 1 && is.null(names(v))) v else as.list(v) else paste(class(v), collapse = "/")
  })
  names(vals) <- keys
  vals$input_class <- class(req$rook.input)
  vals$errors_class <- class(req$rook.errors)
  vals$env_parent_empty <- identical(parent.env(req), emptyenv())
  vals$httpuv_version <- as.character(req$httpuv.version)
  vals
}

#* Query arguments, repeated and percent-encoded.
#* @get /query
function(req, a = "", b = "") {
  list(a = a, b = b, qs = req$QUERY_STRING, path = req$PATH_INFO, args = names(req$argsQuery))
}

#* JSON body into arguments.
#* @post /json
function(req, x, y) {
  list(x = x, y = y, type = req$CONTENT_TYPE, len = req$CONTENT_LENGTH, raw_len = length(req$bodyRaw))
}

#* Form body into arguments.
#* @post /form
function(name = "", tags = "") {
  list(name = name, tags = tags)
}

#* The raw body: length, a checksum, and what rook.input does on reread.
#* @post /upload
#* @serializer unboxedJSON
function(req) {
  raw <- req$bodyRaw
  input <- req$rook.input
  input$rewind()
  first <- input$read(10L)
  rest <- input$read()
  input$rewind()
  lines <- input$read_lines()
  list(len = length(raw), md5 = digest::digest(raw, algo = "md5", serialize = FALSE),
       first = rawToChar(first[first != as.raw(0)]), rest_len = length(rest),
       n_lines = length(lines), content_length = req$CONTENT_LENGTH)
}

#* A binary answer with NUL bytes.
#* @serializer octet
#* @get /bin
function() {
  as.raw(c(0:255, 0, 0, 255))
}

#* A 1 MB binary answer.
#* @serializer octet
#* @get /big
function(n = "1048576") {
  n <- as.integer(n)
  as.raw(rep_len(0:255, n))
}

#* Several cookies and a redirect-ish custom status.
#* @get /cookies
function(res) {
  res$setCookie("a", "1")
  res$setCookie("b", "two words", path = "/", http = TRUE)
  res$setCookie("c", "3", same_site = "Strict")
  res$setHeader("X-Multi", "first")
  res$status <- 201L
  list(ok = TRUE)
}

#* Reads the cookies the request sent.
#* @get /read-cookies
function(req) {
  req$cookies
}

#* An R error: plumber answers 500.
#* @get /error
function() {
  stop("this endpoint fails on purpose")
}

#* Non-ASCII text, latin1 re-encoded.
#* @serializer text
#* @get /utf8
function() {
  "h\u00e9llo w\u00f6rld \u2713"
}

#* No body at all (204).
#* @get /nobody
function(res) {
  res$status <- 204L
  res$body <- NULL
  res
}

#* HTML with a custom content type.
#* @serializer html
#* @get /html
function() {
  "<p>hi</p>"
}

#* A png image through plumber's image serializer.
#* @serializer png list(width = 40, height = 30)
#* @get /plot
function() {
  par(mar = c(0, 0, 0, 0))
  plot(1:3)
}

#* async: a promise resolved by a `later` timer.
#* @get /async-later
function() {
  promise(function(resolve, reject) later::later(function() resolve(list(slept = 0.05)), 0.05))
}

#* async: a future in a forked child, then a promise chain.
#* @get /async-future
function() {
  future_promise({
    Sys.sleep(0.1)
    21
  }) %...>% (function(x) list(answer = x * 2))
}

#* async: a promise that rejects (plumber answers 500).
#* @get /async-error
function() {
  promise(function(resolve, reject) later::later(function() reject(simpleError("async failure")), 0.01))
}

#* A body given as a file (httpuv's c(file = ...) form), owned: deleted after sending.
#* @get /file
function(res) {
  path <- tempfile(fileext = ".txt")
  writeLines(c("line one", "line two"), path)
  res$setHeader("Content-Type", "text/plain")
  res$body <- list(file = path, owned = TRUE)
  res
}

#* `later` between requests: arms a timer that fires while the worker is idle.
#* @get /later-arm
function() {
  fired <<- FALSE
  later::later(function() fired <<- TRUE, 0.2)
  list(armed = TRUE)
}

#* Did the timer fire while no request was running?
#* @get /later-check
function() {
  list(fired = exists("fired") && isTRUE(fired))
}
