# The reference tool's headline example, from R: five concurrent requests that
# each sleep 2 seconds, through valve and against one plain plumber process.
# Plain plumber answers them one after the other (about 10 s); valve hands
# them to five R workers at once (about 2 s).
#
# Run it with
#   Rscript r/inst/examples/five-sleeps.R
# or, with the package installed,
#   source(system.file("examples", "five-sleeps.R", package = "valve"))
# It needs plumber, curl and callr. The five requests go out together through
# curl's multi interface (the reference tool used five future sessions; the
# server sees the same five concurrent connections).

library(valve)

api <- system.file("examples", "plumber.R", package = "valve")

five_sleeps <- function(url) {
  pool <- curl::new_pool(total_con = 5, host_con = 5)
  status <- integer()
  for (i in 1:5) {
    curl::curl_fetch_multi(
      paste0(url, "/sleep?zzz=2"),
      done = function(res) status <<- c(status, res$status_code),
      fail = stop,
      pool = pool,
      handle = curl::new_handle(timeout = 60)
    )
  }
  elapsed <- system.time(curl::multi_run(pool = pool))[["elapsed"]]
  stopifnot(length(status) == 5, all(status == 200L))
  round(elapsed, 2)
}

results <- list()
record <- function(setup, seconds) {
  results[[length(results) + 1]] <<- data.frame(setup = setup, seconds = seconds)
  cat(sprintf("%-52s %5.2f s\n", setup, seconds))
}

# valve with a warm pool: five workers from the start.
warm <- valve_start(api, n_min = 5, n_max = 5)
for (i in 1:3) record("valve, n_min = 5, n_max = 5", five_sleeps(warm$url))
valve_stop(warm)

# valve starting with one worker: the first burst waits while the pool grows
# (each new worker loads R and the API); later bursts find it grown.
cold <- valve_start(api, n_min = 1, n_max = 5)
record("valve, n_min = 1, n_max = 5, first burst", five_sleeps(cold$url))
record("valve, n_min = 1, n_max = 5, second burst", five_sleeps(cold$url))
valve_stop(cold)

# One plain plumber process, as plumber::pr_run() serves it.
port <- httpuv::randomPort()
plain <- callr::r_bg(
  function(api, port) plumber::pr_run(plumber::pr(api), port = port, docs = FALSE),
  args = list(api = api, port = port)
)
url <- paste0("http://127.0.0.1:", port)
deadline <- Sys.time() + 60
repeat {
  up <- tryCatch(curl::curl_fetch_memory(paste0(url, "/echo"))$status_code == 200L, error = function(e) FALSE)
  if (up) break
  if (!plain$is_alive() || Sys.time() > deadline) stop("plain plumber did not start: ", plain$read_all_error())
  Sys.sleep(0.1)
}
for (i in 1:3) record("one plumber process", five_sleeps(url))
invisible(plain$kill())

results <- do.call(rbind, results)
print(results, row.names = FALSE)
