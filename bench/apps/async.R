# bench/async's API: endpoints that answer with a promise, and one fast
# synchronous call. One plain plumber process overlaps promise calls (its
# httpuv loop takes the next request while `later` waits); bench/async
# measures whether valve's workers do too.

# future_promise() runs its expression in forked R processes (4 at most; more
# calls wait in promises' own queue without blocking the main R process).
future::plan(future::multicore, workers = 4)

#* A promise resolved by a `later` timer after `secs` seconds (no CPU, no fork)
#* @param secs seconds before the promise resolves
#* @get /later
function(secs = 1) {
  secs <- as.numeric(secs)
  promises::promise(function(resolve, reject) {
    later::later(function() resolve(list(ok = TRUE)), secs)
  })
}

#* A promise resolved by a forked future that sleeps `secs` seconds
#* @param secs seconds the future sleeps
#* @get /future
function(secs = 1) {
  secs <- as.numeric(secs)
  promises::future_promise({
    Sys.sleep(secs)
    list(ok = TRUE)
  })
}

#* The fast call, answered at once (synchronous)
#* @param msg echoed back
#* @get /echo
function(msg = "") {
  list(msg = msg)
}
