# bench/preload's prototype: how long a fork takes from fork() to listening on
# its pipe socket, for four ways a preload parent could prepare its forks.
# valve is not involved: this only times the R side, to show where the time
# goes and what cuts it. Variants (one per Rscript run):
#   run_in_fork    the parent loads the API; each fork runs plumber's
#                  router$run() (which mounts the docs) and then starts its pipe
#                  server (what launcher.R did before commit ba6a2f1)
#   run_in_fork_forced  as run_in_fork, but the parent first forces the
#                  lazy-loaded objects of the namespaces a fork's server start
#                  runs (httpuv, later, promises, R6)
#   run_in_parent  the parent calls router$run() once, with httpuv::runServer
#                  replaced by the fork loop: each fork only starts its server
#                  (what launcher.R does since commit ba6a2f1)
#   run_in_parent_forced  both
# Usage: Rscript fork_proto.R API_FILE OUT_FILE VARIANT SINGLES BATCHES BATCH_SIZE
# Appends lines "VARIANT single|batch WALL_SECONDS CPU_SECONDS" to OUT_FILE: wall
# time from just before fork() to the pipe server listening, and the CPU time the
# fork used meanwhile (a forked process's CPU counters start at zero).
args <- commandArgs(TRUE)
app <- args[1]; out <- args[2]; variant <- args[3]
singles <- as.integer(args[4]); batches <- as.integer(args[5]); batch_size <- as.integer(args[6])

suppressPackageStartupMessages(library(plumber))
sink(nullfile()); router <- plumb(app); sink()
sockdir <- tempfile("socks"); dir.create(sockdir)
now <- function() as.numeric(Sys.time())
record <- function(kind, t0) {
  cpu <- sum(proc.time()[1:2])
  cat(sprintf("%s %s %.6f %.3f\n", variant, kind, now() - t0, cpu), file = out, append = TRUE)
}
counter <- 0
listen <- function(app) {
  counter <<- counter + 1
  httpuv::startPipeServer(file.path(sockdir, sprintf("%d-%d.sock", Sys.getpid(), counter)),
                          strtoi("077", 8L), app)
}
settle <- function(s) { Sys.sleep(s); invisible(parallel:::mccollect(wait = FALSE)) }

if (grepl("forced", variant)) {
  t0 <- now()
  for (p in intersect(c("httpuv", "later", "promises", "R6"), loadedNamespaces())) {
    ns <- asNamespace(p)
    for (n in ls(ns, all.names = TRUE)) try(invisible(get(n, envir = ns)), silent = TRUE)
  }
  cat(sprintf("%s parent_force %.6f NA\n", variant, now() - t0), file = out, append = TRUE)
}

# One fork; `child` is what the fork does after fork() returns (it must exit).
fork_one <- function(kind, child) {
  t0 <- now()
  pid <- parallel:::mcfork(estranged = TRUE)
  if (inherits(pid, "masterProcess")) {
    child(kind, t0)
    parallel:::mcexit(0L)
  }
}
measure <- function(child) {
  for (i in seq_len(singles)) { fork_one("single", child); settle(0.25) }
  for (b in seq_len(batches)) {
    for (i in seq_len(batch_size)) fork_one("batch", child)
    settle(1.0)
  }
}

if (startsWith(variant, "run_in_fork")) {
  measure(function(kind, t0) {
    utils::assignInNamespace("runServer", function(host, port, app, ...) {
      listen(app); record(kind, t0); parallel:::mcexit(0L)
    }, ns = "httpuv")
    router$run(host = "127.0.0.1", port = 3000, quiet = TRUE)
  })
} else {
  utils::assignInNamespace("runServer", function(host, port, app, ...) {
    measure(function(kind, t0) { listen(app); record(kind, t0) })
  }, ns = "httpuv")
  router$run(host = "127.0.0.1", port = 3000, quiet = TRUE)
}
