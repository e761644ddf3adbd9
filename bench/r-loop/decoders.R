# The request-head encodings bench/r-loop/measure compares with the protocol's
# "rdsenv" (src/worker/loop.R): "text", "lp" and "rds". Source after loop.R;
# adds them to .valve_decoders. valve itself never uses them.

# Builds the environment: `fixed` the 8 fixed fields, `keys` the HTTP_* names,
# `hn` the lower-case header names, `hv` their values (repeats already joined
# and sorted by valve, exactly as httpuv's header map has them).
.valve_env <- function(fixed, keys, hn, hv) {
  vals <- c(fixed, "", "1.1-0", hv)
  names(vals) <- c(.valve_fixed_keys, keys)
  req <- list2env(as.vector(vals, "list"), envir = new.env(parent = emptyenv()))
  names(hv) <- hn
  req$HEADERS <- hv
  req
}

# "text": every field followed by "\n": the number of headers
# n, the 8 fixed fields, then n HTTP_* keys, n lower-case names, n values.
# One rawToChar(), one strsplit(), contiguous slices (.valve_env() inlined:
# this runs on every request).
.valve_decode_text <- function(head) {
  f <- strsplit(rawToChar(head), "\n", fixed = TRUE)[[1L]]
  n <- as.integer(f[1L])
  if (is.na(n) || length(f) != 9L + 3L * n) stop("malformed request head")
  if (n == 0L) return(.valve_env(f[2:9], character(0), character(0), character(0)))
  i <- 10L:(9L + n)
  hv <- f[i + 2L * n]
  vals <- c(f[2:9], "", "1.1-0", hv)
  names(vals) <- c(.valve_fixed_keys, f[i])
  req <- list2env(as.vector(vals, "list"), envir = new.env(parent = emptyenv()))
  names(hv) <- f[i + n]
  req$HEADERS <- hv
  req
}

# "lp": the same fields, length-prefixed: u32 count, count x u32 lengths, bytes.
.valve_decode_lp <- function(head) {
  n <- readBin(head, "integer", 1L, endian = "big")
  lens <- readBin(head[5:(4L + 4L * n)], "integer", n, endian = "big")
  ends <- 4L + 4L * n + cumsum(lens)
  starts <- ends - lens + 1L
  f <- vapply(seq_len(n), function(i) if (lens[i]) rawToChar(head[starts[i]:ends[i]]) else "", "")
  h <- as.integer(f[1L])
  if (h == 0L) return(.valve_env(f[2:9], character(0), character(0), character(0)))
  i <- 10L:(9L + h)
  .valve_env(f[2:9], f[i], f[i + h], f[i + 2L * h])
}

# "rds": R serialization (XDR, version 2) of a named list of every string
# variable plus HEADERS.
.valve_decode_rds <- function(head) list2env(unserialize(head), envir = new.env(parent = emptyenv()))

.valve_decoders <- c(.valve_decoders, list(text = .valve_decode_text, lp = .valve_decode_lp, rds = .valve_decode_rds))
