# For bench/r-loop/fidelity/run: a frame-loop worker that breaks the
# protocol's two transport rules on request, to show what they prevent.
# args: loop.R nodelay(on|off) answer(whole|split)
#   off:   no TCP_NODELAY on the worker's socket
#   split: every answer frame written in two writes
args <- commandArgs(TRUE)
source(args[1])
if (args[2] == "off") {
  .valve_connect <- function(host, port) {
    socketConnection(host = host, port = port, server = FALSE, blocking = TRUE, open = "r+b",
                     timeout = .valve_frame$SOCKET_TIMEOUT)
  }
}
if (args[3] == "split") {
  send <- .valve_io$send  # the loop's one way of writing to valve
  .valve_io$send <- function(x, con) {
    if (length(x) > 40L) {
      send(x[1:40], con)
      send(x[-(1:40)], con)
    } else {
      send(x, con)
    }
  }
}
app <- list(call = function(req) list(status = 200L, headers = list("Content-Type" = "text/plain"), body = strrep("x", 1000)))
valve_serve_frames(app, port = as.integer(Sys.getenv("VALVE_FRAME_PORT")), token = Sys.getenv("VALVE_FRAME_TOKEN"),
                   worker_id = Sys.getenv("VALVE_WORKER_ID"), warm_up = FALSE)
