# The example API the README runs: one slow call, one fast call, one POST.

#* Sleep for a while, then say how long (the slow call that blocks plain plumber)
#* @param zzz seconds to sleep
#* @get /sleep
function(zzz = 1) {
  zzz <- as.numeric(zzz)
  Sys.sleep(zzz)
  list(slept = zzz, pid = Sys.getpid())
}

#* Echo back the input (the fast call)
#* @param msg The message to echo
#* @get /echo
function(msg = "") {
  list(msg = paste0("The message is: '", msg, "'"))
}

#* Add two numbers sent as JSON: {"a": 1, "b": 2}
#* @post /sum
function(a, b) {
  as.numeric(a) + as.numeric(b)
}
