# bench/core's API: plumber's /echo next to a 200 MB object loaded at start-up,
# as a real app holds a model or a data set. With --preload the forks share it.
big <- runif(25e6)

#* @get /echo
function(msg = "") list(msg = paste0("The message is: '", msg, "'"))

#* @get /pid
function() list(pid = Sys.getpid())
