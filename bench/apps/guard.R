# bench/attack's API: the example's /echo for well-behaved clients, and what
# attackers use: a large answer, a worker that prints huge lines, an endpoint
# that ends its own worker.

#* @get /echo
function(msg = "") list(msg = paste0("The message is: '", msg, "'"))

#* @post /upload
function(req) list(bytes = length(req$bodyRaw))

#* @serializer contentType list(type = "application/octet-stream")
#* @get /big
function(mb = 20) as.raw(rep(65L, as.numeric(mb) * 1048576))

#* @get /spew
function(mb = 50, times = 4) {
  line <- strrep("x", as.numeric(mb) * 1048576)
  for (i in seq_len(as.numeric(times))) cat(line, "\n", sep = "")
  "spewed"
}

#* @get /quit
function() quit(save = "no", status = 0)
