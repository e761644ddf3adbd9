#' Serves the app a _server.yml describes, as the convention asks of an
#' engine: `settings` is the file's path, `host` and `port` where to listen.
#' It blocks while it serves. Its own key: `greeting`.
launch_server <- function(settings, host = "127.0.0.1", port = 8080L, ...) {
  conf <- yaml::read_yaml(settings)
  greeting <- if (is.null(conf$greeting)) "Hello" else conf$greeting
  app <- list(call = function(req) {
    query <- httpuv::decodeURIComponent(sub("^\\?", "", req$QUERY_STRING))
    name <- sub("^.*name=([^&]*).*$", "\\1", query)
    if (identical(name, query)) name <- "world"
    list(status = 200L, headers = list("Content-Type" = "text/plain; charset=utf-8"),
         body = sprintf("%s, %s! (tinyengine, R process %d, path %s)\n", greeting, name, Sys.getpid(), req$PATH_INFO))
  })
  httpuv::runServer(host, port, app)
}
