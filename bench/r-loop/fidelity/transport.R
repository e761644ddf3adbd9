# For bench/r-loop/fidelity/run's transport checks: answers of any size
# with no R work beyond the first request (cached), uploads that only count
# bytes, and a later() callback that fails while the worker is idle.

cache <- new.env()

#* An answer of n bytes.
#* @serializer octet
#* @get /big
function(n = "1000") {
  if (is.null(cache[[n]])) cache[[n]] <- as.raw(rep_len(0:255, as.integer(n)))
  cache[[n]]
}

#* The size of the body and its first bytes, read from rook.input.
#* @serializer unboxedJSON
#* @post /upload
function(req) {
  list(len = length(req$bodyRaw), first = as.integer(req$bodyRaw[1:4]))
}

#* @get /echo
function(msg = "") {
  list(msg = msg)
}

#* @get /arm
function() {
  later::later(function() stop("a later() callback fails on purpose"), 0.1)
  list(armed = TRUE)
}

#* @get /alive
function() {
  list(alive = TRUE)
}
